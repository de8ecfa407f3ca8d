"""Recording whole episodes for a dataset: what each actor of `aa-ray rollout` is.

A `DatasetRecorder` steps E copies of the spec's env with a checkpoint's policy (sampled, or its
mean) or the env's scripted controller, keeps each copy's current episode until it ends and hands
finished episodes out in the dataset's columns. It sits beside the rollout job, not inside the
training runners: training never records datasets, and a rollout needs none of a runner's
replay bookkeeping (n-step windows, normalizer moments, env snapshots).

A plain class, like the runtime's actors: `aa_ray.rollout.job` starts R of them as Ray actors (or
in-process, inline) through an `ActorGraph` without learners, and tests use one in-process.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from functools import cached_property
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from aa_ray import seeding
from aa_ray.algos.registry import build_policy
from aa_ray.data import dataset as ds
from aa_ray.envs import make_vector_env, vector_obs_dims
from aa_ray.envs.controllers import checked_actions, declared_controller
from aa_ray.envs.info_metrics import final_info, tracked_info_keys
from aa_ray.nets.policy import PolicyState, state_tensors, to_bounds
from aa_ray.records import EpisodeStats, ObsDims, Transitions
from aa_ray.spec.experiment import ExperimentSpec

Step = tuple[np.ndarray, np.ndarray, float, np.ndarray, bool, bool]  # obs, action, reward, next_obs, term., trunc.


class EpisodeBuffer:
    """Steps a vector env and keeps each env copy's current episode until it ends."""

    def __init__(self, envs: gym.vector.VectorEnv, seeds: list[int], keys: tuple[str, ...] = ()):
        self.envs = envs
        self.keys = keys  # the info keys each episode's stats keep (`aa_ray.envs.info_metrics`)
        self.obs, _ = envs.reset(seed=seeds)
        self.autoreset = np.zeros(envs.num_envs, dtype=bool)
        self.current: list[list[Step]] = [[] for _ in range(envs.num_envs)]
        self.finished: deque[tuple[Transitions, EpisodeStats]] = deque()

    def step(self, action: np.ndarray, to_env_action: Callable[[np.ndarray], np.ndarray]) -> None:
        next_obs, reward, terminated, truncated, info = self.envs.step(to_env_action(action))
        for i in range(self.envs.num_envs):
            if self.autoreset[i]:  # the reset step after an episode's end (next-step autoreset): not a transition
                continue
            step = (self.obs[i].copy(), action[i].copy(), reward[i], next_obs[i].copy(), terminated[i], truncated[i])
            self.current[i].append(step)  # copies: a vector env may reuse its observation buffers
            if terminated[i] or truncated[i]:
                self.finished.append(self._episode(self.current[i], info, i, self.keys))
                self.current[i] = []
        self.autoreset = terminated | truncated
        self.obs = next_obs

    @staticmethod
    def _episode(
        steps: list[Step], info: dict[str, Any], i: int, keys: tuple[str, ...]
    ) -> tuple[Transitions, EpisodeStats]:
        obs, action, reward, next_obs, terminated, truncated = (
            np.asarray(c, np.float32) for c in zip(*steps, strict=True)
        )
        episode = Transitions(obs, action, reward, next_obs, terminated, truncated, np.ones_like(reward))
        return episode, EpisodeStats(float(reward.sum()), float(len(steps)), final_info(info, i, keys))


class DatasetRecorder:
    """E env copies recording whole episodes with the given policy weights or the scripted controller.
    Episodes still running when a call returns carry over into the next call, so no env step is
    wasted between calls."""

    def __init__(self, spec: ExperimentSpec, index: int, incarnation: int = 0):
        self.spec = spec
        num_envs = spec.runners.envs_per_runner
        # MuJoCo's model warnings: the driver made this env first (env_dims) and showed them there, once
        envs = make_vector_env(spec, num_envs, show_model_warnings=False)
        act_space = envs.single_action_space
        self.act_low, self.act_high = act_space.low.astype(np.float32), act_space.high.astype(np.float32)
        self.obs_dims, self.act_dim = vector_obs_dims(envs), act_space.shape[0]
        self.policy = build_policy(spec.algo, self.obs_dims, self.act_dim)
        self.generator = torch.Generator().manual_seed(seeding.exploration_seed(spec.seed, index, incarnation))
        seeds = seeding.rollout_env_seeds(spec.seed, index, incarnation, num_envs)
        self.episodes = EpisodeBuffer(envs, seeds=seeds, keys=tracked_info_keys(spec, envs))

    @cached_property
    def controller(self) -> Callable[[np.ndarray], np.ndarray]:
        """The scripted controller the env declares in its metadata (`aa_ray.envs.controllers`)."""
        controller = declared_controller(self.episodes.envs, self.spec.env)
        if controller is None:
            raise ValueError(f"env {self.spec.env.id} has no scripted controller")
        return lambda obs: checked_actions(controller, obs, self.act_dim)

    def env_dims(self) -> tuple[ObsDims, int]:
        """The observation features and act_dim of the env this recorder made: the driver checks them."""
        return self.obs_dims, self.act_dim

    def set_weights(self, state: PolicyState, version: int) -> None:
        self.policy.load_state_dict(state_tensors(state))

    def to_env_action(self, action: np.ndarray) -> np.ndarray:
        return to_bounds(action, self.act_low, self.act_high)

    def rollout(
        self, num_episodes: int, first_eps_id: int, scripted: bool = False, deterministic: bool = False
    ) -> tuple[dict[str, np.ndarray], list[EpisodeStats]]:
        """Record `num_episodes` whole episodes, acting with the policy (sampled, or its mean with
        `deterministic`) or with the env's scripted controller. Returns (transitions in the dataset's
        columns, each episode's stats); episodes get ids `first_eps_id`, +1, ..."""
        if scripted:
            act = self.controller
        else:
            act = lambda obs: self.policy.act(obs, deterministic=deterministic, generator=self.generator)  # noqa: E731
        buffer = self.episodes
        while len(buffer.finished) < num_episodes:
            buffer.step(act(buffer.obs), self.to_env_action)
        episodes = [buffer.finished.popleft() for _ in range(num_episodes)]
        if not episodes:
            return {name: np.zeros(0) for name in ds.COLUMNS}, []
        columns = [ds.episode_columns(steps, first_eps_id + k) for k, (steps, _) in enumerate(episodes)]
        return {name: np.concatenate([c[name] for c in columns]) for name in ds.COLUMNS}, [s for _, s in episodes]

    def close(self) -> None:
        self.episodes.envs.close()
