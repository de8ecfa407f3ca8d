"""Transition datasets (Parquet, RLlib's offline column names) and the rollouts that write them.

`aa_ray.data.rollout` (the `aa-ray rollout` driver) imports Ray; this package itself does not.
"""

from aa_ray.data.dataset import (
    COLUMNS,
    FORMAT_VERSION,
    BoxInfo,
    DatasetError,
    DatasetMeta,
    DatasetWriter,
    TransitionDataset,
    read_dataset,
    write_dataset,
)

__all__ = [
    "COLUMNS",
    "FORMAT_VERSION",
    "BoxInfo",
    "DatasetError",
    "DatasetMeta",
    "DatasetWriter",
    "TransitionDataset",
    "read_dataset",
    "write_dataset",
]
