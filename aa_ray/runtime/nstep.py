"""n-step transitions, assembled in the env runner where each env's steps arrive in order.

A stored transition (s_t, a_t, R, s_{t+k}, terminated, truncated, discount) has
R = sum_{i<k} gamma^i r_{t+i} and discount = gamma^k, with k = n unless the episode ended
first; the learner's target is then R + discount * (1 - terminated) * V(s_{t+k}). Rewards stay
raw (any reward scaling happens at train time, and scaling is linear in R).
"""

from __future__ import annotations

from collections import deque

import numpy as np


class NStepWindow:
    """Sliding windows of the last n steps of each env copy."""

    def __init__(self, num_envs: int, n_step: int, gamma: float):
        self.n_step, self.gamma = n_step, gamma
        self.windows: list[deque] = [deque() for _ in range(num_envs)]

    def push(
        self,
        env: int,
        obs: np.ndarray,
        action: np.ndarray,
        reward: float,
        next_obs: np.ndarray,
        terminated: bool,
        truncated: bool,
    ) -> list[tuple]:
        """Add one real step of env `env`; returns the transitions that became complete."""
        window = self.windows[env]
        window.append((obs, action, reward))
        if terminated or truncated:  # the episode ended: every pending start is complete
            out = [self._emit(window, next_obs, terminated, truncated) for _ in range(len(window))]
            return out
        if len(window) == self.n_step:
            return [self._emit(window, next_obs, False, False)]
        return []

    def _emit(self, window: deque, next_obs: np.ndarray, terminated: bool, truncated: bool) -> tuple:
        ret, discount = 0.0, 1.0
        for _, _, r in window:
            ret += discount * r
            discount *= self.gamma
        obs, action, _ = window.popleft()
        return obs, action, ret, next_obs, float(terminated), float(truncated), discount
