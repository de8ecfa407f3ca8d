"""Scripted controllers: an env declares its own in its metadata, as it declares its task metrics.

`metadata["scripted_controller"]` is a function of a batch of observations (N, obs_dim) that returns
actions (N, act_dim) in [-1, 1]: the function itself, or its import path "module:function" (the form
of gymnasium's entry points; it lets the env class name a function defined below it, or in a module
it should not import up front). `aa-ray rollout --scripted` and a pipeline's `scripted: true`
rollout stage act with it, and refuse an env that declares none.

The controller is the env's own code: by the time its metadata is read, the env's modules were
imported under the spec's trust rules (`aa_ray.spec.trust`), and a path the metadata names is an
import the env's author chose, no different from the env module's own imports.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from aa_ray.envs.source import import_object

if TYPE_CHECKING:
    import gymnasium as gym

    from aa_ray.envs.source import EnvSource

Controller = Callable[[np.ndarray], np.ndarray]

METADATA_KEY = "scripted_controller"


def declared_controller(env: gym.Env | gym.vector.VectorEnv, source: EnvSource) -> Controller | None:
    """The controller `env` declares in `metadata["scripted_controller"]` (a vector env's metadata is
    its first copy's), None when it declares none. `source` is the spec's `env` section, for the
    import's error. EnvSourceError when its module cannot be imported; ValueError naming the env's
    class when the declaration is neither a function nor a "module:function" string."""
    declared = (getattr(env, "metadata", None) or {}).get(METADATA_KEY)
    if declared is None:
        return None
    owner = type(getattr(env, "unwrapped", env)).__name__
    field = f"{owner}.metadata[{METADATA_KEY!r}]"
    controller = (
        import_object(declared, field, source, "function (e.g. mypkg.controllers:reach)")
        if isinstance(declared, str) else declared
    )
    if not callable(controller):
        raise ValueError(
            f"{field} must be a function from a batch of observations to actions, or its import path "
            f"'module:function'; got {type(controller).__name__} {declared!r}. Declare the function, or remove the key."
        )
    return controller


def checked_actions(controller: Controller, obs: np.ndarray, act_dim: int) -> np.ndarray:
    """The controller's actions for a batch of observations, clipped to [-1, 1] as float32. ValueError
    naming the controller when they are not (N, act_dim) finite numbers: an action that would reach
    the env and the dataset unnoticed."""
    actions = np.asarray(controller(obs), dtype=np.float32)
    name = getattr(controller, "__qualname__", type(controller).__name__)
    where = f"{getattr(controller, '__module__', '?')}:{name}"
    if actions.shape != (len(obs), act_dim):
        raise ValueError(
            f"the scripted controller {where} returned actions of shape {actions.shape} for {len(obs)} observations; "
            f"the env takes ({len(obs)}, {act_dim}): one row of {act_dim} actions per observation."
        )
    if not np.isfinite(actions).all():
        raise ValueError(
            f"the scripted controller {where} returned a NaN or infinite action; it must return finite actions "
            "in [-1, 1] for every observation."
        )
    return np.clip(actions, -1.0, 1.0)
