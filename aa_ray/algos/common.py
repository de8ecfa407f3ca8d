"""The records algorithms learn from, shared by the learner and the algorithm files."""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from aa_ray.nets.policy import ObsDims

__all__ = ["Batch", "ObsDims", "tensors_to_cpu"]


class Batch(NamedTuple):
    """Replay samples as tensors. Leading dims are (updates, batch) for a stacked batch."""

    obs: Tensor
    action: Tensor
    reward: Tensor
    next_obs: Tensor
    terminated: Tensor
    discount: Tensor  # gamma^k for a k-step transition

    @classmethod
    def from_numpy(cls, arrays: Mapping[str, np.ndarray], device: torch.device) -> Batch:
        # copies: arrays from Ray's object store are read-only views
        return cls(*(torch.tensor(arrays[f], device=device, dtype=torch.float32) for f in cls._fields))

    def __len__(self) -> int:  # number of stacked batches (tuple length is meaningless here)
        return self.obs.shape[0]

    def at(self, index: int) -> Batch:
        return Batch(*(t[index] for t in self))


def tensors_to_cpu(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    return {k: v.detach().to("cpu", copy=True) for k, v in state.items()}
