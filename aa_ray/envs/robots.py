"""The robot tasks this install can train: EnvPool's C++ ports of MuJoCo Playground's locomotion,
manipulation and dexterous tasks (`env.batched: envpool`), and the same tasks in MJX where MuJoCo
Playground is installed (`env.batched: playground`, by the task's Playground name).

Everything here is read from the sources' own task descriptions, without making an env: EnvPool's
`make_spec` (observation groups and sizes, action size, control period, episode length, the reward
terms its info reports). Playground is a source where it is installed with the robot models its
tasks load (it clones mujoco_menagerie from GitHub otherwise, which aa-ray never relies on).
UniLab's own tasks (`env.batched: unilab`, `aa_ray.envs.unilab`) are listed where UniLab is installed
with the robots' meshes; their sizes are read from a one-copy env (a second each).
`aa-ray robots` prints the table.

A spec names a task by its EnvPool id (`env: {id: Go1JoystickFlatTerrain-v1, batched: envpool}`); its
observations are a Dict of `state` (what the deployed policy reads) and `privileged_state` (the
critic's extra), which the spec need not list (`envs.obs_groups.ASYMMETRIC_GROUPS`), and each reward
term becomes `eval/reward/<term>` and `train/reward/<term>` (`envs.batched.VectorEnvAdapter`).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

# EnvPool lists each Playground port twice, as `<Task>-v1` and `MuJoCoPlayground/<Task>-v1`
PLAYGROUND_ALIAS = "MuJoCoPlayground/"

# the robot in each task's name, longest prefix first where two share a start
ROBOTS = {
    "BerkeleyHumanoid": "Berkeley Humanoid (humanoid)",
    "LeapCube": "LEAP hand (dexterous hand)",
    "Apollo": "Apptronik Apollo (humanoid)",
    "Barkour": "Google Barkour (quadruped)",
    "Aloha": "ALOHA (two arms)",
    "Panda": "Franka Panda (arm)",
    "Spot": "Boston Dynamics Spot (quadruped)",
    "Go1": "Unitree Go1 (quadruped)",
    "Op3": "Robotis OP3 (humanoid)",
    "G1": "Unitree G1 (humanoid)",
    "H1": "Unitree H1 (humanoid)",
    "T1": "Booster T1 (humanoid)",
}


@dataclass(frozen=True)
class RobotTask:
    """One robot task as its sources describe it."""

    env_id: str  # EnvPool's id, what env.id names
    robot: str
    playground_name: str  # its name in MuJoCo Playground's registry
    groups: tuple[tuple[str, int], ...]  # observation groups and their sizes, in the env's order ("" for a flat Box)
    act_dim: int
    control_hz: float | None  # 1 / the control period, where the task's config gives one
    episode_steps: int
    reward_terms: tuple[str, ...]
    sources: tuple[str, ...]  # the env.batched values that can run it here


def robot_of(task_name: str) -> str | None:
    return next((robot for prefix, robot in ROBOTS.items() if task_name.startswith(prefix)), None)


def robot_tasks() -> list[RobotTask]:
    """Every robot task EnvPool has here (none without EnvPool), with Playground as a second source
    where it can load the robots (the tasks are its own, under the same names)."""
    try:
        import envpool
    except ImportError:
        return []
    ids = set(envpool.list_all_envs())
    playground = _playground_can_load_robots()
    tasks = []
    for alias in sorted(i for i in ids if i.startswith(PLAYGROUND_ALIAS)):
        env_id = alias.removeprefix(PLAYGROUND_ALIAS)
        if env_id not in ids:
            continue
        spec = envpool.make_spec(env_id)
        config = spec.config._asdict()
        name = str(config.get("task_name") or env_id.rsplit("-", 1)[0])
        robot = robot_of(name)
        if robot is None:
            continue
        space = spec.observation_space
        groups = tuple((key, int(box.shape[0])) for key, box in getattr(space, "spaces", {"": space}).items())
        ctrl_dt = config.get("ctrl_dt")
        tasks.append(RobotTask(
            env_id=env_id, robot=robot, playground_name=name, groups=groups,
            act_dim=int(spec.action_space.shape[0]), control_hz=round(1 / ctrl_dt, 3) if ctrl_dt else None,
            episode_steps=int(config["max_episode_steps"]),
            reward_terms=tuple(key.removeprefix("info:reward_") for key in spec.state_array_spec
                               if key.startswith("info:reward_")),
            sources=("envpool", "playground") if playground else ("envpool",),
        ))
    return tasks


def unilab_tasks() -> list[RobotTask]:
    """UniLab's tasks that can be made here (none without UniLab; G1MotionTracking only with its motion
    clips), each read from a one-copy env."""
    if importlib.util.find_spec("unilab") is None:
        return []
    from aa_ray.envs.batched import BatchedEnvError
    from aa_ray.envs.unilab import TASKS, make_unilab_env

    tasks = []
    for name, task in TASKS.items():
        try:
            envs = make_unilab_env(name, 1)
        except (BatchedEnvError, OSError, RuntimeError, ValueError):
            continue  # its meshes or clips are not installed: `make_unilab_env` says which when a spec names it
        try:
            tasks.append(RobotTask(
                env_id=name, robot=task.robot_name, playground_name="", groups=envs.obs_dims.groups,
                act_dim=envs.act_dim, control_hz=round(1 / envs.step_dt, 3), episode_steps=envs.max_episode_steps,
                reward_terms=envs.reward_terms, sources=("unilab",),
            ))
        finally:
            envs.close()
    return tasks


def _playground_can_load_robots() -> bool:
    """MuJoCo Playground is installed with the robot models its robot tasks load (mujoco_menagerie,
    which Playground otherwise clones from GitHub on first use). Looked up, not imported: importing
    it loads JAX (seconds). EnvPool's ports carry Playground's task names."""
    found = importlib.util.find_spec("mujoco_playground")
    if found is None or found.origin is None:
        return False
    return (Path(found.origin).parent / "external_deps" / "mujoco_menagerie").is_dir()


def robot_table(tasks: list[RobotTask]) -> str:
    """The tasks as a plain text table, one line each."""
    header = ("env.id", "robot", "observation groups", "actions", "control", "episode", "reward terms", "env.batched")
    rows = [header] + [(
        task.env_id, task.robot, ", ".join(f"{key} {size}" if key else f"{size} (one vector)"
                                           for key, size in task.groups), str(task.act_dim),
        f"{task.control_hz:g} Hz" if task.control_hz else "-", f"{task.episode_steps} steps",
        str(len(task.reward_terms)), ", ".join(task.sources),
    ) for task in tasks]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
                     for row in rows)
