"""Scripted (expert) controllers by env id: observations (N, obs_dim) -> actions (N, act_dim) in [-1, 1]."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

Controller = Callable[[np.ndarray], np.ndarray]


def scripted_controllers() -> dict[str, Controller]:
    """Env id -> controller, for every env that has one (imported here: the envs import MuJoCo)."""
    from aa_ray.envs.pusher_reach import ENV_ID, scripted_action

    return {ENV_ID: scripted_action}
