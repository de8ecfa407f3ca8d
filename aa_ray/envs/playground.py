"""MuJoCo Playground tasks (MJX on JAX) as a batched env: `env.batched: playground`.

`PlaygroundAdapter` loads a Playground task by its registry name (the spec's `env.id`, e.g.
`CartpoleBalance`) or builds one from an `env.entry_point` returning an `MjxEnv`, and steps N copies
in one jitted JAX program: the task's `step` vmapped over the copies, the time limit, and a reset
of the copies whose episode ended in that same call (same-step autoreset; the true final
observation is kept beside the fresh one). A step's observations (flat, or a Dict of groups such
as `state` / `privileged_state` laid out for the spec's actor_obs / critic_obs inside the program),
final observations, rewards and flags come back as one array that crosses to torch through DLPack
without a copy: on the CPU the tensor's data pointer is JAX's buffer (checked); a CUDA tensor of a
JAX GPU array is the same buffer by DLPack's contract (not run here: no GPU). Actions go the other
way through DLPack on a GPU; on the CPU the jitted call copies them from their numpy view, which is
cheaper than JAX's DLPack import for N x act_dim floats.

jax and mujoco_playground are imported when an adapter is made, so aa-ray imports without them
(`pip install aa-ray[playground]`). Compiling takes seconds to a minute on a CPU (CartpoleBalance on
2 cores: about 4 s for reset and 7 s for step; CheetahRun's contacts about a minute); the programs
are built once per task, options, layout and device in a process, compiled once per number of
copies, and every adapter with the same ones shares them (the time limit is an argument of the step
program, not part of it, so an eval env with another limit shares them too).
"""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from types import SimpleNamespace
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor

from aa_ray.envs.batched import BatchedEnvError, BatchedStep, _Adapter
from aa_ray.envs.source import EnvSourceError, import_object
from aa_ray.errors import what_user_code_did

INSTALL_HINT = "pip install aa-ray[playground]"
# a spec's env.kwargs key that is aa-ray's, not a Playground config entry: the spec's env.max_episode_steps
EPISODE_STEPS_KEY = "max_episode_steps"


def _import_jax() -> Any:
    """jax, set up for sharing a process with torch. BatchedEnvError with the install hint when absent."""
    # JAX takes 75% of a GPU's memory at its first use by default, which would leave a torch learner
    # on the same GPU little; allocating as needed lets both live in one process
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    # XLA:CPU's fusion emitters make compiling an MJX step take 3-4x longer (CartpoleBalance, 64 copies, 2
    # cores: 10 s against 2.4 s) and the program step no faster (108k against 97k env steps/s); read when
    # JAX starts its CPU backend, so it is too late once this process has used JAX, and left alone when
    # the user's XLA_FLAGS say anything about it
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_cpu_use_fusion_emitters" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_cpu_use_fusion_emitters=false".strip()
    try:
        import jax
        from mujoco_playground import registry  # noqa: F401  (a missing Playground is told here, with the hint)
    except ImportError as err:
        raise BatchedEnvError(
            f"env.batched: playground needs jax and mujoco_playground, which do not import here ({err}); "
            f"install them with {INSTALL_HINT}."
        ) from err
    return jax


def jax_device(device: torch.device) -> Any:
    """The JAX device that shares memory with torch's `device` (cpu, cuda:k)."""
    jax = _import_jax()
    platform = {"cpu": "cpu", "cuda": "gpu"}.get(device.type)
    if platform is None:
        raise BatchedEnvError(f"env.device: a Playground env runs on cpu or cuda, not {device}")
    try:
        devices = jax.devices(platform)
    except RuntimeError as err:
        raise BatchedEnvError(
            f"env.device: {device} asks JAX for a {platform} device and it has none ({err}); install JAX for "
            "CUDA (pip install 'jax[cuda12]') or use env.device: cpu."
        ) from err
    index = device.index or 0
    if index >= len(devices):
        raise BatchedEnvError(f"env.device: {device}, but JAX sees {len(devices)} {platform} device(s)")
    return devices[index]


