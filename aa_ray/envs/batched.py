"""Batched envs: one object that steps N copies of a task in one call.

Isaac Lab, mjlab, MuJoCo Playground, EnvPool and gymnasium's own `vector_entry_point` envs all hand
a trainer such an object; each has its own conventions (numpy or torch, which device, how it
resets a finished copy, where the final observation of an episode goes, observation groups).
`BatchedEnv` is the one shape the runtime sees; `make_batched_env` builds it from the spec and
adapts whatever the user's code returned.

The contract, whatever the source:
- torch tensors on `device`, float32 observations (N, obs.full) laid out as `ObsDims` says (a Dict
  of groups is flattened the way `obs_groups` flattens one: the actor's keys first);
- actions in the env's own bounds (`action_low`, `action_high`), (N, act_dim) on `device`;
- each row of a `BatchedStep` is one copy's step: `obs` is what to act on next, `next_obs` the true
  next observation of this step (the final one where an episode ended), and `valid` marks the rows
  that are real transitions. A source that resets a finished copy inside the step that ended it
  (same-step autoreset: Isaac Lab, mjlab, PointReach, gymnasium's SAME_STEP) has every row valid
  and `obs` already the fresh start where an episode ended. A source that resets it on the next
  call instead (gymnasium's NEXT_STEP, EnvPool) gives the final observation as `obs` where an
  episode ended, and the next call's row for that copy is the reset: `valid` False, reward 0, not
  done. A source that cannot say what a truncated episode's final observation was has those rows
  `valid` False rather than storing a wrong one (a terminated row needs none: its next value is
  never used, and `next_obs` holds the reset observation there);
- `episode_info`: the tracked info keys' values at each finished episode's last step;
- `state()` is the env's whole state where it can give one (PointReach can), else None: a resume
  then restarts episodes, and the checkpoint says so.
- Tensors handed out are read-only: `obs` and `next_obs` may be the same tensor, or views of the
  env's own observation tensors (no copy where its groups already lie side by side), so an env must
  not write an observation it returned in place later (Isaac Lab's and PointReach's make new ones
  each step).

Sources (`make_batched_env(source, ...)`, the spec's `env.batched`):
- `torch`: an object in the Isaac Lab / mjlab shape (`TorchBatchedAdapter`);
- `gymnasium`: any `gymnasium.vector.VectorEnv` with numpy arrays, in any of gymnasium 1.x's three
  autoreset modes (`VectorEnvAdapter`);
- `envpool`: EnvPool's C++ batched tasks, an optional extra (`EnvPoolAdapter`);
- `playground`: MuJoCo Playground's MJX tasks on JAX, an optional extra: `aa_ray.envs.playground`
  (`PlaygroundAdapter`, `make_playground_env`), which builds on this module, so `make_batched_env`
  here refuses the name and `aa_ray.envs.make` routes it there;
- `unilab`: UniLab's robot tasks on its CPU-batched MuJoCo, an optional extra: `aa_ray.envs.unilab`
  (`UniLabAdapter`, `make_unilab_env`), routed there the same way.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Protocol, runtime_checkable

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode
from torch import Tensor

from aa_ray.envs.info_metrics import SUCCESS_KEY, declared_info_metrics
from aa_ray.envs.obs_groups import ObsLayout, ObsLayoutError, obs_layout
from aa_ray.envs.source import OWN_TASK_SOURCES, EnvSourceError, import_object
from aa_ray.errors import SpecError, what_user_code_did
from aa_ray.metric_names import REWARD_TERM
from aa_ray.records import ObsDims

SOURCES = ("torch", "gymnasium", *OWN_TASK_SOURCES)
# the final observation in a same-step source's extras: ours and Isaac Lab-style envs' name, ManiSkill's name
FINAL_OBS_KEYS = ("final_obs", "final_observation")
FINAL_INFO_KEY = "final_info"


class BatchedEnvError(SpecError):
    """A batched env source that cannot be used as the spec names it; the message names the spec field
    (`env.batched`, `env.entry_point`, `env.id`, `env.kwargs`) and says what to change."""


@dataclass(frozen=True)
class BatchedStep:
    """One call's result for all N copies."""

    obs: Tensor  # (N, features): what the policy acts on next (a fresh reset where a same-step source's episode ended)
    next_obs: Tensor  # (N, features): this step's true next observation (the final one where done)
    reward: Tensor  # (N,) float32
    terminated: Tensor  # (N,) bool
    truncated: Tensor  # (N,) bool
    valid: Tensor  # (N,) bool: rows that are real transitions
    # the tracked info keys' values at each finished episode's last step: key -> ((N,) values, (N,) bool mask)
    episode_info: dict[str, tuple[Tensor, Tensor]] = field(default_factory=dict)


