"""aa-ray against RLlib 2.60's SAC (new API stack), side by side on one local Ray cluster, the same
synthetic env (`scale_sim/Synthetic-v0`: obs 17, act 6, episodes of 200 steps, `step_s` slept per env
step) and the same runner counts, as three separate ratios (issue 37):

- collect: collection alone. Neither side ever learns (a warm-up no run reaches): R runners of E
  envs step, store and report their transitions. env steps/s.
- learn: the learner path alone, per gradient update, a real SAC update on both sides at the same
  widths (64 x 64 actor, twin 64 x 64 critics) and batch (256), from a replay that holds data:
  aa-ray: the call its driver makes each iteration, the replay actor's sample of 32 batches passed
  through the object store to the learner actor's update (`Learner.update`), no runners;
  RLlib: its replay buffer's sample and `LearnerGroup.update`, timed around those two calls inside
  its own `training_step` (its runners wait meanwhile: RLlib's loop is synchronous).
  ms per update, each side's own clock around the calls, not RLlib's averaged timers.
- loop: the whole loop, real SAC on both sides, one update per fleet step (R x E env steps), the
  sampling round 32 fleet steps. env steps/s.

Each cell's rate is taken over a window of at least `--rounds` sampling rounds (a round: every runner
steps each of its envs 32 times; aa-ray's iteration, one RLlib `training_step`) and `--seconds`,
after `SETTLE_ROUNDS` rounds (and, in loop cells, after the warm-up). RLlib's rounds are time-stamped
by wrapping its `training_step`, so RLlib's per-iteration reporting is inside the window. The sides
alternate (their order flips from one cell to the next), every cell repeats `--reps` times, and the
ratios are medians of per-repetition ratios. The machine's load average is recorded per cell.

RLlib's settings, and why (its scaling guide names three axes: env runners, envs per runner, learners):
- `num_env_runners=R`, `num_envs_per_env_runner=E`: the same fleet as aa-ray's.
- `num_learners=0`, the default: the learner in the driver process. Remote learners are for GPUs and
  for several learners; on this CPU a remote one adds a Ray call and a copy per update and no compute.
- `rollout_fragment_length=32` and `training_intensity` such that one round makes 32 updates: the same
  UTD as aa-ray's `train_every` 32. SAC's default ('auto', here 1) makes one remote sampling round
  per fleet step, which only adds Ray calls.
- `EpisodeReplayBuffer` (uniform, as aa-ray's), capacity 200k, learning after 500 env steps.
- the reporting defaults (`min_time_s_per_iteration` 1 s): `train()` runs rounds until a second has
  passed, so its result dict costs once per second, not once per round.
- one torch thread in the driver, as aa-ray's learner actor has.

aa-ray runs its default sync mode with `benchmarks/scale_sim.yaml`'s runtime, algo `sac`. Both sides
ship `benchmarks/scale_sim` to the workers and give them one BLAS/OpenMP thread.

Run from the repository root (resumable: cells already in --json are kept):
    .venv/bin/python benchmarks/bench_scale_rllib.py --runners 1 2 4 8 --step-s 0 0.002 --reps 3 --json out.json
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil
import yaml

BENCHMARKS = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCHMARKS))
from _common import (  # noqa: E402
    REPO,
    add_smoke,
    command_line,
    machine_info,
    print_machine,
    print_table,
    random_transitions,
    stop_when,
    write_json,
)
from bench_scale import SPEC, cpu_by_kind, cpus_per_node, process_kind, simulated_cluster  # noqa: E402

# gymnasium's "module:id": each env runner imports scale_sim (shipped as py_modules), which registers the id
ENV = "scale_sim:scale_sim/Synthetic-v0"
OBS_DIM, ACT_DIM, MAX_EPISODE_STEPS = 17, 6, 200
WIDTHS = [64, 64]
BATCH, BUFFER, ROUND, WARM_UP = 256, 200_000, 32, 500
NEVER = 10**12  # a warm-up or budget no run reaches
SETTLE_ROUNDS = 3  # rounds before a window starts (after the warm-up in loop cells)
LEARNER_TORCH_THREADS = 1
SIDES = ("aa-ray", "rllib")
RUNTIME_ENV = {"py_modules": [str(BENCHMARKS / "scale_sim")]}


@dataclass
class Cell:
    side: str
    measure: str  # collect | learn | loop
    step_s: float
    runners: int
    envs: int
    rep: int
    env_steps_per_s: float = 0.0
    ms_per_update: float = 0.0  # learn cells; loop cells, RLlib: its learner path inside the loop
    rounds: int = 0
    window_s: float = 0.0
    driver_cpu_ms_per_round: float = 0.0
    cpu_us_per_transition: dict[str, float] = field(default_factory=dict)
    load_average: tuple[float, ...] = ()
    status: str = "ok"

    def key(self) -> tuple:
        return (self.side, self.measure, self.step_s, self.runners, self.envs, self.rep)


@dataclass(frozen=True)
class Sizes:
    """How long a cell runs: its window spans at least `rounds` rounds and `seconds`, after `settle`
    rounds and, in loop cells, after a warm-up of `warm_up` env steps."""

    rounds: int
    seconds: float
    settle: int = SETTLE_ROUNDS
    warm_up: int = WARM_UP

    def learning_rounds(self, cell: Cell) -> int:
        """The rounds a loop cell's fleet takes to step past the warm-up (none in other cells)."""
        return math.ceil(self.warm_up / (cell.runners * cell.envs * ROUND)) if cell.measure == "loop" else 0

    def window(self, cell: Cell) -> Window:
        # a window starts at a round's end: the first round's at the earliest
        return Window(max(1, self.learning_rounds(cell) + self.settle), self.rounds, self.seconds)