@dataclass(frozen=True)
class PlaygroundTask:
    """A loaded task and what the adapter needs to know of it."""

    env: Any  # the MjxEnv
    episode_length: int | None  # the task's own time limit (its config's episode_length; None: it has none)
    action_repeat: int  # task steps per env step, rewards summed (the task's config says)
    label: str
    field: str


def load_task(target: str | Callable[..., Any], options: Mapping[str, Any], device_type: str = "cpu") -> PlaygroundTask:
    """The Playground task `target` names: a registry name with `options` as config overrides (dotted
    keys reach nested entries, e.g. `vision_config.nworld`), or a callable returning an MjxEnv called
    with `options`. On the CPU a registry task uses MJX's JAX implementation unless `impl` is given:
    Playground's default, MuJoCo Warp, steps about 40x slower on a CPU (CartpoleBalance, 64 copies:
    2.5k against 100k env steps/s) and compiled for over a minute."""
    _import_jax()
    from mujoco_playground import registry

    options = dict(options)
    if callable(target):
        label = f"{getattr(target, '__module__', '?')}:{getattr(target, '__qualname__', repr(target))}"
        env = target(**options)
        missing = [name for name in ("reset", "step", "observation_size", "action_size") if not hasattr(env, name)]
        if missing:
            raise BatchedEnvError(f"env.entry_point: {label!r} made a {type(env).__name__}, which has no "
                                  f"{', '.join(missing)}; env.batched: playground needs an MjxEnv.")
        return PlaygroundTask(env, None, 1, label, "env.entry_point")
    if target not in registry.ALL_ENVS:
        close = difflib.get_close_matches(str(target), list(registry.ALL_ENVS), n=3, cutoff=0.6)
        suggestion = f" Did you mean {', '.join(close)}?" if close else ""
        raise BatchedEnvError(f"env.id: MuJoCo Playground has no task {target!r} (mujoco_playground.registry."
                              f"ALL_ENVS lists them).{suggestion}")
    config = registry.get_default_config(target)
    config.lock()  # an unknown key is an error, not a new entry
    if "impl" not in options and "impl" in config and device_type == "cpu":
        options["impl"] = "jax"
    try:
        config.update_from_flattened_dict(options)
    except (AttributeError, KeyError, TypeError, ValueError) as err:
        raise BatchedEnvError(
            f"env.kwargs: {target!r} takes no option among {sorted(options)} ({what_user_code_did(err)}); its "
            f"config has {', '.join(sorted(config.keys()))} (mujoco_playground.registry.get_default_config)."
        ) from err
    env = registry.load(target, config=config)
    length = config.get("episode_length", None)
    return PlaygroundTask(env, None if length is None else int(length), int(config.get("action_repeat", 1)),
                          str(target), "env.id")


def observation_space(observation_size: Any) -> gym.Space:
    """One copy's observation space from a task's `observation_size` (a size, or a Dict of shapes)."""
    if isinstance(observation_size, Mapping):
        return gym.spaces.Dict({key: observation_space(size) for key, size in observation_size.items()})
    shape = (int(observation_size),) if np.ndim(observation_size) == 0 else tuple(int(n) for n in observation_size)
    return gym.spaces.Box(-np.inf, np.inf, shape=shape, dtype=np.float32)


@dataclass(frozen=True)
class Programs:
    """The jitted JAX programs of one task, for any number of copies:
    - `reset(key, num_envs)` -> (state, steps, key, obs): the batched `State`, step counters, next key,
      the observations laid out flat;
    - `step(leaves, steps, key, action, limit, structure)` -> (leaves, steps, key, packed, info): the
      State travels as its list of arrays (`structure`, its treedef, rebuilds it inside the program),
      because flattening MJX's dataclasses in Python on every call cost more than a 64-copy step of
      CartpoleBalance; `packed` holds each copy's row [obs | next_obs | reward | terminated |
      truncated] (float32), one array to hand to torch instead of five."""

    reset: Callable[..., Any]
    step: Callable[..., Any]


def packed_columns(features: int) -> dict[str, slice | int]:
    """Where each output sits in a row of the step program's packed array."""
    return {"obs": slice(0, features), "next_obs": slice(features, 2 * features), "reward": 2 * features,
            "terminated": 2 * features + 1, "truncated": 2 * features + 2}


