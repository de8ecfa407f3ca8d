"""The runner contract: what the driver asks of an env runner, and the runner kinds by name.

A runner kind is one plain class (one file) that the graph starts R times, as Ray actors or
in-process (`graph.actor_backend`); `runners.kind` in the spec picks it (`ExperimentSpec.runner_kind`:
auto is `batched` when `env.batched` is set, else `vector`). Where a runner runs (its node) every
actor shell reports itself (`cluster.RayActors`), so a kind need not.

| kind | file | the envs it steps |
|---|---|---|
| `vector` | `env_runner.py` | E gymnasium copies in one sync vector env, numpy, next-step autoreset |
| `batched` | `batched_runner.py` | one `env.batched` env of E copies stepped in one call, tensors on its device |

Recording datasets is not a runner's job: `aa-ray rollout` starts `aa_ray.rollout.recorder.DatasetRecorder`s.
"""

from __future__ import annotations

from typing import Any, Protocol

from aa_ray.nets.policy import PolicyState
from aa_ray.records import ChunkStats, ObsDims, RolloutChunk, Transitions
from aa_ray.runtime.batched_runner import BatchedRunner
from aa_ray.runtime.env_runner import EnvRunner
from aa_ray.spec.experiment import ExperimentSpec


class Runner(Protocol):
    """Made as `kind(spec, index, incarnation)`: runner `index` of the fleet, its `incarnation`-th
    start (a restarted runner draws fresh seeds, `aa_ray.seeding`)."""

    def env_dims(self) -> tuple[ObsDims, int]:
        """The observation features and act_dim of the env it made (the driver checks them against its own)."""
        ...

    def set_weights(self, state: PolicyState, version: int) -> None:
        """Act with these policy weights from now on (a version it has is not loaded again)."""
        ...

    def sample(self, num_steps: int, random_actions: bool, weights: PolicyState | None = None,
               version: int = 0) -> tuple[Transitions, ChunkStats]:
        """Off-policy: step every env copy `num_steps` times, first loading `weights` of `version` if
        given (as `set_weights`); the real transitions and the chunk's stats."""
        ...

    def sample_rollout(self, num_steps: int) -> tuple[RolloutChunk, ChunkStats]:
        """On-policy: `num_steps` steps of every copy, with log-probs and values, (steps, envs, ...)."""
        ...

    def evaluate(self, num_episodes: int) -> dict[str, float]:
        """Deterministic episodes on envs of its own with the run's eval seeds: eval/return, eval/length,
        eval/<task metric>."""
        ...

    def record_video(self, max_frames: int) -> tuple[bytes | None, str | None]:
        """The first eval episode as GIF bytes, or (None, why not)."""
        ...

    def state(self) -> dict[str, Any]:
        """Everything its next chunk depends on (generators, the envs where they can be saved), for a checkpoint."""
        ...

    def load_state(self, state: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


RUNNER_KINDS: dict[str, type[Runner]] = {"vector": EnvRunner, "batched": BatchedRunner}


def runner_class(spec: ExperimentSpec) -> type[Runner]:
    """The runner kind the spec asks for."""
    return RUNNER_KINDS[spec.runner_kind]