class Window:
    """Round end stamps (count, wall clock, the cluster's CPU by process kind): the rate is taken from
    the stamp after `skip` rounds to the first one at which the window spans `rounds` rounds and
    `seconds`; stamps after that are not counted (aa-ray's last iteration evaluates)."""

    def __init__(self, skip: int, rounds: int, seconds: float):
        self.skip, self.min_rounds, self.seconds = skip, rounds, seconds
        self.count = 0
        self.first: tuple[int, float, dict[str, float]] | None = None
        self.last: tuple[int, float, dict[str, float]] | None = None

    def stamp(self, cpu: Callable[[], dict[str, float]]) -> None:
        self.count += 1
        if self.count == self.skip:
            self.first = (self.count, time.perf_counter(), cpu())
        elif self.first is not None and self.last is None and self.count - self.first[0] >= self.min_rounds \
                and time.perf_counter() - self.first[1] >= self.seconds:
            self.last = (self.count, time.perf_counter(), cpu())

    def fill(self, cell: Cell, steps_per_round: int) -> Cell:
        """The cell's rate, CPU per step and driver CPU per round over the window (for a learn cell,
        a step is a gradient update)."""
        if self.first is None or self.last is None:
            cell.status = f"too short ({self.count} rounds)"
            return cell
        (count0, wall0, cpu0), (count1, wall1, cpu1) = self.first, self.last
        cell.rounds, cell.window_s = count1 - count0, wall1 - wall0
        steps = cell.rounds * steps_per_round
        cell.env_steps_per_s = steps / cell.window_s
        used = {kind: cpu1.get(kind, 0.0) - cpu0.get(kind, 0.0) for kind in set(cpu0) | set(cpu1)}
        cell.cpu_us_per_transition = {kind: 1e6 * s / steps for kind, s in sorted(used.items())}
        cell.cpu_us_per_transition["total"] = sum(cell.cpu_us_per_transition.values())
        cell.driver_cpu_ms_per_round = 1e3 * used.get("driver", 0.0) / cell.rounds
        return cell


