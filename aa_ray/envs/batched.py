"""Batched envs: one object that steps N copies of a task in one call.

Isaac Lab, mjlab, MuJoCo Playground, EnvPool and gymnasium's own `vector_entry_point` envs all hand
a trainer such an object; each has its own conventions (numpy or torch, which device, how it
resets a finished copy, where the final observation of an episode goes, observation groups).
`BatchedEnv` is the one shape the runtime sees; `make_batched_env` builds it from the spec and
adapts whatever the user's code returned.

The contract, whatever the source:
- torch tensors on `device`, float32 observations (N, obs.full) laid out as `ObsDims` says (a Dict
  of groups is flattened the way `obs_groups` flattens one: the actor's keys first);
- actions in the env's own bounds (`action_low`, `action_high`), (N, act_dim) on `device`;
- same-step autoreset: a copy whose episode ended is reset inside `step`; `BatchedStep.obs` is what
  to act on next, `BatchedStep.next_obs` the true next observation of this step (the final one
  where an episode ended), and `valid` marks the rows that are real transitions (a source that
  cannot say what a truncated episode's final observation was drops those rows rather than
  storing a wrong one);
- `state()` is the env's whole state where it can give one (MuJoCo-based copies can), else None:
  a resume then restarts episodes, and the checkpoint says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

from aa_ray.nets.policy import ObsDims


@dataclass(frozen=True)
class BatchedStep:
    """One call's result for all N copies."""

    obs: Tensor  # (N, features): what the policy acts on next (a fresh reset where an episode ended)
    next_obs: Tensor  # (N, features): this step's true next observation (the final one where done)
    reward: Tensor  # (N,) float32
    terminated: Tensor  # (N,) bool
    truncated: Tensor  # (N,) bool
    valid: Tensor  # (N,) bool: rows that are real transitions
    # the tracked info keys' values at each finished episode's last step: key -> ((N,) values, (N,) bool mask)
    episode_info: dict[str, tuple[Tensor, Tensor]] = field(default_factory=dict)


@runtime_checkable
class BatchedEnv(Protocol):
    """What the runtime asks of a batched env (see the module's docstring)."""

    num_envs: int
    device: torch.device
    obs_dims: ObsDims
    act_dim: int
    action_low: Tensor  # (act_dim,) on device
    action_high: Tensor
    metadata: dict[str, Any]  # the env's declared metadata (`info_metrics`, `mirror`, ...), {} if none

    def reset(self, seed: int) -> Tensor:
        """Reset every copy (copy i from a stream derived from `seed`); returns obs (N, features)."""
        ...

    def step(self, action: Tensor) -> BatchedStep: ...

    def state(self) -> dict[str, Any] | None:
        """Everything the next `step` depends on, as plain data (tensors, arrays), or None where the
        source cannot give it."""
        ...

    def load_state(self, state: dict[str, Any]) -> None: ...

    def close(self) -> None: ...
