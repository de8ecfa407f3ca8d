"""Env stepping side by side on HalfCheetah-v5 (issue 35, item 6): env steps/s and env steps per CPU-second
for today's sync vector env, EnvPool, SB3's `DummyVecEnv` and RLlib's env runner, at 1, 16, 64 and 256
envs, in one process.

Two parts, each a table of (envs, contender) cells:
- `raw`: random actions, no policy. The simulators and the vector-env layers alone: gymnasium's sync
  vector env as aa-ray's runners make it today (`aa_ray.envs.make_vector_env`), EnvPool with one and two
  threads, SB3's `DummyVecEnv`; and two runners with random actions, which add their own bookkeeping
  around the same sync vector env: aa-ray's `EnvRunner.sample(n, random_actions=True)` and RLlib's
  `SingleAgentEnvRunner.sample(random_actions=True)` (RLlib's own warm-up switch: its RLModule does not
  run, but its env-to-module connector pipeline and episode objects do, every step).
- `policy`: collection end to end, an MLP policy choosing every action: aa-ray's `EnvRunner.sample` with
  `specs/sac.yaml`'s SAC policy (256x256), SB3's SAC `collect_rollouts` on a `DummyVecEnv` (256x256,
  stores into its replay buffer as it goes), RLlib's `SingleAgentEnvRunner.sample` with SAC's default
  RLModule (256x256, `forward_exploration`).
Both parts also have cells for `aa_ray.runtime.batched_runner.BatchedRunner` on `env.batched: envpool`
with EnvPool at 1 and 2 threads (`env.kwargs.num_threads`), to compare with raw EnvPool at the same
threads; where that module is not in the checkout or does not build, they are recorded as not available.

How it is timed. Every contender is built once per env count (not timed), warmed up, and given a fixed
number of vector steps per cell, sized from the warm-up so one cell takes about `--seconds`. Then the
contenders run alternately (A B C, C B A, A B C, ...: `_common.alternate`), `--reps` times, so drifting
load from other jobs hits them alike. Each call records wall-clock seconds and the process's CPU seconds
(`time.process_time()`, which counts every thread of the process: EnvPool's worker threads included).
Reported per cell: the median env steps/s with its min and max, the CPU cores used (CPU s / wall s), env
steps per CPU-second (the rate per core used), and the median over repetitions of the ratio to the
baseline measured in the same repetition (`raw`: the sync vector env; `policy`: aa-ray's `EnvRunner`).

Env steps counted: vector steps x envs for the raw envs; the transitions each runner returned for the
runners (aa-ray's and RLlib's leave out the step that resets a finished copy, SB3's resets within the
step): HalfCheetah's episodes last 1000 steps, so the two counts differ by at most 0.1%.

Every process here uses one torch thread (`torch.set_num_threads(1)`, as aa-ray's runner actors do).

Run from the repository root:
    .venv/bin/python benchmarks/bench_env_stepping.py                 # both parts, ~13 min on 2 cores
    .venv/bin/python benchmarks/bench_env_stepping.py --quick         # a few seconds of stepping (CI)
    .venv/bin/python benchmarks/bench_env_stepping.py --part raw --envs 64 --reps 5
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

BENCHMARKS = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCHMARKS))
from _common import (  # noqa: E402
    REPO,
    SPECS,
    add_smoke,
    alternate,
    command_line,
    git_state,
    machine_info,
    print_machine,
    print_table,
    write_json,
)

ENV_ID = "HalfCheetah-v5"
ENV_COUNTS = (1, 16, 64, 256)
QUICK_ENV_COUNTS = (4,)
DEFAULT_RESULTS = BENCHMARKS / "results" / "env_stepping.json"
BATCHED_RUNNER_FILE = REPO / "aa_ray" / "runtime" / "batched_runner.py"
WARM_UP_S = 0.3  # a contender's untimed first calls, which also size its cells
SMOKE_WARM_UP_S = 0.01  # --smoke: its cells are no result, so the warm-up only has to size them
RAW_BASELINE = "gymnasium sync vector env"
POLICY_BASELINE = "aa-ray EnvRunner (today)"


class NotAvailable(RuntimeError):
    """A contender that cannot run in this checkout or environment (the reason is recorded, not raised)."""


@dataclass
class Collector:
    """One contender at one env count: `collect(vector_steps)` steps every env that many times and
    returns the env steps it counts; `close` frees its envs."""

    collect: Callable[[int], int]
    close: Callable[[], None] = lambda: None


@dataclass
class Cell:
    """One (envs, contender) cell's repetitions."""

    envs: int
    contender: str
    vector_steps: int = 0
    reps: list[dict[str, float]] = field(default_factory=list)
    unavailable: str | None = None