# ---- aa-ray -----------------------------------------------------------------------------------------------------
def aa_ray_spec(folder: Path, cell: Cell, warm_up: int) -> Any:
    """scale_sim.yaml with aa-ray's `sac` in place of the timed learner, at the cell's fleet and step cost."""
    from aa_ray.spec.loader import load_spec

    document = yaml.safe_load(SPEC.read_text())
    algo = {key: value for key, value in document["algo"].items() if key not in ("plugin", "update_s")}
    document["algo"] = algo | {
        "name": "sac", "actor_hidden_dims": WIDTHS, "critic_hidden_dims": WIDTHS, "batch_size": BATCH,
        "buffer_size": BUFFER, "train_every": ROUND, "utd_ratio": 1,
        "warm_up_steps": NEVER if cell.measure == "collect" else warm_up,
    }
    document["env"]["kwargs"]["step_s"] = cell.step_s
    document["runners"] = {"num_runners": cell.runners, "envs_per_runner": cell.envs}
    document["budget"] = {"env_steps": 2 * NEVER}  # past the warm-up of a collect cell
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(document))
    return load_spec(path)


def aa_ray_run(cell: Cell, sizes: Sizes) -> Cell:
    """A Trainer run on the cluster RAY_ADDRESS names, its iterations stamped through the run record's
    per-iteration `show`, stopped once the window is full."""
    from aa_ray.runtime.trainer import Trainer

    with tempfile.TemporaryDirectory(prefix="bench_rllib_") as folder:
        spec = aa_ray_spec(Path(folder), cell, sizes.warm_up)
        trainer = Trainer(spec, run_dir=Path(folder) / "run", track=False, live=False)
        window = sizes.window(cell)
        show = trainer.record.show

        def show_and_stamp(env_steps: int, metrics: dict[str, float]) -> None:
            show(env_steps, metrics)
            window.stamp(cpu_by_kind)

        trainer.record.show = show_and_stamp
        stop_when(trainer, lambda _: window.last is not None, "measured")
        trainer.run()
    return window.fill(cell, cell.runners * cell.envs * ROUND)


def aa_ray_learn(cell: Cell, sizes: Sizes) -> Cell:
    """The learner path as the sync loop calls it, over a window after `sizes.settle` calls: the replay
    actor samples 32 batches, the learner actor updates on them (the object store between them)."""
    import ray

    from aa_ray.runtime.learner import Learner
    from aa_ray.runtime.replay import ReplayBuffer

    with tempfile.TemporaryDirectory(prefix="bench_rllib_") as folder:
        spec = aa_ray_spec(Path(folder), cell, sizes.warm_up)
    ray.init(address=os.environ["RAY_ADDRESS"], runtime_env=RUNTIME_ENV)
    try:
        replay = ray.remote(ReplayBuffer).options(num_cpus=0).remote(BUFFER, OBS_DIM, ACT_DIM, seed=cell.rep)
        learner = ray.remote(Learner).options(num_cpus=1).remote(spec, OBS_DIM, ACT_DIM)
        ray.get(replay.add.remote(random_transitions(20_000, OBS_DIM, ACT_DIM, seed=cell.rep)))
        window = sizes.window(cell)
        while window.last is None:
            ray.get(learner.update.remote([], replay.sample_for_learners.remote(ROUND, BATCH, 1)))
            window.stamp(cpu_by_kind)
        for actor in (learner, replay):
            ray.kill(actor)
    finally:
        ray.shutdown()
    window.fill(cell, ROUND)  # "env steps" here are updates: 32 per call
    cell.ms_per_update, cell.env_steps_per_s = 1e3 / cell.env_steps_per_s, 0.0
    return cell


