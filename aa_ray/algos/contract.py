"""What the runtime may ask of an algorithm, and nothing more.

The learner (`aa_ray.runtime.learner`) holds one object that satisfies `Algorithm` and calls only
the methods below. A new algorithm is one file that defines a pydantic config (with a `name`
literal), a `make_policy(config, obs, act_dim)` for the env runners and a class with these
methods; `aa_ray.algos.ALGORITHMS` registers it. Nothing in the runtime reads an algorithm's
attributes. Its config's family mixin (`OffPolicyKnobs`, `OnPolicyKnobs`) says how the runtime
feeds it (`aa_ray.runtime.families`).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

import numpy as np
import torch
from torch import Tensor

from aa_ray.records import ObsMoments, ReturnMoments


class RunShape(NamedTuple):
    """What an algorithm's knobs are checked against (`check_run`): the run around them."""

    env_steps: int  # budget.env_steps
    num_learners: int
    fleet_envs: int  # runners x envs per runner: transitions per fleet step
    mode: str  # runtime.mode: sync or async


class Health(NamedTuple):
    """Counts the runtime acts on, as tensors on the learner's device (read on the host once per
    learner iteration, with the diagnostics)."""

    skipped_updates: Tensor  # gradient steps skipped so far for a non-finite loss or gradient
    consecutive_skips: Tensor  # the longest current run of such steps (the run stops past a limit)
    largest_value: Tensor  # the largest |value| the critic predicted in the last update (explosion check)


class TrainingSetup(NamedTuple):
    """What the learner gives an algorithm besides its config and the env's dims."""

    device: torch.device
    planned_steps: int  # the fleet steps the run will learn from (learning-rate schedules)
    # on `device`, checkpointed by the learner: every random draw of the updates (sampled actions,
    # dropout masks, minibatch order). Initial weights come from torch's generator, which the learner
    # seeds for the construction only.
    generator: torch.Generator

    @classmethod
    def on_cpu(cls, seed: int = 0, planned_steps: int = 1_000) -> TrainingSetup:
        """A setup for building an algorithm outside a learner (tests, checks, resume validation)."""
        return cls(torch.device("cpu"), planned_steps, torch.Generator().manual_seed(seed))


class Algorithm(Protocol):
    """Built as `cls(config, obs, act_dim, setup)` (`obs`: an `ObsDims`, `setup`: a `TrainingSetup`)."""

    def update(self, batch: Any) -> dict[str, Tensor]:
        """Learn from one unit of data and return its diagnostics as tensors (read by the caller
        only when it logs them). Off-policy family: a `Batch` stacking one fleet step's `utd_ratio`
        batches. On-policy family: a `Rollout` of (train_every, envs) (`aa_ray.records`)."""
        ...

    def compile(self, device: torch.device) -> None:
        """torch.compile the networks `update` runs (called once, before the first update, when
        `learners.compile` asks for it); the update must then match the eager one to float tolerance."""
        ...

    def merge_stats(self, obs: ObsMoments, returns: ReturnMoments) -> None:
        """Fold the env runners' moments into the observation and reward normalizers."""
        ...

    def health(self) -> Health: ...

    def policy_state(self, device: torch.device | str = "cpu") -> dict[str, Tensor]:
        """The acting policy's weights, what `make_policy` builds loads them: copies on `device` (the
        CPU, to ship to runners; the learner's own device for `runtime.mode: device`, which acts there)."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class ActingPolicy(Protocol):
    """What `make_policy` builds: the module env runners act with (every family)."""

    def act(self, obs: np.ndarray, deterministic: bool, generator: torch.Generator | None = None) -> np.ndarray:
        """Actions in [-1, 1] for a batch of raw observations."""
        ...


class OnPolicyActor(ActingPolicy, Protocol):
    """What an on-policy family's acting policy also gives the runner, to record a rollout."""

    action_limit: float  # the runner clips sampled actions to +-this before the env takes them (inf: never)

    def explore(self, obs: np.ndarray, generator: torch.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Sampled (unclipped) actions and their log-probabilities."""
        ...

    def value(self, obs: np.ndarray) -> np.ndarray:
        """V(obs) of the acting critic."""
        ...


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