@runtime_checkable
class BatchedEnv(Protocol):
    """What the runtime asks of a batched env (see the module's docstring)."""

    num_envs: int
    device: torch.device
    obs_dims: ObsDims
    act_dim: int
    action_low: Tensor  # (act_dim,) on device
    action_high: Tensor
    metadata: dict[str, Any]  # the env's declared metadata (`info_metrics`, `mirror`, ...), {} if none
    info_keys: tuple[str, ...]  # the info keys read into `BatchedStep.episode_info`

    def reset(self, seed: int) -> Tensor:
        """Reset every copy (copy i from a stream derived from `seed`); returns obs (N, features)."""
        ...

    def step(self, action: Tensor) -> BatchedStep: ...

    def state(self) -> dict[str, Any] | None:
        """Everything the next `step` depends on, as plain data (tensors, arrays), or None where the
        source cannot give it."""
        ...

    def load_state(self, state: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def make_batched_env(source: str, target: str | Callable[..., Any], num_envs: int, device: str | torch.device = "cpu",
                     *, actor_obs: Sequence[str] | None = None, critic_obs: Sequence[str] | None = None,
                     info_metrics: Sequence[str] = (), **kwargs: Any) -> BatchedEnv:
    """N copies of a task from `source` (the spec's `env.batched`), adapted to `BatchedEnv`.

    - `torch`: `target` is the class or function (or its `module:attr` path, the spec's
      `env.entry_point`) called as `target(num_envs=N, device=device, **kwargs)`;
    - `gymnasium`: `target` is a gymnasium id (or EnvSpec) with a `vector_entry_point`, made with
      `gym.make_vec(target, N, vectorization_mode="vector_entry_point", **kwargs)`, or a callable
      returning a `VectorEnv`, called as `target(num_envs=N, **kwargs)`; its arrays become tensors
      on `device`;
    - `envpool`: `target` is the task id (gymnasium's MuJoCo ids are EnvPool's: `HalfCheetah-v5`),
      `kwargs` EnvPool's own options (`num_threads`, `max_episode_steps`, ...);
    - `playground`: refused here; `aa_ray.envs.playground.make_playground_env` takes the same arguments.

    `actor_obs` / `critic_obs` (the spec's `algo.actor_obs` / `algo.critic_obs`) lay a Dict of
    observation groups out as `obs_groups.obs_layout` does. `info_metrics` (the spec's
    `eval.info_metrics`) are info keys tracked at episode ends besides `is_success` and the env's
    declared `metadata["info_metrics"]`. The seed is not an argument: `reset(seed)` takes it.
    BatchedEnvError (a SpecError) naming the spec field for a source or env that cannot be used; an
    exception raised by the user's constructor propagates as it is."""
    options = {"actor_obs": actor_obs, "critic_obs": critic_obs, "info_metrics": tuple(info_metrics)}
    if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
        raise BatchedEnvError(f"the number of batched envs must be a positive integer, got {num_envs!r}")
    if source == "torch":
        factory = _entry_point(target)
        env = factory(num_envs=num_envs, device=device, **kwargs)
        return TorchBatchedAdapter(env, expected_envs=num_envs, label=_label(target), **options)
    if source == "gymnasium":
        label = _label(target)
        if callable(target):
            envs = target(num_envs=num_envs, **kwargs)
        else:
            try:
                envs = gym.make_vec(target, num_envs=num_envs, vectorization_mode="vector_entry_point", **kwargs)
            except gym.error.Error as err:  # no vector_entry_point, unknown id, ...: gymnasium's words
                raise BatchedEnvError(
                    f"env.id: gymnasium could not make {label!r} as a batched env ({err}); env.batched: gymnasium "
                    "needs an id registered with a vector_entry_point, or an env.entry_point that returns a "
                    "gymnasium VectorEnv (leave env.batched out to step copies of a single env)."
                ) from err
        return VectorEnvAdapter(envs, device, expected_envs=num_envs, label=label,
                                field="env.entry_point" if callable(target) else "env.id", **options)
    if source == "envpool":
        if not isinstance(target, str):
            raise BatchedEnvError(f"env.batched: envpool takes a task id in env.id (e.g. HalfCheetah-v5), got "
                                  f"{_label(target)!r}")
        return EnvPoolAdapter(target, num_envs, device, envpool_options=kwargs, **options)
    if source in ("playground", "unilab"):
        raise BatchedEnvError(
            f"env.batched: {source} tasks are made by aa_ray.envs.{source}.make_{source}_env, which takes "
            f"the same arguments (a spec's env.batched: {source} goes there through aa_ray.envs.make)"
        )
    raise BatchedEnvError(f"env.batched: unknown source {source!r}; choose one of {', '.join(SOURCES)}.")


class _Adapter:
    """What every adapter shares: dims, action bounds, metadata, the observation layout and the info
    keys, checked once when it is built."""

    def __init__(self, env: Any, *, num_envs: int, device: torch.device, observation_space: Any, action_space: Any,
                 actor_obs: Sequence[str] | None,
                 critic_obs: Sequence[str] | None, info_metrics: Sequence[str], label: str, field: str):
        self.num_envs = num_envs
        self.device = device
        self.label, self.field = label, field
        self.metadata = dict(getattr(env, "metadata", None) or {})
        if isinstance(observation_space, Mapping):  # a plain dict of spaces
            observation_space = gym.spaces.Dict(dict(observation_space))
        try:
            self.layout: ObsLayout | None = obs_layout(observation_space, actor_obs, critic_obs)
        except ObsLayoutError as err:
            raise BatchedEnvError(f"{err} (env {label!r})") from err
        if self.layout is not None:
            self.obs_dims = self.layout.dims
        elif isinstance(observation_space, gym.spaces.Box) and len(observation_space.shape) == 1:
            self.obs_dims = ObsDims(observation_space.shape[0], observation_space.shape[0])
        else:
            raise BatchedEnvError(
                f"{field}: {label!r} has observations {observation_space}; a batched env's observations (one "
                "copy's) must be a flat Box or a Dict of flat Boxes."
            )
        if not (isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1):
            raise BatchedEnvError(f"{field}: {label!r} has actions {action_space}; the algorithms need a flat "
                                  "continuous Box (one copy's).")
        if not (np.all(np.isfinite(action_space.low)) and np.all(np.isfinite(action_space.high))):
            raise BatchedEnvError(
                f"{field}: {label!r} has unbounded actions {action_space}; the algorithms squash actions into the "
                "env's bounds, so declare finite ones (for an Isaac Lab task, wrap it so that its "
                "single_action_space is Box(-1, 1) and it clips, as FastTD3's wrapper does)."
            )
        self.act_dim = action_space.shape[0]
        self.action_low = torch.as_tensor(action_space.low, dtype=torch.float32, device=device)
        self.action_high = torch.as_tensor(action_space.high, dtype=torch.float32, device=device)
        try:
            declared = declared_info_metrics(env)
        except ValueError as err:
            raise BatchedEnvError(f"{field}: {label!r}: {err}") from err
        self.info_keys = tuple(dict.fromkeys([SUCCESS_KEY, *declared, *info_metrics]))

    def _check_rows(self, what: str, shape: tuple[int, ...], features: int | None = None) -> None:
        expected = (self.num_envs,) if features is None else (self.num_envs, features)
        if tuple(shape) != expected:
            raise ValueError(f"{self.label!r} returned {what} of shape {tuple(shape)}, expected {expected} "
                             f"({self.num_envs} envs)")


class TorchBatchedAdapter(_Adapter):
    """An env in the Isaac Lab / mjlab shape: `num_envs`, `device`, `reset(seed=...)` and
    `step(actions)` on torch tensors returning `(obs, reward, terminated, truncated, extras)`, obs a
    Dict of groups (or one tensor), finished copies reset inside `step`. One copy's spaces come from
    `single_observation_space` / `single_action_space` where the env has them (Isaac Lab), else
    `observation_space` / `action_space` (batched ones, leading dim N, are read per copy).

    The final observation of the copies that ended is read from `extras["final_obs"]` (or
    `"final_observation"`), the groups of all N rows; an env that gives none (Isaac Lab) has its
    truncated rows invalid. Info keys are read at the rows that ended from `extras["final_info"]`
    where the env gives one, else from `extras` itself, as (N,) tensors. `state()` is the env's
    `state_dict()` (or `get_state()`) where it has one."""

    def __init__(self, env: Any, *, expected_envs: int | None = None, actor_obs: Sequence[str] | None = None,
                 critic_obs: Sequence[str] | None = None, info_metrics: Sequence[str] = (), label: str | None = None):
        label = label or type(env).__name__
        missing = [name for name in ("num_envs", "device", "reset", "step") if not hasattr(env, name)]
        if missing:
            raise BatchedEnvError(
                f"env.entry_point: {label!r} made a {type(env).__name__}, which has no {', '.join(missing)}; "
                "env.batched: torch needs an object with num_envs, device, reset(seed=...) and step(actions) "
                "on torch tensors (the Isaac Lab / mjlab shape)."
            )
        num_envs = int(env.num_envs)
        if expected_envs is not None and num_envs != expected_envs:
            raise BatchedEnvError(f"env.entry_point: {label!r} was asked for {expected_envs} envs and made "
                                  f"{num_envs}; it must honour its num_envs argument.")
        observation_space = _one_copy(_space(env, "observation_space"), num_envs)
        action_space = _one_copy(_space(env, "action_space"), num_envs)
        super().__init__(env, num_envs=num_envs, device=torch.device(env.device), observation_space=observation_space,
                         action_space=action_space, actor_obs=actor_obs,
                         critic_obs=critic_obs, info_metrics=info_metrics, label=label, field="env.entry_point")
        self.env = env
        self._all_valid = torch.ones(num_envs, dtype=torch.bool, device=self.device)

    def reset(self, seed: int) -> Tensor:
        result = self.env.reset(seed=seed)
        return self._flat(result[0] if isinstance(result, tuple) else result, "observations")

    def step(self, action: Tensor) -> BatchedStep:
        obs, reward, terminated, truncated, extras = self.env.step(action.to(self.device))
        extras = extras if isinstance(extras, Mapping) else {}
        obs = self._flat(obs, "observations")
        terminated, truncated = terminated.reshape(-1).bool(), truncated.reshape(-1).bool()
        done = terminated | truncated
        final_obs = next((extras[key] for key in FINAL_OBS_KEYS if extras.get(key) is not None), None)
        if final_obs is not None:
            next_obs = torch.where(done.unsqueeze(-1), self._flat(final_obs, "extras['final_obs']"), obs)
            valid = self._all_valid
        else:  # the final observation is lost where an episode was cut short: those rows are no transitions
            next_obs, valid = obs, ~truncated
        final_info = extras.get(FINAL_INFO_KEY)
        info_source = final_info if isinstance(final_info, Mapping) else extras
        return BatchedStep(obs=obs, next_obs=next_obs, reward=reward.reshape(-1).to(torch.float32),
                           terminated=terminated, truncated=truncated, valid=valid,
                           episode_info=self._episode_info(info_source, done))

    def state(self) -> dict[str, Any] | None:
        if hasattr(self.env, "state_dict") and hasattr(self.env, "load_state_dict"):
            return {"env": self.env.state_dict()}
        if hasattr(self.env, "get_state") and hasattr(self.env, "set_state"):
            return {"env": self.env.get_state()}
        return None

    def load_state(self, state: dict[str, Any]) -> None:
        if hasattr(self.env, "load_state_dict"):
            self.env.load_state_dict(state["env"])
        elif hasattr(self.env, "set_state"):
            self.env.set_state(state["env"])
        else:
            raise ValueError(f"{self.label!r} has no load_state_dict or set_state: its state cannot be restored")

    def close(self) -> None:
        if hasattr(self.env, "close"):
            self.env.close()

    def _flat(self, obs: Any, what: str) -> Tensor:
        if self.layout is not None:
            if not isinstance(obs, Mapping):
                raise ValueError(f"{self.label!r} returned {what} as a {type(obs).__name__}, but its observation "
                                 f"space is a Dict of {', '.join(self.layout.keys)}")
            groups = [obs[key].to(torch.float32) for key in self.layout.keys]
            flat = _side_by_side(groups)
            if flat is None:
                flat = torch.cat(groups, dim=-1)
        else:
            flat = obs.to(torch.float32)
        self._check_rows(what, flat.shape, self.obs_dims.full)
        return flat

    def _episode_info(self, source: Mapping[str, Any], done: Tensor) -> dict[str, tuple[Tensor, Tensor]]:
        info = {}
        for key in self.info_keys:
            value = source.get(key)
            if value is None:
                continue
            if not isinstance(value, Tensor) or value.shape != (self.num_envs,):
                raise ValueError(
                    f"{self.label!r}: info key {key!r} must be a tensor of shape ({self.num_envs},) at every step, got "
                    f"{type(value).__name__} {tuple(getattr(value, 'shape', ()))}; list only per-env numeric keys in "
                    "eval.info_metrics and the env's metadata['info_metrics']"
                )
            info[key] = (value.to(torch.float32), done)
        return info


class VectorEnvAdapter(_Adapter):
    """A `gymnasium.vector.VectorEnv` with numpy arrays, in its autoreset mode
    (`metadata["autoreset_mode"]`, NEXT_STEP when absent, gymnasium's default):
    - NEXT_STEP: the env resets a finished copy on the next call; that call's row is not a transition
      (`valid` False);
    - SAME_STEP: the final observation comes from `info["final_obs"]` and the final info from
      `info["final_info"]`;
    - DISABLED: the adapter resets the finished copies itself, `reset(options={"reset_mask": done})`,
      so the step it returns is a same-step one.
    Dict observations are flattened through the layout; arrays become tensors with
    `torch.from_numpy` (a copy only to convert float64 to float32, or to gather Dict groups) and
    move to `device` (none on CPU). `state()` is None: the copies' state is not captured yet.

    `reward_terms` (term -> info key, a NEXT_STEP or DISABLED source's: EnvPool's robot tasks) are
    summed over each episode's transitions and reported at its end as `reward/<term>`."""

    def __init__(self, envs: Any, device: str | torch.device = "cpu", *, expected_envs: int | None = None,
                 actor_obs: Sequence[str] | None = None, critic_obs: Sequence[str] | None = None,
                 info_metrics: Sequence[str] = (), label: str | None = None, field: str = "env.entry_point",
                 reward_terms: Mapping[str, str] | None = None):
        label = label or type(envs).__name__
        missing = [name for name in ("num_envs", "reset", "step", "single_observation_space", "single_action_space")
                   if not hasattr(envs, name)]
        if missing:
            raise BatchedEnvError(
                f"{field}: {label!r} made a {type(envs).__name__}, which has no {', '.join(missing)}; "
                "env.batched: gymnasium needs a gymnasium VectorEnv."
            )
        num_envs = int(envs.num_envs)
        if expected_envs is not None and num_envs != expected_envs:
            raise BatchedEnvError(f"{field}: {label!r} was asked for {expected_envs} envs and made {num_envs}; it "
                                  "must honour its num_envs argument.")
        super().__init__(envs, num_envs=num_envs, device=torch.device(device),
                         observation_space=envs.single_observation_space, action_space=envs.single_action_space,
                         actor_obs=actor_obs, critic_obs=critic_obs, info_metrics=info_metrics,
                         label=label, field=field)
        try:
            self.autoreset_mode = AutoresetMode(self.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP))
        except ValueError:
            raise BatchedEnvError(
                f"{field}: {label!r} declares autoreset_mode {self.metadata.get('autoreset_mode')!r}; gymnasium knows "
                f"{', '.join(mode.value for mode in AutoresetMode)}."
            ) from None
        self.envs = envs
        self._resetting = np.zeros(num_envs, dtype=bool)  # NEXT_STEP: copies the env resets on the next call
        self._all_valid = torch.ones(num_envs, dtype=torch.bool, device=self.device)
        self.reward_terms = dict(reward_terms or {})
        if self.reward_terms and self.autoreset_mode == AutoresetMode.SAME_STEP:
            raise BatchedEnvError(f"{field}: {label!r}: reward terms are summed from a NEXT_STEP or DISABLED source's "
                                  "info, and this one resets in the same step")
        self.info_keys += tuple(REWARD_TERM + term for term in self.reward_terms)
        self._term_sums = np.zeros((len(self.reward_terms), num_envs))

    def reset(self, seed: int) -> Tensor:
        obs, _ = self.envs.reset(seed=seed)
        self._resetting[:] = False
        self._term_sums[:] = 0.0
        return self._tensor(self._flat(obs, "observations"))

    def step(self, action: Tensor) -> BatchedStep:
        obs, reward, terminated, truncated, info = self.envs.step(action.detach().to("cpu").numpy())
        terminated = np.asarray(terminated, dtype=bool)
        truncated = np.asarray(truncated, dtype=bool)
        self._check_rows("rewards", np.shape(reward))
        done = terminated | truncated
        flat = self._flat(obs, "observations")
        next_flat = flat
        valid = self._all_valid
        final_info = info
        transitions = None  # the rows that are real transitions, where some are not
        if self.autoreset_mode == AutoresetMode.NEXT_STEP:
            transitions = ~self._resetting
            valid = self._tensor(transitions)
            done = done & ~self._resetting
            self._resetting = done
        elif self.autoreset_mode == AutoresetMode.SAME_STEP:
            ended = np.flatnonzero(done)
            if len(ended):
                next_flat = flat.copy()
                next_flat[ended] = self._flat_rows([info["final_obs"][i] for i in ended])
            final_info = info.get(FINAL_INFO_KEY, {})
        elif done.any():  # DISABLED: the finished copies wait for our reset
            reset_obs, _ = self.envs.reset(options={"reset_mask": done})
            next_flat = flat
            flat = flat.copy()
            flat[done] = self._flat(reset_obs, "observations after a reset")[done]
        obs_tensor = self._tensor(flat)
        episode_info = self._episode_info(final_info, done)
        if self.reward_terms:
            episode_info |= self._reward_term_sums(info, transitions, done)
        return BatchedStep(obs=obs_tensor, next_obs=obs_tensor if next_flat is flat else self._tensor(next_flat),
                           reward=self._tensor(np.asarray(reward, dtype=np.float32)),
                           terminated=self._tensor(terminated), truncated=self._tensor(truncated), valid=valid,
                           episode_info=episode_info)

    def _reward_term_sums(self, info: Mapping[str, Any], transitions: np.ndarray | None,
                          done: np.ndarray) -> dict[str, tuple[Tensor, Tensor]]:
        """Each reward term added up over the episodes' transitions; at the rows that ended, the sums
        as `reward/<term>`, which then start again."""
        try:
            values = np.stack([np.asarray(info[key], dtype=np.float64).reshape(self.num_envs)
                               for key in self.reward_terms.values()])
        except (KeyError, ValueError) as err:
            raise ValueError(f"{self.label!r}: its info lacks a reward term of one number per env ({err}); "
                             f"expected {', '.join(self.reward_terms.values())}") from None
        self._term_sums += values if transitions is None else values * transitions
        ended, sums = self._tensor(done), self._tensor(self._term_sums.astype(np.float32))  # one tensor, a row a term
        self._term_sums[:, done] = 0.0
        return {REWARD_TERM + term: (sums[t], ended) for t, term in enumerate(self.reward_terms)}

    def state(self) -> dict[str, Any] | None:
        return None

    def load_state(self, state: dict[str, Any]) -> None:
        raise ValueError(f"{self.label!r}: a gymnasium vector env's state is not captured, so none can be loaded")

    def close(self) -> None:
        self.envs.close()

    def _tensor(self, array: np.ndarray) -> Tensor:
        return torch.from_numpy(array).to(self.device)

    def _flat(self, obs: Any, what: str) -> np.ndarray:
        if self.layout is not None:
            if not isinstance(obs, Mapping):
                raise ValueError(f"{self.label!r} returned {what} as a {type(obs).__name__}, but its observation "
                                 f"space is a Dict of {', '.join(self.layout.keys)}")
            flat = self.layout.flatten(obs)
        else:
            flat = np.asarray(obs, dtype=np.float32)
        self._check_rows(what, flat.shape, self.obs_dims.full)
        return flat

    def _flat_rows(self, rows: list[Any]) -> np.ndarray:
        """Single copies' observations (what `final_obs` holds) as (rows, features)."""
        if self.layout is not None:
            return np.stack([self.layout.flatten(row) for row in rows])
        return np.stack([np.asarray(row, dtype=np.float32) for row in rows])

    def _episode_info(self, source: Mapping[str, Any], done: np.ndarray) -> dict[str, tuple[Tensor, Tensor]]:
        info = {}
        for key in self.info_keys:
            if key not in source:
                continue
            reported = source.get(f"_{key}")
            mask = done & np.asarray(reported, dtype=bool) if reported is not None else done
            values = np.zeros(self.num_envs, dtype=np.float32)
            try:
                values[mask] = np.asarray(source[key])[mask]
            except (TypeError, ValueError):
                raise ValueError(
                    f"{self.label!r}: info[{key!r}] is not a number per env; list only numeric info keys in "
                    "eval.info_metrics and the env's metadata['info_metrics']"
                ) from None
            info[key] = (self._tensor(values), self._tensor(mask))
        return info


