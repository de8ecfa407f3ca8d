"""An env with the shapes of a real task and the cost of a chosen simulator, and nothing else."""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
import numpy as np


class SyntheticEnv(gym.Env):
    """`obs_dim` observations and `act_dim` actions in [-1, 1]; each step sleeps `step_s` seconds
    (a simulator that keeps a core busy elsewhere, e.g. a robot or a renderer; 0: the env costs only
    its Python call) and returns a reward that depends on the action, so a policy has something to
    follow. Episodes end by the time limit alone (gymnasium's `max_episode_steps`)."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, obs_dim: int = 17, act_dim: int = 6, step_s: float = 0.0):
        if obs_dim < 1 or act_dim < 1 or not np.isfinite(step_s) or step_s < 0:
            raise ValueError(f"SyntheticEnv needs obs_dim, act_dim >= 1 and step_s >= 0 (got {obs_dim}, {act_dim}, "
                             f"{step_s})")
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (obs_dim,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (act_dim,), np.float32)
        self.step_s = step_s
        self._obs = np.zeros(obs_dim, np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self._obs = self.np_random.standard_normal(self._obs.shape).astype(np.float32)
        return self._obs.copy(), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        if self.step_s > 0:
            time.sleep(self.step_s)
        reward = -float(np.square(action).sum())
        self._obs[0] += 0.01  # the observation moves, so that no two transitions are the same
        return self._obs.copy(), reward, False, False, {}
