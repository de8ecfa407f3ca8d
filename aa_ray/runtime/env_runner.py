"""EnvRunner: a gymnasium vector env plus the current policy; returns transitions as numpy."""

from __future__ import annotations

import time
from collections import deque
from functools import cached_property
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from aa_ray import metric_names as m
from aa_ray import seeding
from aa_ray.algos.contract import OnPolicyActor
from aa_ray.algos.registry import build_policy
from aa_ray.envs import RENDER_BACKEND_ERRORS, make_env, make_vector_env, vector_obs_dims
from aa_ray.envs.info_metrics import final_info, metric_name, tracked_info_keys
from aa_ray.nets.numpy_acting import numpy_acting
from aa_ray.nets.policy import PolicyState, state_tensors, to_bounds
from aa_ray.records import (
    ChunkStats,
    EpisodeStats,
    NormMoments,
    ObsDims,
    RolloutChunk,
    Transitions,
    obs_moments,
    return_moments,
)
from aa_ray.runtime.env_state import pack, restore_vector_env, snapshot_vector_env, unpack
from aa_ray.runtime.families import family_of
from aa_ray.runtime.metrics import RunMetrics, run_tag
from aa_ray.runtime.nstep import NStepWindow
from aa_ray.runtime.run_files import cannot_render, gif_bytes
from aa_ray.spec.experiment import ExperimentSpec


class EpisodeTracker:
    """Per-env running return/length; collects finished episodes' statistics: return, length and
    `info`, the tracked info keys' values at the episode's last step (`aa_ray.envs.info_metrics`)."""

    def __init__(self, num_envs: int):
        self.returns = np.zeros(num_envs)
        self.lengths = np.zeros(num_envs, dtype=np.int64)
        self.finished: list[EpisodeStats] = []

    def step(
        self, reward: np.ndarray, done: np.ndarray, valid: np.ndarray, info: dict[str, Any], keys: tuple[str, ...] = ()
    ) -> None:
        """`info`: the vector env's info for the step's final states (next-step autoreset: the step's
        own; same-step autoreset: its `final_info`)."""
        # called every env step: in place, and no scan for ended episodes on the many steps that end none
        np.add(self.returns, reward, out=self.returns, where=valid)
        self.lengths += valid
        if not done.any():
            return
        for i in np.flatnonzero(done & valid):
            values = final_info(info, i, keys)
            self.finished.append(EpisodeStats(float(self.returns[i]), float(self.lengths[i]), values))
            self.returns[i], self.lengths[i] = 0.0, 0

    def pop(self) -> list[EpisodeStats]:
        finished, self.finished = self.finished, []
        return finished