class EnvPoolAdapter(VectorEnvAdapter):
    """EnvPool's C++ batched tasks (`pip install aa-ray[envpool]`) through its gymnasium API: a
    `VectorEnv` with next-step autoreset, in synchronous mode (`batch_size` = `num_envs`, so every
    call returns every copy, in env order). EnvPool fixes its seeds when the pool is made, so the
    first `reset(seed)` makes the pool (`_PoolToMake` stands in until then), and a later one makes it
    again for a new seed (copy i gets seed + i; EnvPool takes int32
    seeds, so the seed is reduced modulo 2**31 - N; a reset with the seed the pool was made with
    makes it again too, so a seed always gives the same starts). `state()` is None: EnvPool offers no state API,
    so a resumed run restarts its episodes."""

    def __init__(self, task_id: str, num_envs: int, device: str | torch.device = "cpu", *,
                 envpool_options: Mapping[str, Any] | None = None, actor_obs: Sequence[str] | None = None,
                 critic_obs: Sequence[str] | None = None, info_metrics: Sequence[str] = ()):
        try:
            import envpool
        except ImportError as err:
            raise BatchedEnvError(
                f"env.batched: envpool needs the envpool package, which does not import here ({err}); install "
                "aa-ray[envpool] (EnvPool ships wheels for Linux x86-64)."
            ) from err
        options = dict(envpool_options or {})
        for reserved in ("seed", "num_envs", "batch_size"):
            if reserved in options:
                raise BatchedEnvError(
                    f"env.kwargs: {reserved} is set by aa-ray for an EnvPool env (the seed from the spec's seed, the "
                    "envs from runners.envs_per_runner, batch_size equal to them); remove it."
                )
        self.task_id = _envpool_task(task_id, envpool.list_all_envs())
        self.options = options
        self._make_pool = lambda seed: envpool.make_gymnasium(self.task_id, num_envs=num_envs, batch_size=num_envs,
                                                              seed=seed, **options)
        try:  # the options are checked here; the pool is made by the first reset, with its seed
            spec = envpool.make_spec(self.task_id, num_envs=num_envs, batch_size=num_envs, **options)
        except (TypeError, ValueError, AssertionError) as err:
            raise self._refused(err) from err
        # the robot tasks report each reward term every step, as info["reward_<term>"]
        reward_terms = {key.removeprefix("info:reward_"): key.removeprefix("info:")
                        for key in spec.state_array_spec if key.startswith("info:reward_")}
        super().__init__(_PoolToMake(spec, num_envs), device, expected_envs=num_envs, actor_obs=actor_obs,
                         critic_obs=critic_obs, info_metrics=info_metrics, label=self.task_id, field="env.id",
                         reward_terms=reward_terms)
        self._seed: int | None = None  # the seed of the pool made last; None: none made yet
        self._pool_used = False  # a pool that has been reset gives its seed's starts only once made again

    def reset(self, seed: int) -> Tensor:
        seed = int(seed) % (2**31 - self.num_envs)
        if self._pool_used or seed != self._seed:
            self.envs.close()
            try:
                self.envs = self._make_pool(seed)
            except (TypeError, ValueError, AssertionError, RuntimeError) as err:
                raise self._refused(err) from err
            self._seed = seed
        self._pool_used = True
        return super().reset(None)  # not the seed: EnvPool warns that reset(seed=...) is ignored

    def _refused(self, err: BaseException) -> BatchedEnvError:
        return BatchedEnvError(
            f"env.kwargs: EnvPool could not make {self.task_id!r} with {self.options} ({what_user_code_did(err)}); "
            f"check the options EnvPool's {self.task_id} takes (envpool.make_spec({self.task_id!r}).config)."
        )


