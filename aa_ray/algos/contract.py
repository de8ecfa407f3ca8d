"""What the runtime may ask of an algorithm, and nothing more.

The learner (`aa_ray.runtime.learner`) holds one object that satisfies `Algorithm` and calls only
the methods below. A new algorithm is one file that defines a pydantic config (with a `name`
literal), a `make_policy(config, obs, act_dim)` for the env runners and a class with these
methods; `aa_ray.algos.ALGORITHMS` registers it. Nothing in the runtime reads an algorithm's
attributes.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

import torch
from torch import Tensor

# (count, mean, var) of raw observations, as the env runners measure them; (0, None, None) if none
ObsMoments = tuple[int, Any, Any]
# (count, mean, var, max |G|) of the raw discounted returns G the env runners track
ReturnMoments = tuple[int, float, float, float]


class Health(NamedTuple):
    """Counts the runtime acts on, as tensors on the learner's device (read on the host once per
    learner iteration, with the diagnostics)."""

    skipped_updates: Tensor  # gradient steps skipped so far for a non-finite loss or gradient
    consecutive_skips: Tensor  # the longest current run of such steps (the run stops past a limit)
    largest_value: Tensor  # the largest |value| the critic predicted in the last update (explosion check)


class Algorithm(Protocol):
    """Built as `cls(config, obs, act_dim, device, planned_steps)` (`obs`: an `ObsDims`); `planned_steps` is the
    number of fleet steps the run will learn from (for learning-rate schedules)."""

    def update(self, batch: Any) -> dict[str, Tensor]:
        """Learn from one unit of data and return its diagnostics as tensors (read by the caller
        only when it logs them). Off-policy: a `Batch` stacking one fleet step's `utd_ratio`
        batches. On-policy: a `Rollout` of (train_every, envs)."""
        ...

    def compile(self, device: torch.device) -> None:
        """torch.compile the networks `update` runs (called once, before the first update, when
        `learners.compile` asks for it); the update must then match the eager one to float tolerance."""
        ...

    def merge_stats(self, obs: ObsMoments, returns: ReturnMoments) -> None:
        """Fold the env runners' moments into the observation and reward normalizers."""
        ...

    def health(self) -> Health: ...

    def policy_state(self) -> dict[str, Tensor]:
        """The acting policy's weights (CPU tensors), what `make_policy` builds loads them."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def diagnostics_to_floats(diagnostics: dict[str, Tensor | float]) -> dict[str, float]:
    """The one place an update's diagnostics are read on the host: stacked on their device, then
    copied in one transfer (one device sync on a GPU, however many diagnostics there are)."""
    if not diagnostics:
        return {}
    names = list(diagnostics)
    tensors = [value for value in diagnostics.values() if isinstance(value, torch.Tensor)]
    device = tensors[0].device if tensors else torch.device("cpu")
    column = torch.stack([
        torch.as_tensor(diagnostics[name], dtype=torch.float64, device=device).detach().reshape(()) for name in names
    ])
    return dict(zip(names, column.tolist(), strict=True))
