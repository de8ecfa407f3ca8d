"""Small pieces of math and plumbing shared by the algorithm files."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor, nn


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


@torch.no_grad()
def polyak_update_(online: nn.Module, target: nn.Module, tau: float) -> None:
    """target <- (1 - tau) * target + tau * online, for every parameter, in one fused call."""
    torch._foreach_lerp_(list(target.parameters()), list(online.parameters()), tau)


def grad_norm(parameters: Iterable[Tensor]) -> float:
    """Global L2 norm of the gradients (for diagnostics; does not clip)."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return 0.0
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))


def tensors_to_cpu(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    return {k: v.detach().to("cpu", copy=True) for k, v in state.items()}