# ---- the contenders ------------------------------------------------------------------------------------------------

def runner_spec(envs: int, overrides: Sequence[str] = ()) -> Any:
    """specs/sac.yaml on HalfCheetah-v5 with one runner of `envs` envs: what today's runner is given."""
    from aa_ray.spec.loader import load_spec

    return load_spec(SPECS / "sac.yaml", [f"env.id={ENV_ID}", f"runners.envs_per_runner={envs}", *overrides])


def random_stepper(step: Callable[[np.ndarray], Any], envs: int, act_dim: int, seed: int = 0
                   ) -> Callable[[int], int]:
    """`collect` for a raw vector env: uniform actions in [-1, 1] (HalfCheetah's bounds), drawn each step
    the same way for every raw contender."""
    rng = np.random.default_rng(seed)

    def collect(vector_steps: int) -> int:
        for _ in range(vector_steps):
            step(rng.uniform(-1.0, 1.0, (envs, act_dim)).astype(np.float32))
        return vector_steps * envs

    return collect


def gymnasium_sync(envs: int) -> Collector:
    """Today's vector env, made as aa-ray's runners make it (`gym.make_vec(..., vectorization_mode="sync")`)."""
    from aa_ray.envs import make_vector_env

    vector_env = make_vector_env(runner_spec(envs), envs, show_model_warnings=False)
    vector_env.reset(seed=0)
    return Collector(random_stepper(vector_env.step, envs, vector_env.single_action_space.shape[0]), vector_env.close)


def envpool_env(envs: int, threads: int) -> Collector:
    try:
        import envpool
    except ImportError as err:
        raise NotAvailable("envpool is not installed (pip install -e '.[bench]')") from err
    pool = envpool.make_gymnasium(ENV_ID, num_envs=envs, num_threads=threads, seed=0)
    pool.reset()
    return Collector(random_stepper(pool.step, envs, pool.action_space.shape[0]), pool.close)


def sb3_module(name: str) -> Any:
    """A stable-baselines3 module, or NotAvailable where the bench extra is not installed."""
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError as err:
        raise NotAvailable("stable-baselines3 is not installed (pip install -e '.[bench]')") from err


def sb3_dummy_vec_env(envs: int) -> Collector:
    import gymnasium as gym

    from aa_ray.envs.make import model_warnings_once

    DummyVecEnv = sb3_module("stable_baselines3.common.vec_env").DummyVecEnv
    with model_warnings_once(show=False):
        vector_env = DummyVecEnv([partial(gym.make, ENV_ID)] * envs)
    vector_env.seed(0)
    vector_env.reset()
    return Collector(random_stepper(vector_env.step, envs, vector_env.action_space.shape[0]), vector_env.close)


def aa_ray_env_runner(envs: int, random_actions: bool) -> Collector:
    """Today's runner in-process (the same object a Ray runner actor wraps)."""
    from aa_ray.runtime.env_runner import EnvRunner

    runner = EnvRunner(runner_spec(envs), index=0)
    return Collector(lambda vector_steps: runner.sample(vector_steps, random_actions)[1].env_steps, runner.close)