# ---- RLlib ------------------------------------------------------------------------------------------------------
def rllib_config(runners: int, envs: int, step_s: float, warm_up: int) -> Any:
    from ray.rllib.algorithms.dqn.dqn import calculate_rr_weights
    from ray.rllib.algorithms.sac import SACConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    # RLlib's native ratio counts the local env runner as a sampler too: batch / (fragment x envs x (runners + 1))
    native_ratio = BATCH / (ROUND * envs * (runners + 1))
    config = (
        SACConfig()
        .api_stack(enable_rl_module_and_learner=True, enable_env_runner_and_connector_v2=True)
        .framework("torch")
        .environment(ENV, env_config={"obs_dim": OBS_DIM, "act_dim": ACT_DIM, "step_s": step_s,
                                      "max_episode_steps": MAX_EPISODE_STEPS})
        .env_runners(num_env_runners=runners, num_envs_per_env_runner=envs, rollout_fragment_length=ROUND)
        .learners(num_learners=0)
        .rl_module(model_config=DefaultModelConfig(
            fcnet_hiddens=WIDTHS, fcnet_activation="relu", fusionnet_hiddens=WIDTHS[:1], head_fcnet_hiddens=[]))
        .training(
            train_batch_size_per_learner=BATCH,
            num_steps_sampled_before_learning_starts=warm_up,
            replay_buffer_config={"type": "EpisodeReplayBuffer", "capacity": BUFFER},
            training_intensity=ROUND * native_ratio,
        )
        .debugging(seed=0, log_level="ERROR")
    )
    if calculate_rr_weights(config) != [1, ROUND]:
        raise RuntimeError(f"RLlib would store/train {calculate_rr_weights(config)}, not 1 round / {ROUND} updates")
    return config


def rllib_cpu() -> dict[str, float]:
    """CPU seconds so far of every process of the cluster by kind (bench_scale.cpu_by_kind, with
    RLlib's env runner actors named as aa-ray's)."""
    seconds: dict[str, float] = defaultdict(float)
    me = psutil.Process()
    for proc in [me, *me.children(recursive=True)]:
        try:
            times = proc.cpu_times()
            kind = process_kind(proc)
            if kind == "ray" and proc.cmdline() and "EnvRunner" in proc.cmdline()[0].split(".")[0]:
                kind = "EnvRunner"
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        seconds[kind] += times.user + times.system
    return dict(seconds)


class WindowFull(Exception):
    """Raised from inside RLlib's `train()` once the window is full: its iterations run rounds until a
    second has passed, and a window may end in the middle of one."""


def rllib_run(cell: Cell, sizes: Sizes) -> Cell:
    """RLlib's SAC built on the cluster RAY_ADDRESS names, `train()` called until the window is full;
    its rounds stamped by wrapping `training_step`, its learner path by wrapping the replay buffer's
    `sample` and `LearnerGroup.update` (time inside them, counted once the window has started)."""
    import ray
    import torch

    learn = cell.measure == "loop"
    driver_threads = torch.get_num_threads()
    torch.set_num_threads(LEARNER_TORCH_THREADS)
    ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=True, runtime_env=RUNTIME_ENV)
    algo = None
    window = sizes.window(cell)
    learner_path = {"s": 0.0, "updates": 0}
    try:
        algo = rllib_config(cell.runners, cell.envs, cell.step_s, sizes.warm_up if learn else NEVER).build_algo()
        training_step = algo.training_step
        sample, update = algo.local_replay_buffer.sample, algo.learner_group.update

        def stamped_training_step() -> None:
            training_step()
            window.stamp(rllib_cpu)
            if window.last is not None:
                raise WindowFull

        def timed(call: Callable[..., Any], counts: bool) -> Callable[..., Any]:
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                start = time.perf_counter()
                result = call(*args, **kwargs)
                if window.first is not None:
                    learner_path["s"] += time.perf_counter() - start
                    learner_path["updates"] += counts
                return result
            return wrapper

        algo.training_step = stamped_training_step
        algo.local_replay_buffer.sample = timed(sample, counts=False)
        algo.learner_group.update = timed(update, counts=True)
        try:
            while True:
                algo.train()
        except WindowFull:
            pass
    except Exception as err:  # a failed cell is a result, not the end of the sweep
        cell.status = f"failed: {type(err).__name__}: {str(err)[:300]}"
        return cell
    finally:
        if algo is not None:
            algo.stop()
        ray.shutdown()
        torch.set_num_threads(driver_threads)
    if learner_path["updates"]:
        cell.ms_per_update = 1e3 * learner_path["s"] / learner_path["updates"]
    return window.fill(cell, cell.runners * cell.envs * ROUND)


