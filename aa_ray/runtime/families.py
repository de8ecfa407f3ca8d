"""Algorithm families: what the runtime does differently for an algorithm that learns from replay
and for one that learns from fresh rollouts. Everything the runtime needs to know about an
algorithm it learns from its family (the config's `family`, set by the `OffPolicyKnobs` or
`OnPolicyKnobs` mixin); no runtime module imports an algorithm's file. `FAMILIES` is the one list of
them; each satisfies the `Family` Protocol.

A family owns:
- its collection mode: the loop calls the env runner's `sample` (stored transitions) or
  `sample_rollout` (a rollout with log-probs and values); `same_step_reset` is the vector
  env's autoreset mode (a rollout needs every row to be a real transition);
- its loop (`aa_ray.runtime.loops.make_loop` reads `loop`);
- its records: `learn` turns what the learner was given (`ReplaySample`s, `RolloutChunk`s) into what
  the algorithm's `update` reads (`Batch`es, a `Rollout`), with what it needs of the learner handed
  over as a `LearnerShard` (it never calls the learner back);
- its update count (the config's `updates_per_iteration`) and its augmentation (off-policy: the
  learner mirrors replay batches; on-policy: the algorithm mirrors its own minibatches).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import partial
from typing import Any, NamedTuple, Protocol

import torch

from aa_ray.algos.config import FamilyName, OffPolicyKnobs, OnPolicyKnobs
from aa_ray.algos.contract import Algorithm, TrainingSetup
from aa_ray.algos.registry import build_algorithm
from aa_ray.envs.symmetry import Mirror, augment
from aa_ray.records import (
    Batch,
    DeviceSample,
    ObsDims,
    PackedTransitions,
    ReplaySample,
    Rollout,
    RolloutChunk,
    Transitions,
)


class FleetFeed(Protocol):
    """Puts a learner iteration's transitions on the learner's device, one fleet step at a time
    (`learner.DeviceFeed`)."""

    def fleet_steps(self, parts: Sequence[Transitions | PackedTransitions], utd: int) -> Iterator[Batch]: ...


class LearnerShard(NamedTuple):
    """Where a family's `learn` runs: the learner's device, its rank among `world_size` learners,
    the env's mirror with `algo.sym_aug` (else None), and the feed that puts replay data on the device.
    The learner hands this over; a family never calls the learner back."""

    device: torch.device
    rank: int
    world_size: int
    mirror: Mirror | None
    feed: FleetFeed


class Learned(NamedTuple):
    diagnostics: dict[str, Any]  # the last update's, as tensors
    updates: int  # gradient updates made (off-policy: replay batches trained on)


class Family(Protocol):
    """What the runtime does for every algorithm of a family (its config's mixin names it)."""

    name: FamilyName
    loop: str  # the driver's loop, a key of `aa_ray.runtime.loops.LOOPS`
    same_step_reset: bool  # the vector env's autoreset mode: a rollout needs every row to be a real transition
    merge_moments_first: bool  # the runners' moments reach the normalizers before the updates (else after)

    def build(self, cfg: Any, obs: ObsDims, act_dim: int, setup: TrainingSetup, mirror: Mirror | None) -> Algorithm:
        """The algorithm, given what this family adds to its constructor."""
        ...

    def learn(self, algo: Algorithm, cfg: Any, data: Sequence[Any], shard: LearnerShard) -> Learned:
        """One learner iteration: turn what the learner was given into what `algo.update` reads, and update."""
        ...


class OffPolicy:
    """Learns from replay: runners store transitions in the replay actor, the learners train on
    stacks of sampled batches, `utd_ratio` per fleet step."""

    name: FamilyName = "off_policy"
    loop = "replay"
    same_step_reset = False
    merge_moments_first = True  # the normalizers take the new data's moments, then stay frozen during the updates

    def build(self, cfg: Any, obs: ObsDims, act_dim: int, setup: TrainingSetup, mirror: Mirror | None) -> Algorithm:
        # the learner mirrors the replay batches (`learn`): the algorithm never sees the mirror
        return build_algorithm(cfg, obs, act_dim, setup)

    def learn(self, algo: Algorithm, cfg: OffPolicyKnobs,
              data: Sequence[ReplaySample | PackedTransitions | Transitions | DeviceSample], shard: LearnerShard
              ) -> Learned:
        if isinstance(data[0], DeviceSample):  # runtime.mode device: batches drawn on this learner's device
            (sample,) = data
            rows, fleet_steps = sample.rows, sample.fleet_steps  # (the spec refuses sym_aug there)
        else:
            # one sample, or one part per replay shard (runtime.replay_shards): the feed lays them side by side
            parts = [sample.transitions if isinstance(sample, ReplaySample) else sample for sample in data]
            if shard.mirror is not None:  # algo.sym_aug: the learner alone sees mirrored data
                joined = parts[0] if len(parts) == 1 else PackedTransitions.concat(parts, axis=1)
                parts = [augment(joined.unpack() if isinstance(joined, PackedTransitions) else joined, shard.mirror)]
            rows, fleet_steps = parts[0].rows, partial(shard.feed.fleet_steps, parts)
        utd = cfg.utd_ratio
        if rows % utd:
            raise ValueError(
                f"the learner was given {rows} batches, not a whole number of fleet steps of "
                f"algo.utd_ratio={utd} batches each; the replay sample must be train_every x utd_ratio batches"
            )
        diagnostics: dict[str, Any] = {}
        for fleet_step in fleet_steps(utd):
            diagnostics = algo.update(fleet_step)
        return Learned(diagnostics, rows)


class OnPolicy:
    """Learns from fresh rollouts: every runner records `train_every` steps per env with the current
    weights, each learner updates on its share of the envs, and the data is dropped."""

    name: FamilyName = "on_policy"
    loop = "rollouts"
    same_step_reset = True
    merge_moments_first = False  # after the update, which sees the observations as the acting policy did

    def build(self, cfg: Any, obs: ObsDims, act_dim: int, setup: TrainingSetup, mirror: Mirror | None) -> Algorithm:
        return build_algorithm(cfg, obs, act_dim, setup, mirror=mirror)

    def learn(self, algo: Algorithm, cfg: OnPolicyKnobs, data: Sequence[RolloutChunk], shard: LearnerShard
              ) -> Learned:
        rollout = RolloutChunk.side_by_side(data)
        if rollout.envs % shard.world_size:
            raise ValueError(
                f"{rollout.envs} envs do not split evenly over learners.num_learners={shard.world_size}; "
                "make runners.num_runners x runners.envs_per_runner a multiple of it"
            )
        share = rollout.envs // shard.world_size
        mine = rollout.envs_slice(shard.rank * share, (shard.rank + 1) * share)
        diagnostics = algo.update(Rollout.from_chunk(mine, shard.device))
        return Learned(diagnostics, cfg.updates_per_iteration)


FAMILIES: dict[FamilyName, Family] = {family.name: family for family in (OffPolicy(), OnPolicy())}


def family_of(spec: Any) -> Family:
    """The family of the spec's algorithm (its config's `family`)."""
    return FAMILIES[spec.algo.family]