def batched_runner(envs: int, random_actions: bool, threads: int) -> Collector:
    """The batched runner kind on EnvPool (issue 35, `env.batched: envpool`, EnvPool's `num_threads` from
    env.kwargs): `BatchedRunner(spec, index).sample(n, random_actions)`, as `EnvRunner`'s. NotAvailable
    where aa_ray/runtime/batched_runner.py is not in the checkout or does not build."""
    where = BATCHED_RUNNER_FILE.relative_to(REPO)
    if not BATCHED_RUNNER_FILE.exists():
        raise NotAvailable(f"{where} is not in this checkout ({git_state()})")
    try:
        from aa_ray.runtime.batched_runner import BatchedRunner

        runner = BatchedRunner(runner_spec(envs, ["env.batched=envpool", f"env.kwargs.num_threads={threads}"]), index=0)
    except Exception as err:  # a runner kind still being written: record why it did not build, measure the rest
        raise NotAvailable(f"{where} is there but did not build ({git_state()}): {type(err).__name__}: {err}") from err
    close = getattr(runner, "close", lambda: None)
    return Collector(lambda vector_steps: runner.sample(vector_steps, random_actions)[1].env_steps, close)


def rllib_env_runner(envs: int, random_actions: bool) -> Collector:
    """RLlib's new-stack env runner in-process, configured by SACConfig (its default SAC RLModule,
    256x256); `random_actions=True` is RLlib's own switch for sampling without the module."""
    from ray.rllib.algorithms.sac import SACConfig
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

    from aa_ray.envs.make import model_warnings_once

    quiet_libraries()  # after Ray's import, which sets its loggers up
    config = (SACConfig().environment(ENV_ID, env_config={})
              .env_runners(num_env_runners=0, num_envs_per_env_runner=envs))
    with model_warnings_once(show=False):
        runner = SingleAgentEnvRunner(config=config)

    def collect(vector_steps: int) -> int:
        episodes = runner.sample(num_timesteps=vector_steps * envs, random_actions=random_actions)
        return sum(len(episode) for episode in episodes)

    return Collector(collect, runner.stop)


def sb3_sac_collection(envs: int) -> Collector:
    """SB3's SAC collecting as its `learn` does between updates: `collect_rollouts` with the policy acting
    (learning_starts 0), each transition stored into its replay buffer."""
    import gymnasium as gym

    from aa_ray.envs.make import model_warnings_once

    SAC = sb3_module("stable_baselines3").SAC
    DummyVecEnv = sb3_module("stable_baselines3.common.vec_env").DummyVecEnv
    aliases = sb3_module("stable_baselines3.common.type_aliases")
    TrainFreq, TrainFrequencyUnit = aliases.TrainFreq, aliases.TrainFrequencyUnit

    with model_warnings_once(show=False):
        vector_env = DummyVecEnv([partial(gym.make, ENV_ID)] * envs)
    model = SAC("MlpPolicy", vector_env, learning_starts=0, buffer_size=200_000, device="cpu", seed=0)
    _, callback = model._setup_learn(total_timesteps=10**12, callback=None)  # what learn() does before collecting

    def collect(vector_steps: int) -> int:
        before = model.num_timesteps
        model.collect_rollouts(model.env, callback, TrainFreq(vector_steps, TrainFrequencyUnit.STEP),
                               model.replay_buffer, learning_starts=0)
        return model.num_timesteps - before

    return Collector(collect, vector_env.close)


RAW_CONTENDERS: dict[str, Callable[[int], Collector]] = {
    RAW_BASELINE: gymnasium_sync,
    "EnvPool, 1 thread": partial(envpool_env, threads=1),
    "EnvPool, 2 threads": partial(envpool_env, threads=2),
    "SB3 DummyVecEnv": sb3_dummy_vec_env,
    "aa-ray EnvRunner, random actions": partial(aa_ray_env_runner, random_actions=True),
    "RLlib SingleAgentEnvRunner, random actions": partial(rllib_env_runner, random_actions=True),
    "aa-ray BatchedRunner (EnvPool 1 thread), random actions": partial(batched_runner, random_actions=True, threads=1),
    "aa-ray BatchedRunner (EnvPool 2 threads), random actions": partial(batched_runner, random_actions=True, threads=2),
}
POLICY_CONTENDERS: dict[str, Callable[[int], Collector]] = {
    POLICY_BASELINE: partial(aa_ray_env_runner, random_actions=False),
    "SB3 SAC collect_rollouts (DummyVecEnv)": sb3_sac_collection,
    "RLlib SingleAgentEnvRunner, SAC module": partial(rllib_env_runner, random_actions=False),
    "aa-ray BatchedRunner (EnvPool 1 thread)": partial(batched_runner, random_actions=False, threads=1),
    "aa-ray BatchedRunner (EnvPool 2 threads)": partial(batched_runner, random_actions=False, threads=2),
}
PARTS = {"raw": (RAW_CONTENDERS, RAW_BASELINE), "policy": (POLICY_CONTENDERS, POLICY_BASELINE)}


