"""Transition datasets (Parquet with RLlib's offline column names, or Minari) and the rollouts that write them.

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
    write_dataset,
)
from aa_ray.data.sources import read_dataset

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