class _PoolToMake:
    """An EnvPool pool before it is made: its spaces and autoreset mode, read from its spec. EnvPool
    fixes a pool's seeds when it is made, so the adapter makes it at the first reset, with that
    reset's seed, rather than make one now only to close it: a closed pool leaves most of its memory
    behind in the process, and a robot task's takes about 50 MB a copy (benchmarks/robot_memory.py)."""

    def __init__(self, spec: Any, num_envs: int):
        self.num_envs = num_envs
        self.single_observation_space = spec.gymnasium_observation_space
        self.single_action_space = spec.gymnasium_action_space
        self.metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP}

    def reset(self, **kwargs: Any) -> Any:
        raise RuntimeError("an EnvPool pool is made by the adapter's first reset")

    step = reset

    def close(self) -> None:
        pass


def _side_by_side(groups: list[Tensor]) -> Tensor | None:
    """The groups as one (N, features) view when they already lie side by side, in this order, in one
    row-major tensor (PointReach's do: its groups are column ranges of one observation), else None:
    the copy `torch.cat` would make is then not needed."""
    first = groups[0]
    if first.dim() != 2 or first.stride(1) != 1:
        return None
    rows, features = first.shape[0], sum(group.shape[-1] for group in groups)
    if first.stride(0) != features:
        return None
    address, storage = first.data_ptr(), first.untyped_storage().data_ptr()
    for group in groups:
        if (group.dim() != 2 or group.shape[0] != rows or group.stride() != first.stride()
                or group.data_ptr() != address or group.untyped_storage().data_ptr() != storage):
            return None
        address += group.shape[1] * group.element_size()
    return first.as_strided((rows, features), (features, 1))