# ---- timing --------------------------------------------------------------------------------------------------------

def timed(collector: Collector, vector_steps: int) -> dict[str, float]:
    """One call: wall and CPU seconds (every thread of this process) and the env steps done."""
    wall_start, cpu_start = time.perf_counter(), time.process_time()
    env_steps = collector.collect(vector_steps)
    wall_s, cpu_s = time.perf_counter() - wall_start, time.process_time() - cpu_start
    return {"wall_s": wall_s, "cpu_s": cpu_s, "env_steps": env_steps, "steps_per_s": env_steps / wall_s,
            "steps_per_cpu_s": env_steps / max(cpu_s, 1e-9), "load_1m": os.getloadavg()[0]}


def cell_size(collector: Collector, seconds: float, warm_up_s: float = WARM_UP_S) -> int:
    """Warm the contender up (untimed, until a call takes `warm_up_s`) and return the vector steps that
    take about `seconds` at its rate."""
    vector_steps, spent_s, done = 1, 0.0, 0
    while spent_s < warm_up_s:
        call = timed(collector, vector_steps)
        spent_s, done = call["wall_s"], vector_steps
        vector_steps *= 4
    return max(1, math.ceil(seconds * done / spent_s))


def measure_env_count(contenders: dict[str, Callable[[int], Collector]], envs: int, seconds: float, reps: int,
                      warm_up_s: float = WARM_UP_S) -> list[Cell]:
    """Build every contender at `envs`, size its cell, then run them alternately `reps` times."""
    cells, ready = [], []
    for name, build in contenders.items():
        cell = Cell(envs, name)
        cells.append(cell)
        try:
            collector = build(envs)
        except NotAvailable as err:
            cell.unavailable = str(err)
            print(f"  {name}: not available: {err}", flush=True)
            continue
        cell.vector_steps = cell_size(collector, seconds, warm_up_s)
        ready.append((cell, collector))

    def run(cell: Cell, collector: Collector) -> float:
        record = timed(collector, cell.vector_steps)
        cell.reps.append(record)
        return record["steps_per_s"]

    alternate([(cell.contender, partial(run, cell, collector)) for cell, collector in ready], reps)
    for _, collector in ready:
        collector.close()
    return cells


def summarize(cells: list[Cell], baseline: str) -> list[dict[str, Any]]:
    """Per cell: medians, spread, and ratios to the baseline of the same env count, repetition by repetition."""
    base = {cell.envs: cell for cell in cells if cell.contender == baseline and cell.reps}
    rows = []
    for cell in cells:
        row: dict[str, Any] = {"envs": cell.envs, "contender": cell.contender, "vector_steps": cell.vector_steps,
                               "unavailable": cell.unavailable, "reps": cell.reps}
        if cell.reps:
            rates = [r["steps_per_s"] for r in cell.reps]
            per_cpu = [r["steps_per_cpu_s"] for r in cell.reps]
            row |= {
                "steps_per_s_median": statistics.median(rates), "steps_per_s_min": min(rates),
                "steps_per_s_max": max(rates),
                "cores_used_median": statistics.median(r["cpu_s"] / r["wall_s"] for r in cell.reps),
                "steps_per_cpu_s_median": statistics.median(per_cpu),
            }
            if cell.envs in base:
                ref = base[cell.envs].reps
                row["ratio_wall"] = statistics.median(
                    a["steps_per_s"] / b["steps_per_s"] for a, b in zip(cell.reps, ref, strict=True))
                row["ratio_per_cpu"] = statistics.median(
                    a["steps_per_cpu_s"] / b["steps_per_cpu_s"] for a, b in zip(cell.reps, ref, strict=True))
        rows.append(row)
    return rows


