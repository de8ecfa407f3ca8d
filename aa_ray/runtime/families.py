"""Algorithm families: what the runtime does differently for an algorithm that learns from replay
and for one that learns from fresh rollouts. Everything the runtime needs to know about an
algorithm it learns from its family, chosen through the registry (the config's `family`, set by
the `OffPolicyKnobs` or `OnPolicyKnobs` mixin); no runtime module imports an algorithm's file.

A family owns:
- its collection mode: the loop calls the env runner's `sample` (stored transitions) or
  `sample_rollout` (a rollout with log-probs and values); `same_step_reset` is the vector
  env's autoreset mode (a rollout needs every row to be a real transition);
- its loop (`aa_ray.runtime.loops.make_loop` reads `loop`);
- its records: the learner turns what it is given (`ReplaySample`s, `RolloutChunk`s) into what the
  algorithm's `update` reads (`Batch`es, a `Rollout`) in `learn`;
- its update count (the config's `updates_per_iteration`) and its augmentation (off-policy: the
  learner mirrors replay batches; on-policy: the algorithm mirrors its own minibatches).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import partial
from typing import Any, NamedTuple, Protocol

import torch

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


class LearnerView(Protocol):
    """What a family's `learn` may use of the learner it runs in."""

    algo: Algorithm
    device: torch.device
    rank: int
    world_size: int
    mirror: Mirror | None

    def batches(self, transitions: Transitions | PackedTransitions, utd: int) -> Iterator[Batch]: ...


class Learned(NamedTuple):
    diagnostics: dict[str, Any]  # the last update's, as tensors
    updates: int  # gradient updates made (off-policy: replay batches trained on)


class OffPolicy:
    """Learns from replay: runners store transitions in the replay actor, the learners train on
    stacks of sampled batches, `utd_ratio` per fleet step."""

    name = "off_policy"
    loop = "replay"
    same_step_reset = False
    merge_moments_first = True  # the normalizers take the new data's moments, then stay frozen during the updates

    def build(self, cfg: Any, obs: ObsDims, act_dim: int, setup: TrainingSetup, mirror: Mirror | None) -> Algorithm:
        # the learner mirrors the replay batches (`learn`): the algorithm never sees the mirror
        return build_algorithm(cfg, obs, act_dim, setup)

    def learn(self, learner: LearnerView, cfg: Any,
              data: Sequence[ReplaySample | PackedTransitions | Transitions | DeviceSample]) -> Learned:
        (sample,) = data
        if isinstance(sample, DeviceSample):  # runtime.mode device: batches drawn on this learner's device
            rows, fleet_steps = sample.rows, sample.fleet_steps  # (the spec refuses sym_aug there)
        else:
            transitions = sample.transitions if isinstance(sample, ReplaySample) else sample
            if learner.mirror is not None:  # algo.sym_aug: the learner alone sees mirrored data
                unpacked = transitions.unpack() if isinstance(transitions, PackedTransitions) else transitions
                transitions = augment(unpacked, learner.mirror)
            rows, fleet_steps = transitions.rows, partial(learner.batches, transitions)
        utd = cfg.utd_ratio
        if rows % utd:
            raise ValueError(
                f"the learner was given {rows} batches, not a whole number of fleet steps of "
                f"algo.utd_ratio={utd} batches each; the replay sample must be train_every x utd_ratio batches"
            )
        diagnostics: dict[str, Any] = {}
        for fleet_step in fleet_steps(utd):
            diagnostics = learner.algo.update(fleet_step)
        return Learned(diagnostics, rows)


class OnPolicy:
    """Learns from fresh rollouts: every runner records `train_every` steps per env with the current
    weights, each learner updates on its share of the envs, and the data is dropped."""

    name = "on_policy"
    loop = "rollouts"
    same_step_reset = True
    merge_moments_first = False  # after the update, which sees the observations as the acting policy did

    def build(self, cfg: Any, obs: ObsDims, act_dim: int, setup: TrainingSetup, mirror: Mirror | None) -> Algorithm:
        return build_algorithm(cfg, obs, act_dim, setup, mirror=mirror)

    def learn(self, learner: LearnerView, cfg: Any, data: Sequence[RolloutChunk]) -> Learned:
        rollout = RolloutChunk.side_by_side(data)
        if rollout.envs % learner.world_size:
            raise ValueError(
                f"{rollout.envs} envs do not split evenly over learners.num_learners={learner.world_size}; "
                "make runners.num_runners x runners.envs_per_runner a multiple of it"
            )
        share = rollout.envs // learner.world_size
        mine = rollout.envs_slice(learner.rank * share, (learner.rank + 1) * share)
        diagnostics = learner.algo.update(Rollout.from_chunk(mine, learner.device))
        return Learned(diagnostics, cfg.updates_per_iteration)


Family = OffPolicy | OnPolicy
FAMILIES: dict[str, Family] = {family.name: family for family in (OffPolicy(), OnPolicy())}


def family_of(spec: Any) -> Family:
    """The family of the spec's algorithm (its config's `family`)."""
    return FAMILIES[spec.algo.family]
