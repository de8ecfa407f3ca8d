"""The contexts a forward runs in: mixed precision, critics frozen while they judge the actor's
action, and a module briefly in evaluation mode."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from aa_ray.algos.precision import autocast_dtype


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """`algo.precision` around a forward: `auto` resolved for `device` (aa_ray/algos/precision.py)."""
    dtype = autocast_dtype(precision, device)
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


@contextlib.contextmanager
def frozen(module: nn.Module) -> Iterator[nn.Module]:
    """The module scores an input without collecting weight gradients (saves a third of the
    actor's backward when the critics only judge its action)."""
    module.requires_grad_(False)
    try:
        yield module
    finally:
        module.requires_grad_(True)


@contextlib.contextmanager
def evaluating(module: nn.Module) -> Iterator[nn.Module]:
    """The module in evaluation mode (batch normalization by its running statistics, no dropout) for
    the duration, then back in the mode it was in."""
    was_training = module.training
    module.train(False)
    try:
        yield module
    finally:
        module.train(was_training)
