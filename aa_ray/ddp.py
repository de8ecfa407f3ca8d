"""What changes in an algorithm when L learner actors train one model with torch DDP.

Each learner holds the full model and trains on its own shard of the global batch. The algorithm
files call these helpers, all no-ops with a single learner (so one learner computes exactly what
it computed before DDP existed):

- `wrap(module)`: DDP around an *online* module, used only for the forward pass whose loss is
  back-propagated (DDP averages those gradients across learners). Targets, normalizers and
  checkpoints use the plain module, so state dicts carry no `module.` prefix and a checkpoint
  from L=2 loads under L=1 and the reverse.
- `average_grads_(params)`: the same for a bare tensor such as SAC's log-temperature.
- `global_mean`, `global_mean_std`: statistics over every learner's rows (PPO).
- `batch_moments(x)`: a batch's mean and variance over every learner's rows, differentiable
  (batch normalization: L learners normalize by the global batch's statistics, as one would).
- `randn_shard(shape, generator)`: training noise. Every learner draws the *global* batch's noise
  from its own generator, seeded alike on every rank, and keeps its rows, so L learners see the
  noise one learner would see and their generators stay in lockstep.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.nn.functional import all_reduce as differentiable_all_reduce
from torch.nn.parallel import DistributedDataParallel

# torch >= 2.13 calls the switch forward_sync_buffers. Either way buffers are not re-broadcast on
# every forward: the learner copies rank 0's whole state (buffers included) after building.
_NO_BUFFER_SYNC = (
    {"forward_sync_buffers": False}
    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters
    else {"broadcast_buffers": False}
)


def rank_and_size() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def wrap(module: nn.Module) -> nn.Module:
    """DDP over `module` when several learners train, else `module` itself. Buffers (running
    normalizers) are not broadcast on every forward: the learner synchronizes them explicitly."""
    if rank_and_size()[1] == 1:
        return module
    device_ids = [module_device(module).index] if module_device(module).type == "cuda" else None
    return DistributedDataParallel(module, device_ids=device_ids, **_NO_BUFFER_SYNC)


def module_device(module: nn.Module) -> torch.device:
    return next(module.parameters()).device


def average_grads_(params: Iterable[Tensor]) -> None:
    """Mean of the gradients over learners, for parameters that are not inside a DDP module."""
    _, size = rank_and_size()
    if size == 1:
        return
    for p in params:
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
            p.grad /= size


def randn_shard(shape: torch.Size | tuple[int, ...], generator: torch.Generator, dtype: torch.dtype) -> Tensor:
    """Standard normal noise for this learner's rows of the global batch (first dim = batch), drawn
    from `generator` on its device."""
    rank, size = rank_and_size()
    if size == 1:
        return torch.randn(shape, generator=generator, device=generator.device, dtype=dtype)
    rows = shape[0]
    full = torch.randn((rows * size, *shape[1:]), generator=generator, device=generator.device, dtype=dtype)
    return full[rank * rows : (rank + 1) * rows]


def global_mean(value: Tensor) -> Tensor:
    """The mean of a scalar over learners (e.g. PPO's KL, so every learner adapts its lr alike)."""
    _, size = rank_and_size()
    if size == 1:
        return value
    total = value.detach().clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total / size


def batch_moments(x: Tensor, dim: int = -2) -> tuple[Tensor, Tensor]:
    """Mean and (biased) variance of `x` over its batch dim `dim` (kept, size 1), taken over every
    learner's rows; gradients flow through the all-reduce to every learner's rows."""
    _, size = rank_and_size()
    sums = torch.stack([x.sum(dim, keepdim=True), x.square().sum(dim, keepdim=True)])
    if size > 1:
        sums = differentiable_all_reduce(sums, op=dist.ReduceOp.SUM)
    count = x.shape[dim] * size
    mean = sums[0] / count
    return mean, (sums[1] / count - mean.square()).clamp_min(0.0)


def global_mean_std(values: Tensor) -> tuple[Tensor, Tensor]:
    """Mean and standard deviation of `values` over every learner's rows (the global batch)."""
    _, size = rank_and_size()
    if size == 1:
        return values.mean(), values.std()
    moments = torch.stack([values.new_tensor(values.numel()), values.sum(), values.pow(2).sum()])
    dist.all_reduce(moments, op=dist.ReduceOp.SUM)
    count, total, squares = moments
    mean = total / count
    return mean, ((squares - count * mean.pow(2)) / (count - 1)).clamp_min(0).sqrt()