def _envpool_task(task_id: str, known: Sequence[str]) -> str:
    """EnvPool's id for a gymnasium id: the same for the MuJoCo tasks (HalfCheetah-v5, ...); a
    `module:Id` form loses its module. BatchedEnvError with close ids for one EnvPool lacks."""
    name = task_id.split(":", 1)[1] if ":" in task_id else task_id
    if name in known:
        return name
    close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.6)
    suggestion = f" Did you mean {', '.join(close)}?" if close else ""
    raise BatchedEnvError(
        f"env.id: EnvPool has no task {task_id!r} (envpool.list_all_envs() lists what it has).{suggestion}"
    )


def _entry_point(target: str | Callable[..., Any]) -> Callable[..., Any]:
    """The class or function an `env.entry_point` names (a callable is itself)."""
    if callable(target):
        return target
    if not isinstance(target, str):
        raise BatchedEnvError(f"env.entry_point: expected module:ClassOrFunction or a callable, got {target!r}")
    try:
        found = import_object(target, "env.entry_point", SimpleNamespace(py_modules=()),
                              "ClassOrFunction (e.g. mypkg.tasks:MyBatchedTask)")
    except EnvSourceError as err:
        raise BatchedEnvError(str(err)) from err
    if not callable(found):
        raise BatchedEnvError(f"env.entry_point: {target!r} is a {type(found).__name__}, not a class or function that "
                              "makes a batched env.")
    return found


def _label(target: Any) -> str:
    if isinstance(target, str):
        return target
    if isinstance(target, gym.envs.registration.EnvSpec):
        return target.id
    return f"{getattr(target, '__module__', '?')}:{getattr(target, '__qualname__', repr(target))}"


def _space(env: Any, name: str) -> Any:
    single = getattr(env, f"single_{name}", None)
    return single if single is not None else getattr(env, name, None)


def _one_copy(space: Any, num_envs: int) -> Any:
    """One copy's space out of a batched one (a Box of shape (N, ...) -> (...)); others as they are."""
    if isinstance(space, gym.spaces.Dict):
        return gym.spaces.Dict({key: _one_copy(entry, num_envs) for key, entry in space.spaces.items()})
    if isinstance(space, Mapping):
        return {key: _one_copy(entry, num_envs) for key, entry in space.items()}
    if isinstance(space, gym.spaces.Box) and len(space.shape) == 2 and space.shape[0] == num_envs:
        return gym.spaces.Box(space.low[0], space.high[0], dtype=space.dtype)
    return space

