"""Every random stream of a run comes from one SeedSequence tree over the spec's seed (`aa_ray.seeding`)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from aa_ray import seeding
from aa_ray.records import Transitions
from aa_ray.runtime.env_runner import EnvRunner
from aa_ray.runtime.replay import ReplayBuffer
from aa_ray.spec.loader import validate_spec

RUNNERS, ENVS, INCARNATIONS, EVAL_EPISODES = 4, 10, range(4), 100


def pendulum_spec(seed: int = 0, envs: int = ENVS):
    return validate_spec({
        "name": "seeds", "seed": seed, "env": {"id": "Pendulum-v1"},
        "algo": {"name": "sac", "warm_up_steps": 10, "batch_size": 8, "buffer_size": 100,
                 "actor_hidden_dims": [8], "critic_hidden_dims": [8]},
        "budget": {"env_steps": 1000}, "runners": {"envs_per_runner": envs},
    })


def all_env_seeds(spec_seed: int) -> dict[str, set[int]]:
    def fleet(seeds_of) -> set[int]:  # every runner index and incarnation
        return {s for i in range(RUNNERS) for k in INCARNATIONS for s in seeds_of(spec_seed, i, k, ENVS)}

    train, rollout = fleet(seeding.train_env_seeds), fleet(seeding.rollout_env_seeds)
    return {"train": train, "rollout": rollout, "eval": set(seeding.eval_env_seeds(spec_seed, EVAL_EPISODES))}


def test_train_env_seeds_never_meet_eval_or_rollout_seeds_across_restarts() -> None:
    """Seed 0, 10 envs per runner, restarted runners: the old offsets gave train envs the eval seeds."""
    seeds = all_env_seeds(0)
    # every (runner, incarnation, env) has its own seed
    assert len(seeds["train"]) == RUNNERS * len(INCARNATIONS) * ENVS
    assert len(seeds["rollout"]) == RUNNERS * len(INCARNATIONS) * ENVS
    assert len(seeds["eval"]) == EVAL_EPISODES
    assert not seeds["train"] & seeds["eval"]
    assert not seeds["train"] & seeds["rollout"]
    assert not seeds["rollout"] & seeds["eval"]
    # the video replays evaluate()'s first episode, whatever the number of eval episodes
    assert seeding.video_seed(0) == seeding.eval_env_seeds(0, 1)[0] == seeding.eval_env_seeds(0, EVAL_EPISODES)[0]


def test_streams_repeat_for_a_seed_and_differ_between_seeds() -> None:
    assert all_env_seeds(0) == all_env_seeds(0)
    zero, one = all_env_seeds(0), all_env_seeds(1)
    for name in zero:
        assert not zero[name] & one[name], name
    assert seeding.learner_seed(0) == seeding.learner_seed(0) != seeding.learner_seed(1)
    draws = [seeding.replay_rng(seed).integers(0, 2**62, 4).tolist() for seed in (0, 0, 1)]
    assert draws[0] == draws[1] != draws[2]
    assert seeding.exploration_seed(0, 0, 0) != seeding.exploration_seed(0, 0, 1) != seeding.exploration_seed(0, 1, 1)


def test_a_runner_resets_its_envs_with_its_streams_seeds() -> None:
    """The seeds EnvRunner actually uses, for a restarted runner: the envs start where a fresh
    env reset with `train_env_seeds` starts, and its generators come from its own streams."""
    spec = pendulum_spec(envs=3)
    runner = EnvRunner(spec, index=1, incarnation=2)
    expected = seeding.train_env_seeds(0, 1, 2, 3)
    assert runner.env_seeds == expected
    for env_seed, obs in zip(expected, runner.obs, strict=True):
        single = gym.make("Pendulum-v1")
        np.testing.assert_array_equal(single.reset(seed=env_seed)[0], obs)
        single.close()
    assert runner.rng.random() == seeding.warm_up_rng(0, 1, 2).random()
    reference = torch.Generator().manual_seed(seeding.exploration_seed(0, 1, 2))
    assert torch.equal(torch.rand(3, generator=runner.generator), torch.rand(3, generator=reference))
    other = EnvRunner(spec, index=1, incarnation=3)
    assert not set(other.env_seeds) & set(runner.env_seeds)


def test_replay_samples_from_the_replay_stream_of_the_spec_seed() -> None:
    def sampled_rows(seed: int) -> list[float]:
        replay = ReplayBuffer(capacity=1000, obs_dim=1, act_dim=1, seed=seed)
        n = 1000
        replay.add(Transitions.empty(n, 1, 1)._replace(reward=np.arange(n, dtype=np.float32)))
        return replay.sample(2, 16).reward.ravel().tolist()

    assert sampled_rows(0) == sampled_rows(0) != sampled_rows(1)
    assert sampled_rows(0) == seeding.replay_rng(0).integers(0, 1000, size=(2, 16)).astype(float).ravel().tolist()


def test_a_learner_seeds_its_own_generator_and_leaves_torchs_alone() -> None:
    """Building learners draws their initial weights from the spec's seed without moving torch's
    global generator (the inline backend runs them beside the driver and the runners); their noise
    comes from a generator of their own, which their checkpoint carries."""
    from aa_ray.runtime.learner import Learner

    global_state = torch.get_rng_state()
    first, second, other = (Learner(pendulum_spec(seed), 3, 1) for seed in (0, 0, 1))
    assert torch.equal(torch.get_rng_state(), global_state)
    assert torch.equal(first.parameters_vector(), second.parameters_vector())
    assert not torch.equal(first.parameters_vector(), other.parameters_vector())
    assert torch.equal(first.generator.get_state(), second.generator.get_state())
    first.generator.manual_seed(123)
    second.load_state_dict(first.state_dict())
    assert torch.equal(second.generator.get_state(), first.generator.get_state())