class EnvRunner:
    """Owns E env copies and acts with the latest published policy weights.

    Gymnasium 1.x vector envs reset a finished env on the *next* `step` call: that step's
    observation is a fresh reset and its reward/action mean nothing, so it is never stored.
    On-policy runners (`sample_rollout`) reset within the step instead, so every row of a rollout
    is a real transition.
    """

    def __init__(self, spec: ExperimentSpec, index: int, incarnation: int = 0):
        self.spec = spec
        self.index = index
        self.num_envs = spec.runners.envs_per_runner
        # MuJoCo's model warnings: the driver made this env first (env_dims) and showed them there, once
        self.envs = make_vector_env(spec, self.num_envs, same_step_reset=family_of(spec).same_step_reset,
                                    show_model_warnings=False)
        act_space = self.envs.single_action_space
        self.act_low, self.act_high = act_space.low.astype(np.float32), act_space.high.astype(np.float32)
        self.obs_dims, self.act_dim = vector_obs_dims(self.envs), act_space.shape[0]
        self.policy = build_policy(spec.algo, self.obs_dims, self.act_dim)
        self.numpy_act = numpy_acting(self.policy)  # None: this policy acts through torch
        self.policy_version = -1
        # a restarted runner (incarnation > 0) gets streams of its own, not its predecessor's episodes
        self.incarnation = incarnation
        self.rng = seeding.warm_up_rng(spec.seed, index, incarnation)
        self.generator = torch.Generator().manual_seed(seeding.exploration_seed(spec.seed, index, incarnation))
        self.env_seeds = seeding.train_env_seeds(spec.seed, index, incarnation, self.num_envs)
        self.obs, _ = self.envs.reset(seed=self.env_seeds)
        self.autoreset = np.zeros(self.num_envs, dtype=bool)
        self.episodes = EpisodeTracker(self.num_envs)
        self.gamma = spec.algo.gamma
        self.running_return = np.zeros(self.num_envs)  # discounted, raw rewards: feeds reward normalization
        n_step = spec.algo.n_step  # every family's config has one (on-policy: 1)
        self.nstep = NStepWindow(self.num_envs, n_step, self.gamma) if n_step > 1 else None
        self.eval_envs: gym.vector.VectorEnv | None = None
        self.metrics = RunMetrics(run_tag(spec), runner=index)
        self.weights_s = 0.0  # loading policy weights since the last chunk (the publish phase)

    @cached_property
    def info_keys(self) -> tuple[str, ...]:
        """The info keys recorded at each episode's end: is_success, the env's declared task metrics
        and the spec's eval.info_metrics (`aa_ray.envs.info_metrics`)."""
        return tracked_info_keys(self.spec, self.envs)

    def env_dims(self) -> tuple[ObsDims, int]:
        """The observation features and act_dim of the env this runner made: the driver checks them
        against its own."""
        return self.obs_dims, self.act_dim

    def close(self) -> None:
        """Close the envs and let go of them, so that nothing of theirs is left to finalize when the
        process ends (the graph calls this before it ends the actor; in-process users call it too)."""
        for envs in (self.envs, self.eval_envs):
            if envs is not None:
                envs.close()
        self.envs = self.eval_envs = None

    def set_weights(self, state: PolicyState, version: int) -> None:
        if version != self.policy_version:
            start = time.perf_counter()
            self.policy.load_state_dict(state_tensors(state))
            self.numpy_act = numpy_acting(self.policy)
            self.policy_version = version
            self.weights_s += time.perf_counter() - start

    def to_env_action(self, action: np.ndarray) -> np.ndarray:
        """Map policy actions in [-1, 1] onto the env's bounds (replay keeps the [-1, 1] ones)."""
        return to_bounds(action, self.act_low, self.act_high)

    def sample(self, num_steps: int, random_actions: bool, weights: PolicyState | None = None,
               version: int = 0) -> tuple[Transitions, ChunkStats]:
        """Step every env `num_steps` times, first loading `weights` (of `version`) if given. Returns
        (transitions, stats); stats include the moments of raw observations and returns that the
        learner merges into its normalizers."""
        if weights is not None:
            self.set_weights(weights, version)
        start = time.perf_counter()
        obs_dim = self.obs.shape[1]
        buf = {
            "obs": np.empty((num_steps, self.num_envs, obs_dim), np.float32),
            "action": np.empty((num_steps, self.num_envs, self.act_dim), np.float32),
            "reward": np.empty((num_steps, self.num_envs), np.float32),
            "next_obs": np.empty((num_steps, self.num_envs, obs_dim), np.float32),
            "terminated": np.empty((num_steps, self.num_envs), np.float32),
            "truncated": np.empty((num_steps, self.num_envs), np.float32),
        }
        valid = np.empty((num_steps, self.num_envs), dtype=bool)
        returns = np.empty((num_steps, self.num_envs))
        for t in range(num_steps):
            if random_actions:
                action = self.rng.uniform(-1.0, 1.0, (self.num_envs, self.act_dim)).astype(np.float32)
            elif self.numpy_act is not None:
                action = self.numpy_act(self.obs, self.generator)
            else:
                action = self.policy.act(self.obs, deterministic=False, generator=self.generator)
            next_obs, reward, terminated, truncated, info = self.envs.step(self.to_env_action(action))
            valid[t] = ~self.autoreset
            buf["obs"][t], buf["action"][t], buf["reward"][t] = self.obs, action, reward
            buf["next_obs"][t], buf["terminated"][t], buf["truncated"][t] = next_obs, terminated, truncated
            done = terminated | truncated
            returns[t] = self.running_return = self.gamma * self.running_return + reward
            self.running_return[done] = 0.0
            self.episodes.step(reward, done, valid[t], info, self.info_keys)
            self.autoreset = done
            self.obs = next_obs

        transitions = self._transitions(buf, valid)
        moments = NormMoments(obs_moments(transitions.obs), return_moments(returns[valid]))
        return transitions, self._chunk_stats(int(valid.sum()), moments, start)

    def sample_rollout(self, num_steps: int) -> tuple[RolloutChunk, ChunkStats]:
        """On-policy: step every env `num_steps` times with the current policy. Returns (rollout of
        shape (num_steps, E, ...), stats): sampled actions with their log-probs, V(s), and V(s') of
        the true next observation (the final one when an episode ended in this step)."""
        start = time.perf_counter()
        shape = (num_steps, self.num_envs)
        obs = np.empty((*shape, self.obs.shape[1]), np.float32)
        next_obs = np.empty_like(obs)
        rollout = {
            "action": np.empty((*shape, self.act_dim), np.float32),
            "log_prob": np.empty(shape, np.float32),
            "reward": np.empty(shape, np.float32),
            "terminated": np.empty(shape, np.float32),
            "truncated": np.empty(shape, np.float32),
        }
        returns = np.empty(shape)
        every_env = np.ones(self.num_envs, dtype=bool)
        policy: OnPolicyActor = self.policy
        for t in range(num_steps):
            action, log_prob = policy.explore(self.obs, self.generator)
            reset_obs, reward, terminated, truncated, info = self.envs.step(
                self.to_env_action(np.clip(action, -policy.action_limit, policy.action_limit)))
            done = terminated | truncated
            obs[t], next_obs[t] = self.obs, reset_obs
            for i in np.flatnonzero(done):  # the env already reset: its episode ended at final_obs
                next_obs[t, i] = info["final_obs"][i]
            rollout["action"][t], rollout["log_prob"][t], rollout["reward"][t] = action, log_prob, reward
            rollout["terminated"][t], rollout["truncated"][t] = terminated, truncated
            returns[t] = self.running_return = self.gamma * self.running_return + reward
            self.running_return[done] = 0.0
            self.episodes.step(reward, done, every_env, info["final_info"] if done.any() else info, self.info_keys)
            self.obs = reset_obs
        # one batched critic pass over the whole chunk, not one per step
        flat_obs = obs.reshape(-1, obs.shape[-1])
        chunk = RolloutChunk(
            obs=obs, action=rollout["action"], log_prob=rollout["log_prob"],
            value=policy.value(flat_obs).reshape(shape), reward=rollout["reward"],
            next_value=policy.value(next_obs.reshape(-1, obs.shape[-1])).reshape(shape),
            terminated=rollout["terminated"], truncated=rollout["truncated"],
        )
        moments = NormMoments(obs_moments(flat_obs), return_moments(returns.ravel()))
        return chunk, self._chunk_stats(num_steps * self.num_envs, moments, start)

    def _chunk_stats(self, env_steps: int, moments: NormMoments, start: float) -> ChunkStats:
        """The chunk's counts, episodes, moments and timings (runtime/phases.py); the Ray metrics."""
        stats = ChunkStats(
            env_steps, self.episodes.pop(), self.policy_version, moments,
            collect_s=time.perf_counter() - start, weights_s=self.weights_s,
        )
        self.weights_s = 0.0
        self.metrics.inc("aa_ray_env_steps", env_steps)
        self.metrics.set("aa_ray_env_steps_per_s", env_steps / max(stats.collect_s, 1e-9))
        return stats

    def _transitions(self, buf: dict[str, np.ndarray], valid: np.ndarray) -> Transitions:
        """Stored transitions: every real step (1-step), or the n-step windows completed so far."""
        if self.nstep is None:
            rows = int(valid.sum())
            return Transitions(**{k: v[valid] for k, v in buf.items()}, discount=np.full(rows, self.gamma, np.float32))
        rows = []
        for t, i in zip(*np.nonzero(valid), strict=True):  # time-major, so each env's steps stay in order
            rows += self.nstep.push(
                i, buf["obs"][t, i], buf["action"][t, i], float(buf["reward"][t, i]), buf["next_obs"][t, i],
                bool(buf["terminated"][t, i]), bool(buf["truncated"][t, i]),
            )
        if not rows:
            return Transitions(**{k: v[:0] for k, v in buf.items()}, discount=np.zeros(0, np.float32))
        return Transitions(*(np.asarray(column, np.float32) for column in zip(*rows, strict=True)))

    def evaluate(self, num_episodes: int) -> dict[str, float]:
        """Run `num_episodes` deterministic episodes on separate envs with fixed seeds, so every
        evaluation of a run faces the same starts and targets. Returns eval/return and eval/length,
        eval/success (the mean of info["is_success"] at each episode's last step) where the env
        reports it, and eval/<key> for each task metric (`info_keys`) the env reports."""
        if self.eval_envs is None or self.eval_envs.num_envs != num_episodes:
            self.eval_envs = make_vector_env(self.spec, num_episodes, show_model_warnings=False)
        obs, _ = self.eval_envs.reset(seed=seeding.eval_env_seeds(self.spec.seed, num_episodes))
        tracker = EpisodeTracker(num_episodes)
        finished = np.zeros(num_episodes, dtype=bool)
        results: list[EpisodeStats | None] = [None] * num_episodes
        while not finished.all():
            action = self.policy.act(obs, deterministic=True)
            obs, reward, terminated, truncated, info = self.eval_envs.step(self.to_env_action(action))
            done = terminated | truncated
            tracker.step(reward, done, ~finished, info, self.info_keys)
            for i in np.flatnonzero(done & ~finished):
                results[i] = tracker.finished.pop(0)
            finished |= done
        out = {
            m.EVAL_RETURN: float(np.mean([r.episode_return for r in results])),
            m.EVAL_LENGTH: float(np.mean([r.length for r in results])),
        }
        for key in self.info_keys:
            values = [r.info[key] for r in results if key in r.info]
            if values:
                out[m.EVAL_PREFIX + metric_name(key)] = float(np.mean(values))
        return out

    def record_video(self, max_frames: int) -> tuple[bytes | None, str | None]:
        """The first evaluation episode (same seed, deterministic policy) rendered offscreen, as GIF
        bytes (the driver writes the file: this runner may be on another node). Returns (None,
        reason) when this machine cannot render (no GL backend for MUJOCO_GL): training goes on.
        Only making the renderer is guarded; an error while acting or stepping is raised as it is."""
        env = make_env(self.spec, show_model_warnings=False, render_mode="rgb_array")
        try:
            obs, _ = env.reset(seed=seeding.video_seed(self.spec.seed))  # evaluate()'s first episode
            try:
                frames = [env.render()]  # the first render creates the renderer and its GL context
            except RENDER_BACKEND_ERRORS as err:
                return None, cannot_render(self.spec.env.id, err)
            done = False
            while not done and len(frames) < max_frames:
                action = self.policy.act(obs[None], deterministic=True)[0]
                obs, _, terminated, truncated, _ = env.step(self.to_env_action(action))
                frames.append(env.render())
                done = terminated or truncated
            fps = env.metadata.get("render_fps") or 20
        finally:
            env.close()
        return gif_bytes(frames, fps), None

    def state(self) -> dict[str, Any]:
        """Everything the next `sample`/`sample_rollout` depends on, as plain data for a checkpoint:
        random generators, current observations and episode accumulators, pending n-step windows
        and the env copies themselves (see `env_state`)."""
        return {
            "numpy_rng": self.rng.bit_generator.state,
            "torch_rng": self.generator.get_state(),
            "envs": snapshot_vector_env(self.envs),
            "loop": pack({
                "obs": self.obs,
                "autoreset": self.autoreset,
                "running_return": self.running_return,
                "episode_returns": self.episodes.returns,
                "episode_lengths": self.episodes.lengths,
                "nstep": [list(window) for window in self.nstep.windows] if self.nstep else None,
            }),
        }

    def load_state(self, state: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state["numpy_rng"]
        self.generator.set_state(state["torch_rng"])
        # a format-1 checkpoint kept only the generators; a resume with another envs_per_runner
        # starts its envs afresh
        if "envs" not in state or len(state["envs"]["envs"]) != self.num_envs:
            return
        restore_vector_env(self.envs, state["envs"])
        loop = unpack(state["loop"])
        self.obs, self.autoreset, self.running_return = loop["obs"], loop["autoreset"], loop["running_return"]
        self.episodes.returns, self.episodes.lengths = loop["episode_returns"], loop["episode_lengths"]
        if self.nstep is not None:
            self.nstep.windows = [deque(tuple(step) for step in window) for window in loop["nstep"]]
