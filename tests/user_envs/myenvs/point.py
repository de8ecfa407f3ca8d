"""A point mass on a plane that must reach a target: small, fast and learned by SAC in a few
thousand steps. Reports `is_success` and `error` (the distance to the target) in `info`."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

SUCCESS_RADIUS = 0.1

# The plane mirrored across its y axis (x -> -x): position and offset x flip, so does the x velocity.
# Mirroring twice gives the input back, and the dynamics commute with it.
MIRROR = {"obs_perm": [0, 1, 2, 3], "obs_sign": [-1, 1, -1, 1], "act_perm": [0, 1], "act_sign": [-1, 1]}
# A mistake a user could make: x and y swapped one way, but the offsets' x and y not back.
NOT_AN_INVOLUTION = {"obs_perm": [1, 2, 0, 3], "obs_sign": [1, 1, 1, 1], "act_perm": [1, 0], "act_sign": [1, 1]}


class PointReachEnv(gym.Env):
    """Observation: position (2) and target minus position (2); action: a velocity in [-1, 1]^2,
    scaled by `speed`; reward: minus the distance to the target. Declares its mirror for
    `algo.sym_aug` in `metadata`."""

    metadata = {"mirror": MIRROR}

    def __init__(self, speed: float = 0.1):
        if speed <= 0:
            raise ValueError(f"speed must be positive, got {speed}")
        self.speed = speed
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float64)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.position = np.zeros(2)
        self.target = np.zeros(2)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.position = self.np_random.uniform(-1.0, 1.0, 2)
        self.target = self.np_random.uniform(-1.0, 1.0, 2)
        return self._obs(), self._info()

    def step(self, action: np.ndarray):
        self.position = np.clip(self.position + self.speed * np.clip(action, -1.0, 1.0), -1.5, 1.5)
        info = self._info()
        return self._obs(), -info["error"], False, False, info

    def _obs(self) -> np.ndarray:
        return np.concatenate([self.position, self.target - self.position])

    def _info(self) -> dict[str, Any]:
        error = float(np.linalg.norm(self.target - self.position))
        return {"error": error, "is_success": error < SUCCESS_RADIUS}


def make_point_reach(speed: float = 0.1) -> gym.Env:
    """A creator function, as `env.entry_point` may name one instead of a class."""
    return PointReachEnv(speed=speed)


class NotAnEnv:
    """Named by a test as an entry point that is not an env class."""


class GoalPointReachEnv(PointReachEnv):
    """The same task in a goal env's Dict (gymnasium-robotics' convention): `observation` (the
    position), `achieved_goal` (the position again) and `desired_goal` (the target). `with_mode`
    adds a Discrete entry, which the tests name as a key no network can read."""

    def __init__(self, speed: float = 0.1, with_mode: bool = False):
        super().__init__(speed)
        box = gym.spaces.Box(-np.inf, np.inf, (2,), np.float64)
        spaces = {"observation": box, "achieved_goal": box, "desired_goal": box}
        if with_mode:
            spaces["mode"] = gym.spaces.Discrete(3)
        self.observation_space = gym.spaces.Dict(spaces)
        self.with_mode = with_mode

    def _obs(self) -> dict[str, Any]:
        obs = {"observation": self.position.copy(), "achieved_goal": self.position.copy(),
               "desired_goal": self.target.copy()}
        return obs | ({"mode": 0} if self.with_mode else {})