def build_programs(task: PlaygroundTask, layout_keys: tuple[str, ...] | None) -> Programs:
    """Reset and step of all copies, with the time limit (`limit`, a step count) and same-step
    autoreset, as jitted programs (`Programs`).

    A step's outputs: the observations to act on (fresh starts where an episode ended), this step's
    true next observations (the final ones there), rewards, terminated, truncated, and every value
    the task reports per copy in its `metrics` and `info` (metrics win a key in both), as float32."""
    jax = _import_jax()
    import jax.numpy as jnp

    env = task.env
    batched_reset, batched_step = jax.vmap(env.reset), jax.vmap(env.step)

    def flat(obs: Any) -> Any:
        if layout_keys is None:
            return obs.astype(jnp.float32)
        return jnp.concatenate([obs[key].astype(jnp.float32) for key in layout_keys], axis=-1)

    def reset(key: Any, num_envs: int) -> tuple[Any, ...]:
        key, starts = jax.random.split(key)
        state = batched_reset(jax.random.split(starts, num_envs))
        return state, jnp.zeros(num_envs, dtype=jnp.int32), key, flat(state.obs)

    def step(leaves: list[Any], steps: Any, key: Any, action: Any, limit: Any, structure: Any) -> tuple[Any, ...]:
        state = jax.tree.unflatten(structure, leaves)
        num_envs = steps.shape[0]
        action = jnp.clip(action, -1.0, 1.0)
        stepped = batched_step(state, action)
        reward = stepped.reward
        for _ in range(task.action_repeat - 1):
            stepped = batched_step(stepped, action)
            reward = reward + stepped.reward
        steps = steps + 1
        terminated = stepped.done > 0
        truncated = steps >= limit  # as gymnasium's TimeLimit: set even where it also terminated
        done = terminated | truncated
        key, starts = jax.random.split(key)

        def restart(running: Any) -> Any:
            fresh = batched_reset(jax.random.split(starts, num_envs))

            def where_done(new: Any, old: Any) -> Any:
                return jnp.where(done.reshape((num_envs,) + (1,) * (old.ndim - 1)), new, old)

            return jax.tree.map(where_done, fresh, running)

        # resets cost a whole forward pass of every copy: only when some copy needs one
        next_state = jax.lax.cond(jnp.any(done), restart, lambda running: running, stepped)
        info = {}
        for source in (stepped.info, stepped.metrics):  # metrics last: they win a key in both
            for name, value in (source.items() if isinstance(source, Mapping) else ()):
                if getattr(value, "shape", None) == (num_envs,) and jnp.issubdtype(value.dtype, jnp.number):
                    info[name] = value.astype(jnp.float32)
        columns = [reward, terminated, truncated]
        packed = jnp.concatenate([flat(next_state.obs), flat(stepped.obs),
                                  jnp.stack([c.astype(jnp.float32) for c in columns], axis=-1)], axis=-1)
        return jax.tree.leaves(next_state), jnp.where(done, 0, steps), key, packed, info

    return Programs(reset=jax.jit(reset, static_argnums=1), step=jax.jit(step, static_argnums=5))


@lru_cache(maxsize=8)
def shared_task(target: str | Callable[..., Any], options_json: str, device_type: str) -> PlaygroundTask:
    """One loaded task per process for the same target, options and kind of device."""
    return load_task(target, json.loads(options_json), device_type)


@lru_cache(maxsize=8)
def shared_programs(target: str | Callable[..., Any], options_json: str, device_type: str,
                    layout_keys: tuple[str, ...] | None) -> Programs:
    """One set of programs per process for the same task and layout: an eval env and a restarted
    runner reuse the compiled programs instead of compiling them again (JAX keeps compilations per
    jitted function and argument shapes, and a new task object would be a new function)."""
    return build_programs(shared_task(target, options_json, device_type), layout_keys)


