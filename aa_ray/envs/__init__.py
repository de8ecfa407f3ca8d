"""Env construction (`make`: the spec's vector env and its dims) and custom environments;
importing this package registers them with gymnasium."""

from __future__ import annotations

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
    register_envs,
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


register_envs()
