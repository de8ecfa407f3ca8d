"""The contract's methods that are bookkeeping, not learning: merging the runners' statistics into
the normalizers, health, the acting policy's weights, and checkpoints. They follow from what an
algorithm class declares, so each variant file holds only its networks and its update.

`Bookkeeping` has no math and is not an algorithm: algorithm classes use it and subclass nothing
else (none subclasses another algorithm).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from aa_ray.algos.contract import Health
from aa_ray.algos.gradient_step import GradientStep
from aa_ray.algos.normalizers import RewardNormalizer
from aa_ray.algos.optimizers import tensor_lrs_
from aa_ray.algos.schedules import LinearLRSchedule
from aa_ray.records import ObsMoments, ReturnMoments


def compile_networks_(modules: Iterable[nn.Module], device: torch.device) -> None:
    """torch.compile each module's forward in place (checkpoint keys unchanged); AOTAutograd
    compiles the matching backward. On CUDA the compiled graphs are also captured as CUDA graphs
    ("reduce-overhead"), which removes the kernel-launch cost that dominates small networks."""
    mode = "reduce-overhead" if device.type == "cuda" else "default"
    for module in modules:
        module.compile(mode=mode, dynamic=False)


def save_parts(parts: Mapping[str, Any]) -> dict[str, Any]:
    """Each part's state under its checkpoint key: a module's, a GradientStep's or a schedule's
    `state_dict()`, or a plain tensor (SAC's log-temperature) itself."""
    return {name: part.detach() if isinstance(part, Tensor) else part.state_dict() for name, part in parts.items()}


def load_parts(parts: Mapping[str, Any], state: Mapping[str, Any]) -> None:
    for name, part in parts.items():
        if isinstance(part, LinearLRSchedule) and name not in state:
            continue  # checkpoints from before every variant had a schedule: the start of it
        if isinstance(part, Tensor):
            with torch.no_grad():
                part.copy_(state[name])
        else:
            part.load_state_dict(state[name])
            if isinstance(part, torch.optim.Optimizer):  # PPO's: older checkpoints hold float lrs
                tensor_lrs_(part)


class Bookkeeping:
    """compile, merge_stats, health, policy_state, state_dict and load_state_dict from `parts()` (checkpoint
    key -> module, GradientStep, schedule or tensor) and the attributes `policy` (with its
    `obs_norm`), `reward_norm` and `largest_value` (|Q| or |V| of the last update, a tensor)."""

    policy: nn.Module
    reward_norm: RewardNormalizer
    largest_value: Tensor

    def parts(self) -> dict[str, Any]:
        raise NotImplementedError

    def compile(self, device: torch.device) -> None:
        """Compile every network the update runs (normalizers are too small to gain anything)."""
        parts = self.parts().values()
        compile_networks_([p for p in parts if isinstance(p, nn.Module) and not isinstance(p, RewardNormalizer)],
                          device)

    def merge_stats(self, obs: ObsMoments, returns: ReturnMoments) -> None:
        self.policy.obs_norm.merge(*obs)
        self.reward_norm.merge(*returns)

    def health(self) -> Health:
        steps = [part for part in self.parts().values() if isinstance(part, GradientStep)]
        return Health(
            skipped_updates=torch.stack([step.skipped for step in steps]).sum(),
            consecutive_skips=torch.stack([step.consecutive_skips for step in steps]).max(),
            largest_value=self.largest_value,
        )

    def policy_state(self, device: torch.device | str = "cpu") -> dict[str, Tensor]:
        return {k: v.detach().to(device, copy=True) for k, v in self.policy.state_dict().items()}

    def state_dict(self) -> dict[str, Any]:
        return save_parts(self.parts())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        load_parts(self.parts(), state)