def make_playground_env(target: str | Callable[..., Any], num_envs: int, device: str | torch.device = "cpu", *,
                        actor_obs: Sequence[str] | None = None, critic_obs: Sequence[str] | None = None,
                        info_metrics: Sequence[str] = (), **kwargs: Any) -> PlaygroundAdapter:
    """`batched.make_batched_env`'s signature for `env.batched: playground` (aa_ray.envs.make calls it:
    batched.py cannot import this module, which builds on it): `target` a Playground task name, or a
    callable (or `module:attr` path) returning an MjxEnv; `kwargs` the task's config overrides."""
    if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
        raise BatchedEnvError(f"the number of batched envs must be a positive integer, got {num_envs!r}")
    if isinstance(target, str) and ":" in target:
        try:
            target = import_object(target, "env.entry_point", SimpleNamespace(py_modules=()),
                                   "function returning an MjxEnv (e.g. mypkg.tasks:make_task)")
        except EnvSourceError as err:
            raise BatchedEnvError(str(err)) from err
    return PlaygroundAdapter(target, num_envs, device, playground_options=kwargs, actor_obs=actor_obs,
                             critic_obs=critic_obs, info_metrics=info_metrics)


class PlaygroundAdapter(_Adapter):
    """A MuJoCo Playground task (`pip install aa-ray[playground]`) as a `BatchedEnv`.

    - `reset(seed)`: a JAX PRNG key from `seed`, split into one start per copy, so a seed always
      gives the same starts; the key then drives every later reset.
    - `step`: actions (N, act_dim) in [-1, 1] (Playground's bounds, clipped to them); every row is a
      real transition (`valid` all True), `next_obs` the final observation where an episode ended and
      `obs` the fresh start there; episodes truncate at `max_episode_steps` (the spec's
      `env.max_episode_steps`, else the task's `episode_length`). A task's own `done` (e.g. a NaN
      state) is `terminated`.
    - `episode_info`: the tracked info keys (`eval.info_metrics`, e.g. `reward/upright`) the task
      reports per copy in its `metrics` or `info`, at the rows that ended.
    - `state()`: the whole JAX state (the batched `State`, step counters, PRNG key) as CPU tensors
      (a checkpoint loads them with weights_only=True), so a resumed run steps on exactly as the
      uninterrupted one would."""

    def __init__(self, target: str | Callable[..., Any], num_envs: int, device: str | torch.device = "cpu", *,
                 playground_options: Mapping[str, Any] | None = None, actor_obs: Sequence[str] | None = None,
                 critic_obs: Sequence[str] | None = None, info_metrics: Sequence[str] = ()):
        self.jax = _import_jax()
        device = torch.device(device)
        self.jax_device = jax_device(device)
        options = dict(playground_options or {})
        max_episode_steps = options.pop(EPISODE_STEPS_KEY, None)
        try:
            options_json = json.dumps(options, sort_keys=True)
        except TypeError as err:
            raise BatchedEnvError(f"env.kwargs: a Playground task's options must be plain data ({err})") from err
        self.task = shared_task(target, options_json, device.type)
        action_space = gym.spaces.Box(-1.0, 1.0, shape=(int(self.task.env.action_size),), dtype=np.float32)
        super().__init__(SimpleNamespace(metadata={}), num_envs=num_envs, device=device,
                         observation_space=observation_space(self.task.env.observation_size),
                         action_space=action_space, actor_obs=actor_obs, critic_obs=critic_obs,
                         info_metrics=info_metrics, label=self.task.label, field=self.task.field)
        layout_keys = self.layout.keys if self.layout is not None else None
        self.programs = shared_programs(target, options_json, device.type, layout_keys)
        episode_steps = max_episode_steps if max_episode_steps is not None else self.task.episode_length
        if episode_steps is None or int(episode_steps) < 1:
            raise BatchedEnvError(f"env.max_episode_steps: set it (a positive step count) for {self.label!r}: its "
                                  "task has no episode_length of its own to truncate episodes at.")
        self.episode_steps = int(episode_steps)
        self._limit = self.jax.device_put(np.int32(self.episode_steps), self.jax_device)
        self._all_valid = torch.ones(num_envs, dtype=torch.bool, device=device)
        self._columns = packed_columns(self.obs_dims.full)
        # after the first reset: the batched State as its arrays and treedef, the step counters, the PRNG key
        self._leaves: list[Any] | None = None
        self._structure: Any = None
        self._steps: Any = None
        self._key: Any = None

    def reset(self, seed: int) -> Tensor:
        # the key PRNGKey(seed) makes with 64-bit JAX: without x64 (JAX's default) it would keep the seed's low
        # 32 bits only, and aa-ray's seeds are 64-bit words
        seed = int(seed) % 2**64
        key = self.jax.device_put(np.array([seed >> 32, seed & 0xFFFFFFFF], dtype=np.uint32), self.jax_device)
        state, self._steps, self._key, obs = self.programs.reset(key, self.num_envs)
        self._leaves, self._structure = self.jax.tree.flatten(state)
        return self._torch(obs, "observations", self.obs_dims.full)

    def step(self, action: Tensor) -> BatchedStep:
        if self._leaves is None:
            raise RuntimeError(f"{self.label!r}: step before reset")
        self._check_rows("actions", tuple(action.shape), self.act_dim)
        action = action.detach().to(self.device, torch.float32)
        # on the CPU the program takes the numpy view itself and copies the N x act_dim floats: JAX's DLPack
        # import (~130 us a call) and device_put (~200 us) cost more than that; on a GPU the actions stay put
        on_cpu = self.device.type == "cpu"
        jax_action = action.numpy() if on_cpu else self.jax.dlpack.from_dlpack(action.contiguous())
        self._leaves, self._steps, self._key, packed, info = self.programs.step(
            self._leaves, self._steps, self._key, jax_action, self._limit, self._structure)
        rows = self._torch(packed, "steps", 2 * self.obs_dims.full + 3)
        columns = self._columns
        terminated, truncated = rows[:, columns["terminated"]] > 0.5, rows[:, columns["truncated"]] > 0.5
        done = terminated | truncated
        return BatchedStep(
            obs=rows[:, columns["obs"]], next_obs=rows[:, columns["next_obs"]], reward=rows[:, columns["reward"]],
            terminated=terminated, truncated=truncated, valid=self._all_valid,
            episode_info={key: (self._torch(info[key]), done) for key in self.info_keys if key in info},
        )

    def state(self) -> dict[str, Any] | None:
        if self._leaves is None:
            return None
        return {"task": self.label, "num_envs": self.num_envs, "leaves": [_host_tensor(leaf) for leaf in self._leaves],
                "steps": _host_tensor(self._steps), "key": _host_tensor(self._key)}

    def load_state(self, state: dict[str, Any]) -> None:
        if self._leaves is None:  # the structure to fill comes from a reset's
            self.reset(0)
        saved = state["leaves"]
        if (state.get("task") != self.label or state.get("num_envs") != self.num_envs
                or len(saved) != len(self._leaves)):
            raise ValueError(
                f"a Playground state of {state.get('task')!r} with {state.get('num_envs')} envs cannot be loaded "
                f"into {self.label!r} with {self.num_envs}; resume with the same task and number of envs"
            )
        self._leaves = [self._jax_array(value, now) for value, now in zip(saved, self._leaves, strict=True)]
        self._steps = self._jax_array(state["steps"], self._steps)
        self._key = self._jax_array(state["key"], self._key)

    def close(self) -> None:
        self._leaves = self._structure = self._steps = self._key = None

    def _jax_array(self, saved: Any, like: Any) -> Any:
        array = saved.numpy() if isinstance(saved, Tensor) else np.asarray(saved)
        if array.shape != like.shape or array.dtype != like.dtype:
            raise ValueError(f"{self.label!r}: a saved state array is {array.dtype}{array.shape}, this env's "
                             f"{like.dtype}{like.shape}; was it saved by another version of the task?")
        return self.jax.device_put(array, self.jax_device)

    def _torch(self, array: Any, what: str | None = None, features: int | None = None) -> Tensor:
        """A JAX array as a torch tensor on the adapter's device, sharing its buffer (DLPack)."""
        tensor = torch.from_dlpack(array)
        if what is not None:
            self._check_rows(what, tuple(tensor.shape), features)
        return tensor


def _host_tensor(array: Any) -> Tensor:
    """A copy of a JAX array as a CPU tensor (a checkpoint's torch.load with weights_only=True refuses numpy)."""
    return torch.from_numpy(np.array(array))
