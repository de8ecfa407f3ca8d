"""Building a spec's env: the vector env the runners step, its dims, and what offscreen rendering raises."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import mujoco
import numpy as np

from aa_ray.envs.source import EnvSourceError, make_target, prepare
from aa_ray.spec.loader import SpecError

if TYPE_CHECKING:
    from aa_ray.spec.experiment import ExperimentSpec

# What creating a renderer or its GL context raises on a machine that cannot render offscreen:
# MuJoCo without a GL context (FatalError), a GL library that does not load (ImportError, OSError),
# an EGL/OSMesa context that cannot be made or no backend at all (RuntimeError), pygame missing
# for the classic-control envs (DependencyNotInstalled).
RENDER_BACKEND_ERRORS: tuple[type[Exception], ...] = (
    mujoco.FatalError, ImportError, OSError, RuntimeError, gym.error.DependencyNotInstalled,
)


class EnvSetupError(SpecError):
    """The spec's env could not be made in some process (an import, the id, the constructor, its kwargs).
    The same spec fails the same way every time, so the runtime never retries it."""


def env_kwargs(spec: ExperimentSpec) -> dict[str, Any]:
    """Keyword arguments for gym.make(spec.env.id): the spec's kwargs and time-limit override."""
    kwargs = dict(spec.env.kwargs)
    if spec.env.max_episode_steps is not None:
        kwargs["max_episode_steps"] = spec.env.max_episode_steps
    return kwargs


def make_vector_env(spec: ExperimentSpec, num_envs: int, same_step_reset: bool = False) -> gym.vector.VectorEnv:
    """E copies of the spec's env. By default a finished env resets on the *next* step (gymnasium's
    default); `same_step_reset` resets it within the step that ended the episode and reports the
    final observation in `info["final_obs"]`, which keeps on-policy rollouts free of reset rows.
    EnvSetupError, naming the env, the process and the env's own error, when it cannot be made."""
    kwargs = env_kwargs(spec)
    if same_step_reset:
        kwargs["vector_kwargs"] = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}
    # "sync" keeps the E copies in this actor's process: parallelism comes from more runners
    return _made(spec, lambda: gym.make_vec(make_target(spec.env), num_envs=num_envs, vectorization_mode="sync",
                                            **kwargs))


def make_env(spec: ExperimentSpec, **make_kwargs: Any) -> gym.Env:
    """One copy of the spec's env (e.g. `render_mode="rgb_array"` for a video); errors as `make_vector_env`."""
    return _made(spec, lambda: gym.make(make_target(spec.env), **env_kwargs(spec), **make_kwargs))


def _made(spec: ExperimentSpec, make: Callable[[], Any]) -> Any:
    try:
        prepare(spec.env)  # a Ray worker imports the spec's modules here, the first time it makes the env
        return make()
    except EnvSourceError as err:
        raise EnvSetupError(str(err)) from err
    except Exception as err:  # gymnasium raises whatever the env constructor raises
        # the message is for the user; the cause keeps the constructor's traceback for a developer
        kwargs = f" with kwargs {dict(spec.env.kwargs)}" if spec.env.kwargs else ""
        raise EnvSetupError(
            f"env: could not make {spec.env.id!r}{kwargs} in process {os.getpid()} on {os.uname().nodename} "
            f"({type(err).__name__}: {err}); check env.id, env.entry_point and env.kwargs."
        ) from err


def env_dims(spec: ExperimentSpec) -> tuple[int, int]:
    """(obs_dim, act_dim) of the spec's env, checked to be flat Box spaces. Builds the env once,
    so a spec whose env cannot be made fails here, before any actor starts."""
    envs = make_vector_env(spec, 1)
    try:
        obs_space, act_space = envs.single_observation_space, envs.single_action_space
    finally:
        envs.close()
    problem = None
    if not (isinstance(obs_space, gym.spaces.Box) and len(obs_space.shape) == 1):
        problem = f"observations must be a flat Box, got {obs_space}"
    elif not (isinstance(act_space, gym.spaces.Box) and len(act_space.shape) == 1):
        problem = f"actions must be a flat continuous Box, got {act_space}"
    elif not (np.all(np.isfinite(act_space.low)) and np.all(np.isfinite(act_space.high))):
        problem = f"action bounds must be finite, got {act_space}"
    if problem:
        raise SpecError(f"env.id: {spec.env.id} cannot be used with these algorithms: {problem}.")
    return obs_space.shape[0], act_space.shape[0]
