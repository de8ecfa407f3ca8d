"""Transition datasets: Parquet with RLlib's offline column names, or Minari; read, written and checked.

The file formats only: they sit below the runtime (its replay buffer and trainer read prior data) and
import none of it. The job that records datasets is `aa_ray.rollout`, above the runtime.
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
