"""Env construction (`make`: the spec's vector env and its dims) and custom environments;
importing this package registers them with gymnasium."""

from __future__ import annotations

import gymnasium as gym

from aa_ray.envs.make import (
    RENDER_BACKEND_ERRORS,
    EnvSetupError,
    env_dims,
    env_kwargs,
    make_env,
    make_vector_env,
    vector_obs_dims,
)
from aa_ray.envs.pusher_reach import (
    ACT_DIM,
    ENV_ID,
    MAX_EPISODE_STEPS,
    OBS_DIM,
    SUCCESS_DISTANCE,
    PusherReachEnv,
    scripted_action,
)

__all__ = [
    "ACT_DIM",
    "EnvSetupError",
    "MAX_EPISODE_STEPS",
    "OBS_DIM",
    "PUSHER_REACH_ID",
    "RENDER_BACKEND_ERRORS",
    "SUCCESS_DISTANCE",
    "PusherReachEnv",
    "env_dims",
    "env_kwargs",
    "make_env",
    "make_vector_env",
    "register_envs",
    "scripted_action",
    "vector_obs_dims",
]

PUSHER_REACH_ID = ENV_ID


def register_envs() -> None:
    """Register all envs of this package; safe to call any number of times."""
    # gymnasium warns when an id is registered twice (e.g. after importlib.reload),
    # so skip ids that are already known.
    if PUSHER_REACH_ID not in gym.registry:
        gym.register(
            id=PUSHER_REACH_ID,
            entry_point="aa_ray.envs.pusher_reach:PusherReachEnv",
            max_episode_steps=MAX_EPISODE_STEPS,
        )


register_envs()
