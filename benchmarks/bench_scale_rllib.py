"""aa-ray against RLlib 2.60's SAC (new API stack: RLModule, Learner, EnvRunner, ConnectorV2), side
by side on the same simulated Ray cluster, the same synthetic env and the same runner counts: env
steps/s of each and the ratio aa-ray / RLlib (issue 25; the goal, recorded and not asserted: aa-ray's
ceiling at least 2x RLlib's on this harness).

Both runs join one `simulated_cluster` (benchmarks/bench_scale.py: a local multi-node Ray cluster,
2 nodes by default) through RAY_ADDRESS, and step `scale_sim/Synthetic-v0` (obs 17, act 6, episodes
of 200 steps, `step_s` seconds slept per env step; 0 = the runtimes' ceiling) with R env runners of
E envs each. For every (step cost, runners, envs) the cells run back to back: aa-ray, then RLlib
(the order flips from one cell to the next and from one repetition to the next), each stopped
after `--seconds` of learning; what is reported is the steady rate from 1 s into learning to the
end (RLlib's own counter `result["env_runners"]["num_env_steps_sampled_lifetime"]`, read at every
`algo.train()`; aa-ray's env steps at its iteration ends, as bench_scale.py does).

What each side runs, and what differs (read the ratios with this in mind):
- aa-ray: `benchmarks/scale_sim.yaml` via `bench_scale.measure` / `workload(R, E, step_s=...)`:
  batch 256, replay 200k, warm-up 500 env steps, `train_every` 32 fleet steps per iteration and
  UTD 1 (aa-ray's UTD counts updates per *fleet step*, one step of all R x E envs: 32 updates per
  iteration), 64x64 tanh-Gaussian policy in the runners. Its learner is the timed plugin at
  `update_s=0`: it learns nothing and costs nothing, so what is measured is the runtime (runner
  actors, the replay actor's sampling, the learner actor's calls, the object store, the driver).
- RLlib, `--rllib-learner sac`: SACConfig on the new API stack, torch, 64x64 policy and twin-Q
  networks (`DefaultModelConfig(
            fcnet_hiddens=[64, 64], fcnet_activation="relu", fusionnet_hiddens=[64], head_fcnet_hiddens=[])`), batch 256
  (`train_batch_size_per_learner`), uniform `EpisodeReplayBuffer` of 200k, learning after 500
  sampled env steps (`num_steps_sampled_before_learning_starts`; RLlib acts with its policy during
  warm-up, aa-ray uniformly at random), `rollout_fragment_length` 32 (each round every runner steps
  each of its envs 32 times: aa-ray's `train_every`) and `training_intensity` set so that RLlib
  does 32 updates per round, i.e. the same one update per fleet step as aa-ray (RLlib's own
  default, rollout_fragment_length 1 and no training_intensity, also makes one update per fleet step
  but with a remote sampling round per fleet step). The learner is RLlib's default local one
  (`num_learners=0`: in the driver process, beside the replay buffer), doing real SAC math on the
  CPU (one torch thread in the driver for RLlib's cell, as aa-ray's learner actor has one): this
  column is what an RLlib user gets, and it is bound by that math as much as by the runtime.
- RLlib, `--rllib-learner free`: the same, with `SACTorchLearner._update` (forward, losses,
  backward, optimizer step) replaced by a no-op: RLlib's runtime still samples the replay buffer,
  runs its learner connector over the sampled episodes, logs the trained steps, updates the
  target networks and syncs weights to the runners, but computes no gradients. This is the closest
  RLlib gets to aa-ray's zero-cost learner, so aa-ray / RLlib-free is the ceiling ratio.
- Execution: RLlib's SAC `training_step` is synchronous (sample from all runners, add to the
  buffer, update, sync weights, in turn, one thread); aa-ray runs its iteration's parts as actors
  (runners, replay, learner) that overlap (`runtime.mode` of the spec, sync by default).
- Placement: aa-ray reserves one placement group (PACK) for its actors; RLlib's env runners are
  plain actors (1 CPU each) placed by Ray's default scheduler, its learner and replay buffer live
  in the driver on the head node. The JSON records which node holds each runner. Ray runs its
  worker processes (every actor of both sides) at nice 15, the driver at nice 0: on a busy machine
  RLlib's learner and replay buffer (in the driver) get the CPU before aa-ray's (actors).
- Both ship `benchmarks/scale_sim` to the workers as a `py_modules` runtime env and give workers
  one BLAS/OpenMP thread.

Run from the repository root (a 2-core machine: keep runner counts small):
    .venv/bin/python benchmarks/bench_scale_rllib.py --runners 1 4 --seconds 10 --json out.json
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import psutil

BENCHMARKS = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCHMARKS))
from _common import REPO, add_smoke, command_line, machine_info, print_machine, print_table, write_json  # noqa: E402
from bench_scale import Cell, cpus_per_node, measure, process_kind, simulated_cluster, workload  # noqa: E402

# gymnasium's "module:id": each env runner imports scale_sim (shipped as py_modules), which registers the id,
# then gym.make_vec(ENV, **env_config) as aa-ray's gym.make(id, **env.kwargs)
ENV = "scale_sim:scale_sim/Synthetic-v0"
MAX_EPISODE_STEPS = 200  # scale_sim.yaml's env.max_episode_steps
BATCH, BUFFER, TRAIN_EVERY, UTD = 256, 200_000, 32, 1
WARM_UP = max(BATCH, 500)  # bench_scale.workload's warm-up
SETTLE_S = 1.0
# RLlib's local learner runs in the driver: one torch thread there for its cell, as aa-ray's learner
# actor has (learners.torch_threads: 1); on a busy 2-core machine two intra-op threads made an update
# of these small networks 80-700 ms instead of 18
LEARNER_TORCH_THREADS = 1
MAX_LEARNING_S = 180.0  # an RLlib cell stops learning after this long, however few samples it has
SIDES = ("aa-ray", "rllib-sac", "rllib-free")


# ---- RLlib ------------------------------------------------------------------------------------------------------
def free_learner_class() -> type:
    """RLlib's SAC learner with its gradient step (`_update`: forward, losses, backward, optimizer)
    made a no-op; everything around it (connector, metrics, target updates, weight sync) stays."""
    from ray.rllib.algorithms.sac.torch.sac_torch_learner import SACTorchLearner

    class FreeSACTorchLearner(SACTorchLearner):
        def _update(self, batch: dict[str, Any]) -> tuple[Any, Any, Any]:
            return {}, {}, {}

    return FreeSACTorchLearner


def rllib_config(runners: int, envs: int, step_s: float, learner: str) -> Any:
    from ray.rllib.algorithms.dqn.dqn import calculate_rr_weights
    from ray.rllib.algorithms.sac import SACConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    updates_per_round = TRAIN_EVERY * UTD
    # RLlib's native ratio assumes the local env runner samples too: batch / (fragment x envs x (runners + 1))
    native_ratio = BATCH / (TRAIN_EVERY * envs * (runners + 1))
    config = (
        SACConfig()
        .api_stack(enable_rl_module_and_learner=True, enable_env_runner_and_connector_v2=True)
        .framework("torch")
        .environment(ENV, env_config={"obs_dim": 17, "act_dim": 6, "step_s": step_s,
                                      "max_episode_steps": MAX_EPISODE_STEPS})
        .env_runners(num_env_runners=runners, num_envs_per_env_runner=envs, rollout_fragment_length=TRAIN_EVERY)
        .learners(num_learners=0)
        .rl_module(model_config=DefaultModelConfig(
            fcnet_hiddens=[64, 64], fcnet_activation="relu", fusionnet_hiddens=[64], head_fcnet_hiddens=[]))
        .training(
            train_batch_size_per_learner=BATCH,
            num_steps_sampled_before_learning_starts=WARM_UP,
            replay_buffer_config={"type": "EpisodeReplayBuffer", "capacity": BUFFER},
            training_intensity=updates_per_round * native_ratio,
        )
        .debugging(seed=0, log_level="ERROR")
    )
    if learner == "free":
        config.learners(learner_class=free_learner_class())
    weights = calculate_rr_weights(config)
    if weights != [1, updates_per_round]:
        raise RuntimeError(f"RLlib would store/train {weights}, not 1 round / {updates_per_round} updates")
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


def runner_nodes(algo: Any) -> dict[str, list[int]]:
    import ray

    nodes = [node["NodeID"] for node in ray.nodes()]
    here = nodes.index(ray.get_runtime_context().get_node_id())
    where = algo.env_runner_group.foreach_env_runner(lambda runner: ray.get_runtime_context().get_node_id(),
                                                     local_env_runner=False)
    return {"learners": [here], "replay": [here], "runners": [nodes.index(n) for n in where]}


def enough(samples: Sequence[tuple[float, ...]], learning_since: float | None, seconds: float) -> bool:
    """RLlib's iterations can last seconds (one `training_step` is 32 updates): past `seconds` of
    learning, go on until the steady window holds two samples, for at most MAX_LEARNING_S."""
    if learning_since is None:
        return False
    learned = time.perf_counter() - learning_since
    steady = [s for s in samples if s[0] - samples[0][0] >= SETTLE_S]
    return learned >= MAX_LEARNING_S or (learned >= seconds and len(steady) >= 2)


def measure_rllib(config: dict[str, Any], seconds: float) -> Cell:
    """Build RLlib's SAC on the cluster RAY_ADDRESS names, `algo.train()` until `seconds` after
    learning started, and return the steady rate (from SETTLE_S into learning to the end)."""
    import ray
    import torch

    cell = Cell(config)
    driver_threads = torch.get_num_threads()
    torch.set_num_threads(LEARNER_TORCH_THREADS)
    ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=True, runtime_env={
        "py_modules": [str(BENCHMARKS / "scale_sim")], "env_vars": {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}})
    algo = None
    try:
        algo = rllib_config(config["runners"], config["envs"], config["step_s"], config["learner"]).build_algo()
        cell.placement = runner_nodes(algo)
        samples: list[tuple[float, int, int, float, dict[str, float]]] = []  # wall, env steps, iter, trained rows, cpu
        learning_since, iterations, result = None, 0, {}
        while not enough(samples, learning_since, seconds):
            result = algo.train()
            iterations += 1
            now = time.perf_counter()
            steps = result["env_runners"]["num_env_steps_sampled_lifetime"]
            if steps < WARM_UP:
                continue
            learning_since = learning_since or now
            trained = result.get("learners", {}).get("__all_modules__", {}).get("num_env_steps_trained_lifetime", 0)
            samples.append((now, steps, iterations, trained, rllib_cpu()))
    except Exception as err:  # a failed cell is a result, not the end of the sweep
        cell.status = f"failed: {type(err).__name__}: {str(err)[:300]}"
        return cell
    finally:
        if algo is not None:
            algo.stop()
        ray.shutdown()
        torch.set_num_threads(driver_threads)
    cell.config["timers_s"] = {key: round(value, 5) for key, value in result.get("timers", {}).items()
                               if isinstance(value, float)}
    steady = [s for s in samples if s[0] - samples[0][0] >= SETTLE_S]
    if len(steady) < 2:
        cell.status = f"too short ({len(samples)} samples)"
        return cell
    (wall0, steps0, iter0, trained0, cpu0), (wall1, steps1, iter1, trained1, cpu1) = steady[0], steady[-1]
    steps = steps1 - steps0
    cell.window_s = wall1 - wall0
    cell.env_steps_per_s = steps / cell.window_s
    cell.iterations = iter1 - iter0
    cell.driver_ms_per_iteration = 1e3 * cell.window_s / max(cell.iterations, 1)
    used = {kind: cpu1.get(kind, 0.0) - cpu0.get(kind, 0.0) for kind in set(cpu0) | set(cpu1)}
    cell.cpu_us_per_transition = {kind: 1e6 * s / steps for kind, s in sorted(used.items())} if steps else {}
    cell.cpu_us_per_transition["total"] = sum(cell.cpu_us_per_transition.values())
    cell.driver_cpu_ms_per_iteration = 1e3 * used.get("driver", 0.0) / max(cell.iterations, 1)
    fleet_steps = steps / (config["runners"] * config["envs"])
    cell.config["updates_per_fleet_step"] = round((trained1 - trained0) / BATCH / fleet_steps, 3) if steps else 0.0
    return cell


def rllib_timers(config: dict[str, Any]) -> str:
    """Where an RLlib cell's time went: RLlib's own timers (means per call, in ms) and the updates
    it made per fleet step."""
    timers = config.get("timers_s", {})
    names = {"env_runner_sampling_timer": "sample round", "replay_buffer_sampling_timer": "replay sample",
             "learner_update_timer": "learner update", "synch_weights": "weight sync"}
    parts = [f"{label} {1e3 * timers[key]:.1f}" for key, label in names.items() if key in timers]
    return (f"RLlib ms per call: {', '.join(parts) or '-'}; updates per fleet step "
            f"{config.get('updates_per_fleet_step', '-')}")


# ---- the sweep --------------------------------------------------------------------------------------------------
def measure_side(side: str, runners: int, envs: int, step_s: float, seconds: float) -> Cell:
    config: dict[str, Any] = {"side": side, "runners": runners, "envs": envs, "step_s": step_s}
    if side == "aa-ray":
        return measure(config, workload(runners, envs, step_s=step_s, update_s=0.0, batch=BATCH, utd=UTD,
                                        train_every=TRAIN_EVERY), seconds, settle_s=SETTLE_S)
    return measure_rllib({**config, "learner": side.removeprefix("rllib-")}, seconds)


def summary_rows(cells: list[dict[str, Any]], sides: Sequence[str]) -> list[dict[str, Any]]:
    """One row per (step cost, runners, envs): the median rate of each side over repetitions and the
    median of the per-repetition ratios aa-ray / RLlib."""
    groups: dict[tuple[float, int, int], dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for cell in cells:
        c = cell["config"]
        groups[(c["step_s"], c["runners"], c["envs"])][c["side"]].append(cell)
    rows = []
    for (step_s, runners, envs), by_side in groups.items():
        row: dict[str, Any] = {"step_s": step_s, "runners": runners, "envs": envs}
        for side in sides:
            rates = [c["env_steps_per_s"] for c in by_side.get(side, []) if c["status"] == "ok"]
            row[side] = statistics.median(rates) if rates else None
            row[f"{side} CPU us/step"] = statistics.median(
                [c["cpu_us_per_transition"].get("total", 0.0) for c in by_side.get(side, []) if c["status"] == "ok"]
                or [0.0])
            if side != "aa-ray":
                pairs = [a["env_steps_per_s"] / b["env_steps_per_s"] for a, b in
                         zip(by_side.get("aa-ray", []), by_side.get(side, []), strict=False)
                         if a["status"] == b["status"] == "ok" and b["env_steps_per_s"] > 0]
                row[f"aa-ray/{side}"] = statistics.median(pairs) if pairs else None
        rows.append(row)
    return rows


def show(rows: list[dict[str, Any]], sides: Sequence[str]) -> None:
    rllib = [s for s in sides if s != "aa-ray"]
    headers = ["step ms", "runners", "envs", "aa-ray env steps/s"]
    for side in rllib:
        headers += [f"{side} env steps/s", f"aa-ray/{side}"]
    headers += [f"{side} CPU us/step" for side in sides]

    def fmt(value: Any, digits: int = 0) -> Any:
        return "-" if value is None else (round(value, digits) if digits else round(value))

    table = []
    for row in rows:
        line = [row["step_s"] * 1e3, row["runners"], row["envs"], fmt(row.get("aa-ray"))]
        for side in rllib:
            ratio = row.get(f"aa-ray/{side}")
            line += [fmt(row.get(side)), "-" if ratio is None else f"{ratio:.2f}x"]
        line += [fmt(row[f"{side} CPU us/step"], 1) for side in sides]
        table.append(line)
    print_table(headers, table)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runners", type=int, nargs="+", default=[1, 2, 4, 8], help="env runner counts")
    parser.add_argument("--envs", type=int, nargs="+", default=[1], help="envs per runner")
    parser.add_argument("--step-s", type=float, nargs="+", default=[0.0], help="env step costs (0: the ceiling)")
    parser.add_argument("--seconds", type=float, default=10.0, help="learning seconds per cell")
    parser.add_argument("--reps", type=int, default=1, help="repetitions of every cell (alternating order)")
    parser.add_argument("--nodes", type=int, default=2, help="nodes of the simulated cluster")
    parser.add_argument("--rllib-learner", nargs="+", choices=["sac", "free"], default=["sac", "free"],
                        help="RLlib's learner: sac (real SAC updates on the CPU), free (no-op gradient step)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results to this JSON file")
    add_smoke(parser)
    args = parser.parse_args(argv)
    if args.smoke:  # one runner on one node, RLlib with its no-op learner, seconds per side
        args.runners, args.envs, args.step_s, args.seconds, args.reps, args.nodes, args.rllib_learner = (
            [1], [1], [0.0], 3.0, 1, 1, ["free"])
    os.chdir(REPO)  # scale_sim.yaml's env.py_modules is relative to the repository root
    logging.getLogger("ray.rllib").setLevel(logging.ERROR)
    info = machine_info()
    print_machine(info)
    sides = ["aa-ray", *(f"rllib-{learner}" for learner in args.rllib_learner)]
    print("# aa-ray's learner costs nothing here (timed plugin, update_s=0); rllib-sac does real SAC updates "
          "(64x64, batch 256) on the driver's CPU; rllib-free is RLlib with its gradient step made a no-op. "
          "Both: 1 update of batch 256 per fleet step (runners x envs env steps), 32 fleet steps per round.",
          flush=True)
    payload: dict[str, Any] = {"machine": info, "command": command_line(), "args": vars(args), "cells": []}
    cells: list[dict[str, Any]] = payload["cells"]
    with simulated_cluster(args.nodes, cpus_per_node(max(args.runners), args.nodes)):
        order = 0
        for rep in range(args.reps):
            for step_s in args.step_s:
                for runners in args.runners:
                    for envs in args.envs:
                        for side in sides if order % 2 == 0 else reversed(sides):
                            cell = measure_side(side, runners, envs, step_s, args.seconds)
                            cells.append(asdict(cell))
                            print(f"  rep {rep + 1}/{args.reps}  step {step_s * 1e3:g} ms  {runners} x {envs}  "
                                  f"{side:<10s} {cell.env_steps_per_s:10.1f} env steps/s  "
                                  f"CPU {cell.cpu_us_per_transition.get('total', 0.0):7.1f} us/step  "
                                  f"{cell.status}", flush=True)
                            if side != "aa-ray":
                                print(f"      {rllib_timers(cell.config)}", flush=True)
                            payload["summary"] = summary_rows(cells, sides)
                            write_json(args.json, payload)
                        order += 1
    print(f"\nenv steps/s, steady state after {SETTLE_S:g} s of learning, {args.seconds:g} s per cell "
          f"(median of {args.reps} rep(s); ratio = median of per-rep aa-ray / RLlib):")
    show(payload["summary"], sides)


if __name__ == "__main__":
    main()
