"""Tests for the pusher-reach MuJoCo env and its scripted controller."""

from __future__ import annotations

import importlib
import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import aa_ray.envs as envs
from aa_ray.envs import (
    ACT_DIM,
    MAX_EPISODE_STEPS,
    OBS_DIM,
    PUSHER_REACH_ID,
    SUCCESS_DISTANCE,
    PusherReachEnv,
    scripted_action,
)

SPECS = Path(__file__).resolve().parents[1] / "specs"


def _final_distance(env: gym.Env, seed: int, policy) -> float:
    """Run one full episode of a TimeLimit-wrapped env and return the last distance."""
    obs, info = env.reset(seed=seed)
    while True:
        obs, _, terminated, truncated, info = env.step(policy(obs))
        if terminated or truncated:
            return info["distance"]


def test_constants() -> None:
    assert OBS_DIM == 10
    assert ACT_DIM == 2
    assert SUCCESS_DISTANCE == 0.05


def test_registration_via_make() -> None:
    env = gym.make(PUSHER_REACH_ID)
    assert isinstance(env.unwrapped, PusherReachEnv)
    assert env.spec is not None
    assert env.spec.max_episode_steps == MAX_EPISODE_STEPS
    assert env.observation_space.shape == (OBS_DIM,)
    assert env.observation_space.dtype == np.float32
    assert env.action_space == gym.spaces.Box(-1.0, 1.0, (ACT_DIM,), np.float32)
    env.close()


def test_registration_is_idempotent() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        envs.register_envs()
        importlib.reload(envs)
    assert PUSHER_REACH_ID in gym.registry


def test_check_env_passes_without_warnings() -> None:
    env = gym.make(PUSHER_REACH_ID).unwrapped
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env, skip_render_check=True)
    env.close()


def test_reset_info_and_observation() -> None:
    env = PusherReachEnv()
    obs, info = env.reset(seed=0)
    assert obs.shape == (OBS_DIM,)
    assert obs.dtype == np.float32
    assert env.observation_space.contains(obs)
    assert set(info) >= {"distance", "is_success"}
    assert isinstance(info["distance"], float)
    assert isinstance(info["is_success"], bool)
    # The fingertip-minus-target feature must agree with the reported distance.
    assert np.linalg.norm(obs[8:10]) == pytest.approx(info["distance"], abs=1e-6)
    target_radius = float(np.linalg.norm(obs[6:8]))
    assert 0.05 - 1e-6 <= target_radius <= 0.2 + 1e-6


def test_reward_is_negative_distance_every_step() -> None:
    env = gym.make(PUSHER_REACH_ID)
    env.reset(seed=1)
    rng = np.random.default_rng(0)
    for _ in range(MAX_EPISODE_STEPS):
        obs, reward, terminated, _, info = env.step(rng.uniform(-1, 1, ACT_DIM))
        assert reward == -info["distance"]
        assert info["is_success"] == (info["distance"] < SUCCESS_DISTANCE)
        assert not terminated
        assert env.observation_space.contains(obs)


def test_truncates_at_time_limit() -> None:
    env = gym.make(PUSHER_REACH_ID)
    env.reset(seed=2)
    for t in range(1, MAX_EPISODE_STEPS + 1):
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        assert terminated is False
        assert truncated is (t == MAX_EPISODE_STEPS)


def test_seeding_determinism() -> None:
    actions = np.random.default_rng(0).uniform(-1, 1, (30, ACT_DIM))

    def rollout(seed: int) -> np.ndarray:
        env = PusherReachEnv()
        obs, _ = env.reset(seed=seed)
        trajectory = [obs]
        for action in actions:
            trajectory.append(env.step(action)[0])
        return np.stack(trajectory)

    np.testing.assert_array_equal(rollout(7), rollout(7))
    # Target xy lives at obs[6:8] and is drawn from the seeded RNG.
    assert not np.allclose(rollout(7)[0, 6:8], rollout(8)[0, 6:8])


def test_unseeded_resets_draw_new_targets() -> None:
    env = PusherReachEnv()
    first, _ = env.reset(seed=3)
    second, _ = env.reset()
    assert not np.allclose(first[6:8], second[6:8])


def test_actions_are_clipped() -> None:
    def first_obs(action: np.ndarray) -> np.ndarray:
        env = PusherReachEnv()
        env.reset(seed=4)
        return env.step(action)[0]

    np.testing.assert_array_equal(first_obs(np.array([5.0, -7.0])), first_obs(np.array([1.0, -1.0])))


def test_scripted_controller_reaches_target() -> None:
    env = gym.make(PUSHER_REACH_ID)
    finals = [_final_distance(env, seed, scripted_action) for seed in range(20)]
    assert max(finals) <= 1e-3, finals


