"""aa-ray's PPO against UniLab's own PPO on UniLab's Go2JoystickFlat, at equal minutes (issue 56, item 5).

Both train the same env (UniLab's task on its CPU MuJoCo, 1,024 copies, 24 steps per copy per update,
5 epochs x 4 minibatches, 512-256-128 ELU networks, UniLab's settings: `specs/robots/go2_ppo.yaml`'s
header table), one after the other on the same machine, for the same wall-clock minutes per seed:
- aa-ray: `specs/robots/go2_ppo.yaml` through the Python API (Ray, one runner, one learner), untracked;
  each evaluation and checkpoint report is stamped with the seconds since the run started;
- UniLab: its own `train --algo ppo --task go2_joystick_flat --sim mujoco algo.num_envs=1024`
  (rsl_rl's PPO inside UniLab's trainer), its console read line by line and stamped the same way.
  Its robot model is pointed at the folder aa-ray links (meshes from installed packages), so nothing
  is fetched from a hub.
The reward compared is each side's mean return of its recent finished training episodes (UniLab's
"Mean reward": the last 100; aa-ray's `train/episode_return`: the last 20), against minutes and env
steps. aa-ray reports at its evaluations, here every 250k env steps (8 deterministic episodes, which
its minutes pay for). Reported: each side's reward at 1, 3, 5, ... minutes, its final reward, and the
minutes aa-ray takes to reach UniLab's final reward (goal: at most 0.7 of UniLab's minutes).

Needs the unilab extra (`scripts/setup.sh dev`). Run from the repository root:
    .venv/bin/python benchmarks/robot_side_by_side.py --minutes 10 --seeds 0 \\
        --json benchmarks/results/robot_side_by_side_go2.json
    .venv/bin/python benchmarks/robot_side_by_side.py --smoke      # a few updates of each (CI)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCHMARKS))

from _common import SPECS, command_line, machine_info, print_machine, print_table, write_json  # noqa: E402

from aa_ray import metric_names as m  # noqa: E402
from aa_ray.api import Experiment  # noqa: E402
from aa_ray.envs.unilab import TASKS, robot_model_file  # noqa: E402
from aa_ray.spec.loader import load_spec  # noqa: E402

SPEC = SPECS / "robots" / "go2_ppo.yaml"
UNILAB_LINE = re.compile(r"^\s*(Total steps|Mean reward|Collection time|Learning time):\s*"
                         r"([-0-9.e]+)")


def aa_ray_curve(seed: int, minutes: float, overrides: list[str]) -> list[dict[str, float]]:
    spec = load_spec(SPEC, [f"seed={seed}", "budget.env_steps=100000000", "tracking.enabled=false",
                            "checkpoint.every_env_steps=100000000", "eval.every_env_steps=250000", "eval.episodes=8",
                            *overrides])
    points: list[dict[str, float]] = []
    start = time.perf_counter()

    def stamp(report: Any) -> bool:
        seconds = time.perf_counter() - start
        if m.TRAIN_EPISODE_RETURN in report.metrics:
            points.append({"seconds": seconds, "env_steps": report.env_steps,
                           "reward": report.metrics[m.TRAIN_EPISODE_RETURN],
                           "eval_return": report.metrics.get(m.EVAL_RETURN, float("nan")),
                           "error_vel_xy": report.metrics.get("eval/command_error_vel_xy", float("nan")),
                           "collect_s": report.metrics.get(f"time/{m.PHASE_COLLECT}_s", float("nan")),
                           "learn_s": report.metrics.get(f"time/{m.PHASE_LEARNER_UPDATE}_s", float("nan"))})
            print(f"aa-ray seed {seed}: {seconds / 60:.1f} min, {report.env_steps:,} env steps, "
                  f"reward {points[-1]['reward']:.2f}, eval {points[-1]['eval_return']:.2f}", flush=True)
        return seconds >= minutes * 60

    Experiment(spec).fit(callbacks=[stamp])
    return points


def unilab_curve(seed: int, minutes: float, envs: int = 1024, iterations: int = 100_000) -> list[dict[str, float]]:
    model = robot_model_file(TASKS["Go2JoystickFlat"], "scene_flat.xml")
    train = Path(sys.executable).parent / "train"
    command = [str(train), "--algo", "ppo", "--task", "go2_joystick_flat", "--sim", "mujoco", f"algo.num_envs={envs}",
               f"algo.seed={seed}", f"algo.max_iterations={iterations}", f"env.scene.model_file={model}",
               "training.no_play=true"]
    points: list[dict[str, float]] = []
    current: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        # unbuffered: each line is stamped when it is printed, not when a pipe's block fills
        process = subprocess.Popen(command, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            assert process.stdout is not None
            for line in process.stdout:
                seconds = time.perf_counter() - start
                match = UNILAB_LINE.match(re.sub(r"\x1b\[[0-9;]*m", "", line))
                if match:
                    current[match.group(1)] = float(match.group(2))
                if "Iteration time" in line:  # an iteration's block ends (its reward only once an episode ended)
                    points.append({"seconds": seconds, "env_steps": current.get("Total steps", float("nan")),
                                   "reward": current.get("Mean reward", float("nan")),
                                   "collect_s": current.get("Collection time", float("nan")),
                                   "learn_s": current.get("Learning time", float("nan"))})
                    if len(points) % 10 == 0:
                        print(f"UniLab seed {seed}: {seconds / 60:.1f} min, {points[-1]['env_steps']:,.0f} env steps, "
                              f"reward {points[-1]['reward']:.2f}", flush=True)
                if seconds >= minutes * 60:
                    break
        finally:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    if not points:
        raise RuntimeError(f"UniLab's trainer printed no iteration: {' '.join(command)}")
    return points


def at_minute(points: list[dict[str, float]], minute: float) -> float | None:
    before = [point["reward"] for point in points if point["seconds"] <= minute * 60]
    return before[-1] if before else None


def minutes_to(points: list[dict[str, float]], reward: float) -> float | None:
    return next((point["seconds"] / 60 for point in points if point["reward"] >= reward), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="wall-clock minutes per run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--set", nargs="*", default=[], help="overrides of aa-ray's spec (key=value)")
    parser.add_argument("--unilab-from", type=Path, default=None,
                        help="UniLab's curves from this earlier result (same seeds, minutes): rerun aa-ray only")
    parser.add_argument("--smoke", action="store_true", help="both trainers for a few updates of 16 copies (CI)")
    args = parser.parse_args()
    unilab_size = {"envs": 16, "iterations": 2} if args.smoke else {}
    if args.smoke:
        args.set = [*args.set, "runtime.backend=inline", "runners.envs_per_runner=16", "algo.train_every=8",
                    "budget.env_steps=256", "eval.every_env_steps=128", "eval.episodes=2", "env.max_episode_steps=8",
                    "algo.actor_hidden_dims=[32]", "algo.critic_hidden_dims=[32]"]
    machine = machine_info()
    print_machine(machine)
    earlier = {}
    if args.unilab_from is not None:
        earlier = {run["seed"]: run["unilab"] for run in json.loads(args.unilab_from.read_text())["runs"]}
    runs = []
    for seed in args.seeds:
        unilab = earlier[seed] if seed in earlier else unilab_curve(seed, args.minutes, **unilab_size)
        ours = aa_ray_curve(seed, args.minutes, args.set)
        target = unilab[-1]["reward"]
        runs.append({"seed": seed, "unilab": unilab, "aa_ray": ours, "unilab_final": target,
                     "aa_ray_final": ours[-1]["reward"] if ours else None,
                     "aa_ray_minutes_to_unilab_final": minutes_to(ours, target),
                     "unilab_minutes_to_its_final": minutes_to(unilab, target)})
        write_json(args.json, {"command": command_line(), "machine": machine, "minutes": args.minutes, "runs": runs})
    marks = [minute for minute in (1, 2, 3, 5, 8, 10, 13, 15, 20) if minute <= args.minutes]
    print_table(["seed", "trainer"] + [f"{minute} min" for minute in marks] + ["final", "env steps"],
                [[run["seed"], name] + [at_minute(run[key], minute) for minute in marks]
                 + [run[key][-1]["reward"], run[key][-1]["env_steps"]]
                 for run in runs for name, key in (("UniLab PPO", "unilab"), ("aa-ray PPO", "aa_ray"))])
    for run in runs:
        print(f"seed {run['seed']}: aa-ray reached UniLab's final {run['unilab_final']:.2f} at "
              f"{run['aa_ray_minutes_to_unilab_final']} min (UniLab first at {run['unilab_minutes_to_its_final']} min)")


if __name__ == "__main__":
    main()
