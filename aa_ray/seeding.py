"""Every random stream of a run, derived from the spec's one seed.

Each stream is `numpy.random.SeedSequence(spec_seed, spawn_key=(stream, *key))`: the spawn key
names what the stream is for (train envs of runner `index` in its `incarnation`, eval envs, ...),
so two streams never share seeds, whatever `envs_per_runner`, the runner count or the number of
restarts (offsets such as `10_000_000 + seed` did collide once a run had enough env copies).
Env seeds are 64-bit words of the stream, so a seed of one stream equals one of another with
odds of about n² / 2⁶⁴ for n seeds in all.
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np


class Stream(IntEnum):
    """The first word of a stream's spawn key. Values are part of a run's reproducibility: append, never renumber."""

    TRAIN_ENVS = 0  # (runner index, incarnation): the env copies `EnvRunner.sample` steps
    WARM_UP_ACTIONS = 1  # (runner index, incarnation): uniform actions before learning starts
    EXPLORATION = 2  # (runner index, incarnation): the policy's sampling noise in a runner
    EVAL_ENVS = 3  # (): evaluation episodes; the eval video replays the first one
    ROLLOUT_ENVS = 4  # (runner index, incarnation): the env copies `EnvRunner.rollout` records
    LEARNER = 5  # (): network init and the learner's sampling noise (the same on every rank)
    REPLAY = 6  # () for the one buffer or shard 0, (shard,) for another shard: which replay rows each batch draws


def stream(spec_seed: int, name: Stream, *key: int) -> np.random.SeedSequence:
    return np.random.SeedSequence(spec_seed, spawn_key=(int(name), *key))


def words(sequence: np.random.SeedSequence, n: int) -> list[int]:
    """The first `n` 64-bit words of a stream, as Python ints (gymnasium refuses numpy integers).
    A prefix does not depend on `n`: the first word is the same whether 1 or 10 are asked for."""
    return [int(word) for word in sequence.generate_state(n, dtype=np.uint64)]


def train_env_seeds(spec_seed: int, index: int, incarnation: int, num_envs: int) -> list[int]:
    """The reset seeds of runner `index`'s train env copies; a restarted runner gets new ones."""
    return words(stream(spec_seed, Stream.TRAIN_ENVS, index, incarnation), num_envs)


def rollout_env_seeds(spec_seed: int, index: int, incarnation: int, num_envs: int) -> list[int]:
    return words(stream(spec_seed, Stream.ROLLOUT_ENVS, index, incarnation), num_envs)


def eval_env_seeds(spec_seed: int, num_episodes: int) -> list[int]:
    """The same seeds for every evaluation of a run, on every runner: each faces the same starts."""
    return words(stream(spec_seed, Stream.EVAL_ENVS), num_episodes)


def video_seed(spec_seed: int) -> int:
    """The eval video shows `evaluate()`'s first episode."""
    return eval_env_seeds(spec_seed, 1)[0]


def warm_up_rng(spec_seed: int, index: int, incarnation: int) -> np.random.Generator:
    return np.random.default_rng(stream(spec_seed, Stream.WARM_UP_ACTIONS, index, incarnation))


def warm_up_seed(spec_seed: int, index: int, incarnation: int) -> int:
    """The warm-up stream as one seed, for a torch generator (a batched env's runner draws its
    uniform actions on the env's device)."""
    return words(stream(spec_seed, Stream.WARM_UP_ACTIONS, index, incarnation), 1)[0]


def exploration_seed(spec_seed: int, index: int, incarnation: int) -> int:
    """The seed of runner `index`'s torch generator, which samples the policy's actions."""
    return words(stream(spec_seed, Stream.EXPLORATION, index, incarnation), 1)[0]


def learner_seed(spec_seed: int) -> int:
    """For `torch.manual_seed` in every learner (ranks agree, so their sampling noise stays in lockstep)."""
    return words(stream(spec_seed, Stream.LEARNER), 1)[0]


def replay_rng(spec_seed: int, shard: int = 0) -> np.random.Generator:
    """Replay shard `shard`'s draws; shard 0's are the unsharded buffer's (the same runs for a seed)."""
    return np.random.default_rng(stream(spec_seed, Stream.REPLAY, *((shard,) if shard else ())))
