"""Building a spec's env: the vector env the runners step, its dims, and what offscreen rendering raises."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import mujoco
import numpy as np

from aa_ray.envs.batched import BatchedEnv, BatchedEnvError
from aa_ray.envs.controllers import Controller, declared_controller
from aa_ray.envs.info_metrics import tracked_info_keys
from aa_ray.envs.obs_groups import GroupedObservations, ObsLayoutError, obs_layout
from aa_ray.envs.source import EnvSourceError, make_target, prepare, resolve_entry_point
from aa_ray.errors import SpecError, what_user_code_did
from aa_ray.records import ObsDims

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


def make_vector_env(spec: ExperimentSpec, num_envs: int, same_step_reset: bool = False,
                    show_model_warnings: bool = True) -> gym.vector.VectorEnv:
    """E copies of the spec's env. By default a finished env resets on the *next* step (gymnasium's
    default); `same_step_reset` resets it within the step that ended the episode and reports the
    final observation in `info["final_obs"]`, which keeps on-policy rollouts free of reset rows.
    MuJoCo's warnings while the models compile as `model_warnings_once`. EnvSetupError, naming the
    env, the process and the env's own error, when it cannot be made."""
    kwargs = env_kwargs(spec)
    if same_step_reset:
        kwargs["vector_kwargs"] = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}
    # "sync" keeps the E copies in this actor's process: parallelism comes from more runners
    return _made(spec, lambda: gym.make_vec(make_target(spec.env), num_envs=num_envs, vectorization_mode="sync",
                                            wrappers=[partial(grouped, spec=spec)], **kwargs),
                 show_model_warnings)


def make_batched_env(spec: ExperimentSpec, num_envs: int, show_model_warnings: bool = True) -> BatchedEnv:
    """The spec's `env.batched` env with `num_envs` copies, adapted to `BatchedEnv` (its observation
    groups laid out for the spec's actor_obs / critic_obs); errors as `make_vector_env`."""
    env = spec.env
    target = resolve_entry_point(env.entry_point, env) if env.entry_point is not None else env.id
    if env.batched == "playground":  # builds on envs/batched.py, so that module cannot name it
        from aa_ray.envs.playground import make_playground_env as adapted_batched_env
    elif env.batched == "unilab":  # the same
        from aa_ray.envs.unilab import make_unilab_env as adapted_batched_env
    else:
        from aa_ray.envs.batched import make_batched_env

        adapted_batched_env = partial(make_batched_env, env.batched)
    return _made(spec, lambda: adapted_batched_env(
        target, num_envs, env.device, actor_obs=spec.algo.actor_obs,
        critic_obs=spec.algo.critic_obs, info_metrics=spec.eval.info_metrics, **env_kwargs(spec),
    ), show_model_warnings)


def first_observations(spec: ExperimentSpec, rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`rows` first observations of the spec's env (reset with the spec's seed; float32, all features)
    and its action bounds (low, high): what a policy's exported form needs, for either kind of env."""
    if spec.env.batched is not None:
        batched_envs = make_batched_env(spec, rows)
        try:
            obs = batched_envs.reset(seed=spec.seed)
            return (obs.cpu().numpy().astype(np.float32), batched_envs.action_low.cpu().numpy(),
                    batched_envs.action_high.cpu().numpy())
        finally:
            batched_envs.close()
    envs = make_vector_env(spec, rows)
    try:
        obs, _ = envs.reset(seed=spec.seed)
        space = envs.single_action_space
        return np.asarray(obs, dtype=np.float32), space.low, space.high
    finally:
        envs.close()


def task_metric_keys(spec: ExperimentSpec) -> tuple[str, ...]:
    """`info_metrics.tracked_info_keys` of the spec's env, made once here (for checks before a run starts)."""
    if spec.env.batched is not None:
        envs = make_batched_env(spec, 1)
        envs.close()
        return envs.info_keys
    env = make_env(spec)
    try:
        return tracked_info_keys(spec, env)
    finally:
        env.close()


def scripted_controller(spec: ExperimentSpec) -> Controller | None:
    """The scripted controller the spec's env declares (`controllers.declared_controller`), read from
    one env made here (for checks before a rollout starts); None when it declares none."""
    env = make_env(spec)
    try:
        return declared_controller(env, spec.env)
    finally:
        env.close()


def make_env(spec: ExperimentSpec, show_model_warnings: bool = True, **make_kwargs: Any) -> gym.Env:
    """One copy of the spec's env (e.g. `render_mode="rgb_array"` for a video); warnings and errors
    as `make_vector_env`."""
    return _made(spec, lambda: grouped(gym.make(make_target(spec.env), **env_kwargs(spec), **make_kwargs), spec),
                 show_model_warnings)