# ---- the sweep --------------------------------------------------------------------------------------------------
def measure(cell: Cell, sizes: Sizes) -> Cell:
    runs = {("aa-ray", "learn"): aa_ray_learn, ("aa-ray", "collect"): aa_ray_run, ("aa-ray", "loop"): aa_ray_run}
    run = runs.get((cell.side, cell.measure), rllib_run)
    try:
        run(cell, sizes)
    except Exception as err:  # a failed cell is a result (the table says so)
        cell.status = f"failed: {type(err).__name__}: {str(err)[:300]}"
    cell.load_average = tuple(round(load, 2) for load in os.getloadavg())
    return cell


def planned(args: argparse.Namespace) -> list[Cell]:
    """Every cell in run order: per repetition, aa-ray's learner path, then for each step cost and
    runner count collection and the whole loop, the two sides alternating who goes first."""
    cells, order = [], 0
    for rep in range(args.reps):
        if "learn" in args.measures and "aa-ray" in args.sides:
            cells.append(Cell("aa-ray", "learn", 0.0, 1, 1, rep))
        for step_s in args.step_s:
            for runners in args.runners:
                for kind in [m for m in ("collect", "loop") if m in args.measures]:
                    sides = [side for side in SIDES if side in args.sides]
                    sides = sides if order % 2 == 0 else sides[::-1]
                    cells += [Cell(side, kind, step_s, runners, args.envs, rep) for side in sides]
                    order += 1
    return cells