def test_scripted_action_batched_matches_single() -> None:
    env = PusherReachEnv()
    observations = []
    for seed in range(5):
        obs, _ = env.reset(seed=seed)
        observations.append(obs)
        # Include a moving, mid-episode state as well.
        observations.append(env.step(np.array([0.7, -0.4]))[0])
    batch = np.stack(observations)

    batched = scripted_action(batch)
    assert batched.shape == (len(batch), ACT_DIM)
    assert batched.dtype == np.float32
    assert np.all(np.abs(batched) <= 1.0)
    singles = np.stack([scripted_action(obs) for obs in batch])
    assert singles.shape == (len(batch), ACT_DIM)
    np.testing.assert_allclose(batched, singles, rtol=0, atol=1e-7)


def test_random_policy_baseline() -> None:
    env = gym.make(PUSHER_REACH_ID)
    rng = np.random.default_rng(0)
    finals = [_final_distance(env, seed, lambda _obs: rng.uniform(-1, 1, ACT_DIM)) for seed in range(50)]
    assert 0.10 <= float(np.mean(finals)) <= 0.25


@pytest.mark.parametrize("mode", ["make_vec", "sync_vector_env"])
def test_vector_env_with_scripted_controller(mode: str) -> None:
    num_envs = 3
    if mode == "make_vec":
        vec = gym.make_vec(PUSHER_REACH_ID, num_envs=num_envs, vectorization_mode="sync")
    else:
        vec = gym.vector.SyncVectorEnv([lambda: gym.make(PUSHER_REACH_ID) for _ in range(num_envs)])
    obs, infos = vec.reset(seed=10)
    assert obs.shape == (num_envs, OBS_DIM)
    assert obs.dtype == np.float32
    assert infos["distance"].shape == (num_envs,)
    # Seeds are offset per sub-env, so the targets differ.
    assert len({tuple(np.round(o[6:8], 6)) for o in obs}) == num_envs

    for t in range(1, MAX_EPISODE_STEPS + 1):
        obs, rewards, terminated, truncated, infos = vec.step(scripted_action(obs))
        np.testing.assert_array_equal(rewards, -infos["distance"])
        assert not terminated.any()
        assert truncated.all() == (t == MAX_EPISODE_STEPS)
    assert np.all(infos["distance"] <= 1e-3)
    assert infos["is_success"].all()
    vec.close()


class HalfScripted:
    """Acts as a policy: the scripted controller where the target lies at x > 0, no torque elsewhere
    (so some episodes end within SUCCESS_DISTANCE and some do not)."""

    def act(self, obs: np.ndarray, deterministic: bool = True, generator=None) -> np.ndarray:
        return np.where(obs[:, 6:7] > 0, scripted_action(obs), 0.0).astype(np.float32)


def test_eval_success_is_the_mean_of_is_success_at_the_episodes_ends() -> None:
    """An in-process EnvRunner's evaluation: eval/success is the mean of the env's own
    info["is_success"] at each eval episode's last step, and eval/distance (the task metric
    pusher-reach declares) the mean final distance, both recomputed here episode by episode."""
    from aa_ray import seeding
    from aa_ray.runtime.env_runner import EnvRunner
    from aa_ray.spec.loader import load_spec

    spec = load_spec(SPECS / "sac.yaml")
    assert PusherReachEnv.metadata["info_metrics"] == ["distance"] and spec.eval.info_metrics == []
    runner = EnvRunner(spec, index=0)
    runner.policy = HalfScripted()
    evaluation = runner.evaluate(10)

    successes, distances = [], []
    for seed in seeding.eval_env_seeds(spec.seed, 10):
        env = gym.make(PUSHER_REACH_ID)
        obs, _ = env.reset(seed=seed)
        done = False
        while not done:
            obs, _, terminated, truncated, info = env.step(HalfScripted().act(obs[None])[0])
            done = terminated or truncated
        successes.append(info["is_success"])
        distances.append(info["distance"])
    assert 0 < np.mean(successes) < 1  # both kinds of episode, so the mean says something
    assert evaluation["eval/success"] == np.mean(successes)
    assert evaluation["eval/distance"] == pytest.approx(np.mean(distances), rel=1e-6)  # batched float32 actions
    assert evaluation["eval/length"] == MAX_EPISODE_STEPS


def test_render_is_lazy_and_optional() -> None:
    env = PusherReachEnv()
    env.reset(seed=0)
    assert env.render() is None
    assert env._renderer is None
    env.close()


def test_render_rgb_array() -> None:
    env = PusherReachEnv(render_mode="rgb_array", width=64, height=48)
    env.reset(seed=0)
    assert env._renderer is None  # no GL context until render() is called
    try:
        # A failed GL backend probe (e.g. GLFW without a display) warns before raising.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            frame = env.render()
    except Exception as exc:  # no usable GL backend here; set MUJOCO_GL=egl to run this
        pytest.skip(f"offscreen rendering unavailable: {exc!r}")
    assert isinstance(frame, np.ndarray)
    assert frame.shape == (48, 64, 3)
    assert frame.dtype == np.uint8
    assert frame.std() > 0  # not a blank image
    env.close()