def print_part(title: str, rows: list[dict[str, Any]], baseline: str) -> None:
    print(f"\n## {title} (ratios: median per-repetition ratio to '{baseline}' at the same env count)")
    table = []
    for row in rows:
        if row["unavailable"]:
            table.append([row["envs"], row["contender"], "not available", "", "", "", ""])
            continue
        table.append([
            row["envs"], row["contender"],
            f"{row['steps_per_s_median']:,.0f} ({row['steps_per_s_min']:,.0f}-{row['steps_per_s_max']:,.0f})",
            f"{row['cores_used_median']:.2f}", f"{row['steps_per_cpu_s_median']:,.0f}",
            f"{row['ratio_wall']:.2f}", f"{row['ratio_per_cpu']:.2f}",
        ])
    print_table(["envs", "contender", "env steps/s median (min-max)", "cores used", "env steps per CPU-s",
                 "ratio, wall", "ratio, per core"], table)


def batched_runner_state() -> str:
    """Whether the batched runner's file is committed, only in the working tree, or absent (for the record)."""
    import subprocess

    where = str(BATCHED_RUNNER_FILE.relative_to(REPO))
    if not BATCHED_RUNNER_FILE.exists():
        return f"{where}: absent"
    last = subprocess.run(["git", "log", "-1", "--format=%h %s", "--", where], capture_output=True, text=True,
                          cwd=REPO).stdout.strip()
    return f"{where}: last commit {last[:100]}" if last else f"{where}: in the working tree, never committed"


def quiet_libraries() -> None:
    """RLlib and Ray log deprecation notices and warnings on every runner built; they are not results."""
    for name in ("ray", "ray.rllib"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=UserWarning, module="gymnasium")


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=[*PARTS, "all"], default="all")
    parser.add_argument("--envs", type=positive_int, nargs="+", default=None,
                        help=f"env counts (default {' '.join(map(str, ENV_COUNTS))})")
    parser.add_argument("--seconds", type=float, default=None, help="wall seconds per cell (default 2.5)")
    parser.add_argument("--reps", type=positive_int, default=None, help="alternating repetitions (default 5)")
    parser.add_argument("--quick", action="store_true",
                        help="the smallest run that exercises every cell: 4 envs, 0.1 s per cell, 2 repetitions, "
                             "no JSON unless --json names one")
    parser.add_argument("--json", type=Path, default=None,
                        help=f"where the results go (default {DEFAULT_RESULTS.relative_to(REPO)}, none with --quick)")
    add_smoke(parser)
    args = parser.parse_args()
    args.quick = args.quick or args.smoke
    env_counts = args.envs or (QUICK_ENV_COUNTS if args.quick else ENV_COUNTS)
    seconds = args.seconds or (0.03 if args.smoke else 0.1 if args.quick else 2.5)
    reps = args.reps or (1 if args.smoke else 2 if args.quick else 5)
    warm_up_s = SMOKE_WARM_UP_S if args.smoke else WARM_UP_S
    json_path = args.json or (None if args.quick else DEFAULT_RESULTS)
    if seconds <= 0:
        parser.error(f"--seconds must be positive, got {seconds}")

    torch.set_num_threads(1)
    quiet_libraries()
    info = machine_info()
    print_machine(info)
    parts = list(PARTS) if args.part == "all" else [args.part]
    payload: dict[str, Any] = {
        "machine": info, "command": command_line(), "env_id": ENV_ID, "env_counts": list(env_counts),
        "seconds_per_cell": seconds, "reps": reps, "torch_threads": torch.get_num_threads(),
        "batched_runner": batched_runner_state(), "parts": {},
    }
    started = time.perf_counter()
    for part in parts:
        contenders, baseline = PARTS[part]
        load_before = os.getloadavg()
        cells = []
        for envs in env_counts:
            print(f"\n# {part}: {envs} envs", flush=True)
            cells += measure_env_count(contenders, envs, seconds, reps, warm_up_s)
        rows = summarize(cells, baseline)
        payload["parts"][part] = {"baseline": baseline, "load_before": load_before, "load_after": os.getloadavg(),
                                  "cells": rows}
        print_part(part, rows, baseline)
        print(f"# load average (1, 5, 15 min) before: {load_before}, after: {os.getloadavg()}")
    payload["wall_s"] = time.perf_counter() - started
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        write_json(json_path, payload)
        print(f"# results: {json_path}")


if __name__ == "__main__":
    main()
