"""Snapshots of an env runner's vector env, for resuming a run bit-exactly.

A checkpoint is read back with `torch.load(weights_only=True)`, which refuses arbitrary Python
objects, so a snapshot is plain data: dicts, lists, numbers and tensors (`pack` turns numpy arrays
and scalars into tagged tensors, `unpack` turns them back with their dtype).

What is captured, for every env copy:
- the simple attributes (numbers, booleans, numpy arrays) of each wrapper layer and of the env
  itself: TimeLimit's elapsed steps, Pendulum's angle and speed, a reach target, ...;
- the env's random generator;
- for MuJoCo envs (an unwrapped env with `model` and `data`), the integration state
  (`mj_getState(mjSTATE_INTEGRATION)`: positions, velocities, controls, mocap poses, warm start).
An env that keeps its state elsewhere (Python objects, an external simulator) is not captured:
a run resumed on it restores policy, replay and learner, but its episodes diverge from the
uninterrupted run's.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch

_SIMPLE = (bool, int, float, np.ndarray, np.generic, type(None))


def pack(tree: Any) -> Any:
    """numpy arrays and scalars -> tagged tensors, recursively (tuples become lists)."""
    if isinstance(tree, np.ndarray | np.generic):
        array = np.asarray(tree)
        return {"__numpy__": torch.from_numpy(array.copy()), "scalar": isinstance(tree, np.generic)}
    if isinstance(tree, dict):
        return {key: pack(value) for key, value in tree.items()}
    if isinstance(tree, list | tuple):
        return [pack(item) for item in tree]
    return tree


def unpack(tree: Any) -> Any:
    if isinstance(tree, dict) and "__numpy__" in tree:
        array = tree["__numpy__"].numpy().copy()
        return array[()] if tree["scalar"] else array
    if isinstance(tree, dict):
        return {key: unpack(value) for key, value in tree.items()}
    if isinstance(tree, list):
        return [unpack(item) for item in tree]
    return tree


def _layers(env: gym.Env | gym.vector.VectorEnv) -> list[Any]:
    layers = [env]
    while hasattr(layers[-1], "env"):
        layers.append(layers[-1].env)
    return layers


def _simple_attributes(layer: Any) -> dict[str, Any]:
    return {
        name: value
        for name, value in vars(layer).items()
        if isinstance(value, _SIMPLE) and not (isinstance(value, np.ndarray) and value.dtype == object)
    }


def _env_snapshot(env: gym.Env) -> dict[str, Any]:
    base = env.unwrapped
    snapshot: dict[str, Any] = {"layers": [_simple_attributes(layer) for layer in _layers(env)]}
    if getattr(base, "_np_random", None) is not None:
        snapshot["np_random"] = base._np_random.bit_generator.state
    if _is_mujoco(base):
        import mujoco

        spec = mujoco.mjtState.mjSTATE_INTEGRATION
        state = np.empty(mujoco.mj_stateSize(base.model, spec))
        mujoco.mj_getState(base.model, base.data, state, spec)
        snapshot["mujoco"] = state
    return snapshot


def _env_restore(env: gym.Env, snapshot: dict[str, Any]) -> None:
    for layer, attributes in zip(_layers(env), snapshot["layers"], strict=True):
        present = _simple_attributes(layer)
        for name, value in attributes.items():
            if name in present:  # a checkpoint sets only the simple attributes a fresh env already has
                setattr(layer, name, value)
    base = env.unwrapped
    if "np_random" in snapshot:
        if getattr(base, "_np_random", None) is None:
            base._np_random = np.random.default_rng()
        base._np_random.bit_generator.state = snapshot["np_random"]
    if "mujoco" in snapshot:
        import mujoco

        mujoco.mj_setState(base.model, base.data, snapshot["mujoco"], mujoco.mjtState.mjSTATE_INTEGRATION)
        mujoco.mj_forward(base.model, base.data)  # derived quantities (site positions, ...) from the state


def _is_mujoco(env: Any) -> bool:
    return type(getattr(env, "model", None)).__name__ == "MjModel" and hasattr(env, "data")


def snapshot_vector_env(envs: gym.vector.SyncVectorEnv) -> dict[str, Any]:
    """The vector env's own bookkeeping (which copies reset on the next step) and every copy's state."""
    return pack({"vector": _simple_attributes(envs), "envs": [_env_snapshot(env) for env in envs.envs]})


def restore_vector_env(envs: gym.vector.SyncVectorEnv, snapshot: dict[str, Any]) -> None:
    snapshot = unpack(snapshot)
    if len(snapshot["envs"]) != len(envs.envs):
        raise ValueError(f"the snapshot holds {len(snapshot['envs'])} env copies, this runner has {len(envs.envs)}")
    present = _simple_attributes(envs)
    for name, value in snapshot["vector"].items():
        if name in present:
            setattr(envs, name, value)
    for env, env_snapshot in zip(envs.envs, snapshot["envs"], strict=True):
        _env_restore(env, env_snapshot)