# MuJoCo's warnings this process has seen while making envs (each is shown at most once)
_MODEL_WARNINGS_SEEN: set[str] = set()


@contextmanager
def model_warnings_once(show: bool = True) -> Iterator[None]:
    """While the block makes envs, each distinct warning of MuJoCo's (its model compiler's: gymnasium's
    own HalfCheetah, Ant, ... XML use the deprecated `settotalmass`) is shown once in this process
    instead of once per model compiled (64 envs: 64 lines, each forwarded by Ray), or not at all
    with `show` false: a Ray runner's envs are the ones the driver already made and warned about
    (`env_dims`). MuJoCo's handler is this block's alone: the one before it is back after it, so
    warnings while stepping (a simulation going unstable) still reach MuJoCo's own."""
    previous = mujoco.get_mju_user_warning()

    def once(message: str) -> None:
        if message in _MODEL_WARNINGS_SEEN:
            return
        _MODEL_WARNINGS_SEEN.add(message)
        if show:
            sys.stderr.write(f"MuJoCo warning (shown once): {message}\n")

    mujoco.set_mju_user_warning(once)
    try:
        yield
    finally:
        mujoco.set_mju_user_warning(previous)


def grouped(env: gym.Env, spec: ExperimentSpec) -> gym.Env:
    """A Dict-observation env seen as one flat vector of the keys the spec's actor and critic read
    (`obs_groups`); any other env as it is."""
    layout = obs_layout(env.observation_space, spec.algo.actor_obs, spec.algo.critic_obs)
    return env if layout is None else GroupedObservations(env, layout)


def vector_obs_dims(envs: gym.vector.VectorEnv) -> ObsDims:
    """The observation features of a `make_vector_env` env: all, and those its actor reads."""
    first = envs.envs[0]
    while not isinstance(first, GroupedObservations) and isinstance(first, gym.Wrapper):
        first = first.env
    if isinstance(first, GroupedObservations):
        return first.layout.dims
    full = envs.single_observation_space.shape[0]
    return ObsDims(full, full)


def _made(spec: ExperimentSpec, make: Callable[[], Any], show_model_warnings: bool = True) -> Any:
    try:
        prepare(spec.env)  # a Ray worker imports the spec's modules here, the first time it makes the env
        with model_warnings_once(show_model_warnings):
            return make()
    except (EnvSourceError, BatchedEnvError) as err:  # the spec names something unusable: its own words
        raise EnvSetupError(str(err)) from err
    except (Exception, SystemExit) as err:  # gymnasium raises whatever the env constructor raises (or exits)
        # the message is for the user; the cause keeps the constructor's traceback for a developer
        kwargs = f" with kwargs {dict(spec.env.kwargs)}" if spec.env.kwargs else ""
        raise EnvSetupError(
            f"env: could not make {spec.env.id!r}{kwargs} in process {os.getpid()} on {os.uname().nodename} "
            f"(its constructor {what_user_code_did(err)}); check env.id, env.entry_point and env.kwargs."
        ) from err


def env_dims(spec: ExperimentSpec) -> tuple[ObsDims, int]:
    """(observation features, act_dim) of the spec's env: a flat Box, or a Dict of Boxes read
    through the spec's actor_obs / critic_obs; actions a flat bounded Box. Builds the env once, so
    a spec whose env cannot be made or read fails here, before any actor starts."""
    try:
        envs = make_batched_env(spec, 1) if spec.env.batched is not None else make_vector_env(spec, 1)
    except EnvSetupError as err:
        if isinstance(err.__cause__, ObsLayoutError | BatchedEnvError):  # the spec, not the env, is wrong
            raise SpecError(str(err.__cause__)) from None
        raise
    if spec.env.batched is not None:  # the adapter checked its spaces
        envs.close()
        return envs.obs_dims, envs.act_dim
    try:
        obs_space, act_space, obs = envs.single_observation_space, envs.single_action_space, vector_obs_dims(envs)
    finally:
        envs.close()
    problem = None
    if not (isinstance(obs_space, gym.spaces.Box) and len(obs_space.shape) == 1):
        problem = f"observations must be a flat Box or a Dict of flat Boxes, got {obs_space}"
    elif not (isinstance(act_space, gym.spaces.Box) and len(act_space.shape) == 1):
        problem = f"actions must be a flat continuous Box, got {act_space}"
    elif not (np.all(np.isfinite(act_space.low)) and np.all(np.isfinite(act_space.high))):
        problem = f"action bounds must be finite, got {act_space}"
    if problem:
        raise SpecError(f"env.id: {spec.env.id} cannot be used with these algorithms: {problem}.")
    return obs, act_space.shape[0]