def ratios(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (measure, step cost, runners): each side's median and the median of per-repetition
    ratios aa-ray / RLlib (for learn: RLlib's ms per update / aa-ray's, from RLlib's loop cells)."""
    ok = [c for c in cells if c["status"] == "ok"]
    by_rep = {(c["side"], c["measure"], c["step_s"], c["runners"], c["rep"]): c for c in ok}
    rows = []
    for kind in ("collect", "loop"):
        for step_s, runners in sorted({(c["step_s"], c["runners"]) for c in ok if c["measure"] == kind}):
            pairs = [tuple(by_rep.get((side, kind, step_s, runners, rep)) for side in SIDES)
                     for rep in sorted({c["rep"] for c in ok})]
            pairs = [(a, b) for a, b in pairs if a and b and b["env_steps_per_s"] > 0]
            if pairs:
                rows.append({
                    "measure": kind, "step_ms": 1e3 * step_s, "runners": runners, "reps": len(pairs),
                    "aa-ray env steps/s": statistics.median(a["env_steps_per_s"] for a, _ in pairs),
                    "RLlib env steps/s": statistics.median(b["env_steps_per_s"] for _, b in pairs),
                    "aa-ray / RLlib": statistics.median(a["env_steps_per_s"] / b["env_steps_per_s"] for a, b in pairs),
                    "aa-ray driver CPU ms/round": statistics.median(a["driver_cpu_ms_per_round"] for a, _ in pairs),
                    "RLlib driver CPU ms/round": statistics.median(b["driver_cpu_ms_per_round"] for _, b in pairs),
                    "aa-ray CPU us/step": statistics.median(a["cpu_us_per_transition"]["total"] for a, _ in pairs),
                    "RLlib CPU us/step": statistics.median(b["cpu_us_per_transition"]["total"] for _, b in pairs),
                })
    ours = {c["rep"]: c["ms_per_update"] for c in ok if c["side"] == "aa-ray" and c["measure"] == "learn"}
    theirs: dict[int, list[float]] = defaultdict(list)
    for c in ok:
        if c["side"] == "rllib" and c["measure"] == "loop" and c["ms_per_update"] > 0:
            theirs[c["rep"]].append(c["ms_per_update"])
    reps = [rep for rep in ours if theirs.get(rep)]
    if reps:
        rows.append({
            "measure": "learn", "step_ms": "-", "runners": "-", "reps": len(reps),
            "aa-ray ms/update": statistics.median(ours[rep] for rep in reps),
            "RLlib ms/update": statistics.median(statistics.median(theirs[rep]) for rep in reps),
            "RLlib / aa-ray": statistics.median(statistics.median(theirs[rep]) / ours[rep] for rep in reps),
        })
    return rows


def show(rows: list[dict[str, Any]]) -> None:
    for kind in ("collect", "loop", "learn"):
        table = [row for row in rows if row["measure"] == kind]
        if table:
            print(f"\n## {kind}")
            headers = [key for key in table[0] if key != "measure"]
            print_table(headers, [[round(v, 3) if isinstance(v, float) else v for k, v in row.items() if k != "measure"]
                                  for row in table])


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runners", type=int, nargs="+", default=[1, 2, 4, 8], help="env runner counts")
    parser.add_argument("--envs", type=int, default=1, help="envs per runner")
    parser.add_argument("--step-s", type=float, nargs="+", default=[0.0, 0.002], help="env step costs (0: free)")
    parser.add_argument("--measures", nargs="+", choices=["collect", "learn", "loop"],
                        default=["collect", "learn", "loop"])
    parser.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES))
    parser.add_argument("--rounds", type=int, default=10, help="sampling rounds per window, at least")
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds per window, at least")
    parser.add_argument("--reps", type=int, default=3, help="repetitions of every cell")
    parser.add_argument("--json", type=Path, default=None, help="results (and the cells done, on a rerun)")
    add_smoke(parser)
    args = parser.parse_args(argv)
    sizes = Sizes(args.rounds, args.seconds)
    if args.smoke:  # each code path once, one runner, a free env step, one-round windows from the end of the
        # first round (the warm-up's, in loop cells): a learning round of RLlib's (32 updates in the driver)
        # costs seconds. No collect cells: they run the loop cells' functions with learning never started,
        # and each RLlib cell builds an algorithm (about 15 CPU-s on 2 cores)
        args.runners, args.step_s, args.reps, args.rounds, args.seconds = [1], [0.0], 1, 1, 0.0
        args.measures = [measure for measure in args.measures if measure != "collect"]
        sizes = Sizes(args.rounds, args.seconds, settle=0, warm_up=ROUND)
    if args.json is not None:  # the caller's folder, not the repository's that the next line moves to
        args.json = args.json.resolve()
    os.chdir(REPO)  # scale_sim.yaml's env.py_modules is relative to the repository root
    logging.getLogger("ray.rllib").setLevel(logging.ERROR)
    info = machine_info()
    print_machine(info)
    payload: dict[str, Any] = {"machine": info, "command": command_line(), "args": vars(args), "cells": []}
    if args.json is not None and args.json.exists():  # a rerun continues: the cells done are kept
        payload["cells"] = json.loads(args.json.read_text())["cells"]
    done = {Cell(**{k: v for k, v in c.items() if k in Cell.__dataclass_fields__}).key()
            for c in payload["cells"] if c["status"] == "ok"}
    todo = [cell for cell in planned(args) if cell.key() not in done]
    print(f"# {len(todo)} cells to run, {len(done)} done earlier", flush=True)
    with simulated_cluster(1, cpus_per_node(max(args.runners), 1), lean=args.smoke):
        for cell in todo:
            measure(cell, sizes)
            payload["cells"].append(asdict(cell))
            print(f"  rep {cell.rep + 1}/{args.reps}  {cell.measure:<7s} step {cell.step_s * 1e3:g} ms  "
                  f"{cell.runners} x {cell.envs}  {cell.side:<6s}  {cell.env_steps_per_s:9.1f} env steps/s  "
                  f"{cell.ms_per_update:7.2f} ms/update  driver CPU {cell.driver_cpu_ms_per_round:6.1f} ms/round  "
                  f"{cell.rounds} rounds  load {cell.load_average[:1]}  {cell.status}", flush=True)
            payload["summary"] = ratios(payload["cells"])
            write_json(args.json, payload)
    payload["summary"] = ratios(payload["cells"])
    write_json(args.json, payload)
    show(payload["summary"])


if __name__ == "__main__":
    main()
