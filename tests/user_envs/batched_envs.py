"""Batched env shapes a user's code could hand `env.batched`, for tests/test_batched_envs.py: an
Isaac Lab-style task without the final observation, a gymnasium vector env of the numpy point-reach
copies in a chosen autoreset mode, and the mistakes the adapters must refuse."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from myenvs.point import GoalPointReachEnv, PointReachEnv

from aa_ray.envs.point_reach import PointReach


class IsaacStyleReach(PointReach):
    """PointReach as Isaac Lab hands a task over: the spaces of the batch (leading dim N), no final
    observation in `extras` and the step's info in `extras` itself (read after the resets)."""

    def __init__(self, num_envs: int, device: str | torch.device = "cpu", **kwargs: Any):
        super().__init__(num_envs, device, **kwargs)
        self.observation_space = gym.spaces.Dict({
            key: gym.spaces.Box(np.stack([box.low] * num_envs), np.stack([box.high] * num_envs), dtype=np.float32)
            for key, box in self.observation_space.spaces.items()
        })

    def step(self, actions: torch.Tensor) -> tuple[Any, ...]:
        obs, reward, terminated, truncated, extras = super().step(actions)
        return obs, reward, terminated, truncated, {"time_outs": truncated, **extras["final_info"]}


class FlatReach(PointReach):
    """PointReach with one flat observation tensor (the policy group), its final one a tensor too."""

    def __init__(self, num_envs: int, device: str | torch.device = "cpu", **kwargs: Any):
        super().__init__(num_envs, device, **kwargs)
        self.observation_space = self.observation_space["policy"]

    def reset(self, seed: int | None = None) -> tuple[Any, ...]:
        obs, extras = super().reset(seed)
        return obs["policy"], extras

    def step(self, actions: torch.Tensor) -> tuple[Any, ...]:
        obs, reward, terminated, truncated, extras = super().step(actions)
        return obs["policy"], reward, terminated, truncated, {**extras, "final_obs": extras["final_obs"]["policy"]}


class UnboundedReach(PointReach):
    """Actions declared without bounds, as Isaac Lab's tasks declare them."""

    def __init__(self, num_envs: int, device: str | torch.device = "cpu", **kwargs: Any):
        super().__init__(num_envs, device, **kwargs)
        self.action_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)


class FixedSizeReach(PointReach):
    """Ignores the number of envs asked for."""

    def __init__(self, num_envs: int, device: str | torch.device = "cpu", **kwargs: Any):
        super().__init__(8, device, **kwargs)


class NoStep:
    """Has a size and a device but cannot be stepped."""

    def __init__(self, num_envs: int, device: str | torch.device = "cpu"):
        self.num_envs, self.device = num_envs, torch.device(device)

    def reset(self, seed: int | None = None) -> None:
        return None


def point_reach_vector(num_envs: int, autoreset_mode: str = "NextStep", max_episode_stepss: tuple[int, ...] = (3, 5),
                       goal: bool = False) -> gym.vector.VectorEnv:
    """`num_envs` numpy point-reach copies in a gymnasium SyncVectorEnv with `autoreset_mode`; copy i's
    episodes last `max_episode_stepss[i % len]` steps, so copies finish at different steps. `goal`: the
    goal-env Dict observations."""
    env_class = GoalPointReachEnv if goal else PointReachEnv

    def copy(length: int) -> Any:
        return lambda: gym.wrappers.TimeLimit(env_class(), max_episode_steps=length)

    return gym.vector.SyncVectorEnv([copy(max_episode_stepss[i % len(max_episode_stepss)]) for i in range(num_envs)],
                                    autoreset_mode=autoreset_mode)
