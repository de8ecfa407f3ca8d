"""When things happen over a run: the learning rates' linear decay over the planned fleet steps, and
TD3's delayed actor steps (counted over the run)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor

from aa_ray.algos.gradient_step import GradientStep
from aa_ray.records import Batch


def scheduled_lr(start: float, end_fraction: float, steps_done: int, planned_steps: int) -> float:
    """Linear from `start` to `start * end_fraction` over `planned_steps`, then constant."""
    progress = min(steps_done / max(planned_steps, 1), 1.0)
    return start * (1.0 + progress * (end_fraction - 1.0))


class LinearLRSchedule:
    """Moves optimizer groups' lrs along `scheduled_lr`, one fleet step at a time. The start rates
    are the ones the groups were built with (a loaded optimizer state does not move them); groups
    are looked up on every change because loading an optimizer's state replaces its group dicts."""

    def __init__(self, groups: Iterable[tuple[Any, int]], end_fraction: float, planned_steps: int):
        # read once, when the run starts
        self.starts = [(optimizer, index, float(optimizer.param_groups[index]["lr"])) for optimizer, index in groups]
        self.end_fraction, self.planned_steps = end_fraction, planned_steps
        self.steps_done = 0

    def advance(self, fleet_steps: int = 1) -> None:
        self.load_state_dict(self.steps_done + fleet_steps)

    def state_dict(self) -> int:  # checkpointed as `steps_done`
        return self.steps_done

    def load_state_dict(self, steps_done: int) -> None:
        self.steps_done = int(steps_done)
        for optimizer, index, start in self.starts:
            lr = scheduled_lr(start, self.end_fraction, self.steps_done, self.planned_steps)
            group = optimizer.param_groups[index]
            if isinstance(group["lr"], Tensor):
                group["lr"].fill_(lr)  # in place: a compiled step keeps reading the same tensor
            else:  # Muon's groups
                group["lr"] = lr

    def current_lr(self) -> Tensor:
        """The first group's lr now, as a diagnostic tensor (no device read)."""
        optimizer, index, _ = self.starts[0]
        return torch.as_tensor(optimizer.param_groups[index]["lr"]).detach().clone()


def every_group(*steps: GradientStep | None) -> list[tuple[Any, int]]:
    """(optimizer, group index) of every group of the given steps, for a schedule."""
    return [(step.optimizer, i) for step in steps if step is not None for i in range(len(step.optimizer.param_groups))]


def delayed_actor_steps(
    batch: Batch, steps_done: int, delay: int, critic_step: Callable[[Batch], dict[str, Tensor]],
    actor_step: Callable[[Batch], dict[str, Tensor]],
) -> tuple[dict[str, Tensor], int]:
    """TD3's schedule (CrossQ takes it too): a critic step on every batch of the stack, and after
    every `delay`-th critic step of the run (`steps_done` before this stack) an actor step on the
    same batch. Returns the diagnostics and the critic steps done."""
    info: dict[str, Tensor] = {}
    for i in range(batch.num_batches):
        b = batch.at(i)
        info |= critic_step(b)
        steps_done += 1
        if steps_done % delay == 0:
            info |= actor_step(b)
    return info, steps_done
