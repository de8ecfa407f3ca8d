"""The capacity model of docs/scaling.md: a sync-mode run's env steps/s from its shape, with the
constants fitted to what `benchmarks/bench_scale.py` measured, and its predictions checked against
the simulation.

    .venv/bin/python benchmarks/scale_model.py --ceiling c.json --efficiency e.json --replay r.json --runner u.json

One sync iteration (docs/architecture.md): every runner steps its E envs T times (T = train_every)
while the learner samples and trains on the previous data; then the driver collects the chunks,
publishes the weights and adds the chunks to the replay buffer.

    t_runner  = T (E (step_s + c_env) + c_act) + c_chunk          one runner's chunk, on its own core
    t_learner = T utd (update_s + B c_row)                        the sample's rows, then the updates
    t_iter    = max(t_runner, t_learner) + R E T c_add + c_iter + R c_runner
    X         = R E T / t_iter                                    env steps/s

c_add and c_row come from the replay part (rows/s through Ray, across nodes), c_env and c_act from
the runner part (one runner in process); the fixed c_chunk + c_iter and c_runner are fitted to the
zero-cost ceiling cells of up to 8 runners.
On a machine whose C cores every process shares (this simulation, not a cluster), the CPU the
runtime spends per transition bounds X too: X <= C / kappa(E), kappa(E) = k_env + k_act / E,
fitted to the same cells (plus what the kernel charges a sleeping env's wake-up, from the runner part).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass
class Constants:
    c_env: float  # s per env per step, besides the step itself (gymnasium's wrappers, storing the row)
    c_act: float  # s per vector step (the policy's forward pass, the runner's bookkeeping)
    c_chunk: float  # s per chunk (the sample call, weights loading, packing the transitions)
    c_iter: float  # s per iteration of the driver and the learner's fixed costs
    c_runner: float  # s per runner per iteration on the driver (submitting, collecting, publishing)
    c_row: float  # s per sampled row (replay gather, transfer, the learner's split)
    c_add: float  # s per row added to the replay buffer (transfer and copy)
    k_env: float  # CPU s per transition, all processes, a sleeping env's wake-up included (simulation's CPU bound)
    k_act: float  # CPU s per vector step, all processes
    cores: int


def iteration_s(k: Constants, runners: int, envs: int, train_every: int, step_s: float, update_s: float = 0.0,
                batch: int = 256, utd: int = 1) -> float:
    t_runner = train_every * (envs * (step_s + k.c_env) + k.c_act) + k.c_chunk
    t_learner = train_every * utd * (update_s + batch * k.c_row)
    return max(t_runner, t_learner) + runners * envs * train_every * k.c_add + k.c_iter + runners * k.c_runner


def env_steps_per_s(k: Constants, runners: int, envs: int, train_every: int, step_s: float, update_s: float = 0.0,
                    batch: int = 256, utd: int = 1, shared_cores: bool = True) -> float:
    rate = runners * envs * train_every / iteration_s(k, runners, envs, train_every, step_s, update_s, batch, utd)
    if shared_cores:  # the simulation: every process on the same few cores
        rate = min(rate, k.cores / (k.k_env + k.k_act / envs))
    return rate


def replay_costs(replay: list[dict[str, Any]]) -> tuple[float, float]:
    """(s per added row, s per sampled row at batch 256) from the replay part's rows/s."""
    rates = {row["call"]: row["rows_per_s"] for row in replay}
    return 1.0 / rates["add"], 1.0 / rates["sample 32 x 256"]


def fit(ceiling: list[dict[str, Any]], replay: list[dict[str, Any]], runner: list[dict[str, Any]], cores: int,
        train_every: int, fit_runners: int = 8) -> Constants:
    """c_act, c_env (and a sleep's CPU) from the runner part, c_add and c_row from the replay part; the
    fixed cost per iteration and the driver's cost per runner by least squares over the zero-cost
    ceiling cells of at most `fit_runners` runners: seconds per iteration - the runner's chunk - the
    replay's adds = (c_chunk + c_iter) + R c_runner; and the CPU per transition of the same cells,
    kappa = k_env + k_act / E."""
    c_add, c_row = replay_costs(replay)
    measured = runner[-1]
    c_env, c_act, c_sleep = measured["c_env_us"] / 1e6, measured["c_act_us"] / 1e6, measured["c_sleep_us"] / 1e6
    cells = [c for c in ceiling if c["status"] == "ok" and c["config"]["runners"] <= fit_runners]
    shape = [(c["config"]["runners"], c["config"]["envs"]) for c in cells]
    rows = np.array([[1.0, r] for r, _ in shape])
    seconds = np.array([c["driver_ms_per_iteration"] / 1e3 - train_every * (e * c_env + c_act) - r * e * train_every
                        * c_add for c, (r, e) in zip(cells, shape, strict=True)])
    (c_fixed, c_runner), *_ = np.linalg.lstsq(rows, seconds, rcond=None)
    cpu = np.array([[1.0, 1.0 / e] for _, e in shape])
    kappa = np.array([c["cpu_us_per_transition"]["total"] / 1e6 for c in cells])
    (k_env, k_act), *_ = np.linalg.lstsq(cpu, kappa, rcond=None)
    # the zero-cost cells cannot tell the chunk's fixed part (overlapping the learner) from the
    # driver's (not overlapping): split evenly; while the runners' chunks dominate only the sum counts
    return Constants(c_env=c_env, c_act=c_act, c_chunk=max(c_fixed, 0.0) / 2, c_iter=max(c_fixed, 0.0) / 2,
                     c_runner=max(c_runner, 0.0), c_row=c_row, c_add=c_add, k_env=max(k_env, 0.0) + c_sleep,
                     k_act=max(k_act, 0.0), cores=cores)


# Cluster shapes to predict (docs/scaling.md). Step costs measured on this machine's CPU with
# gymnasium's own wrappers (HalfCheetah-v5 59 us, Humanoid-v5 467 us per step); the GPU update is
# LeanRL's compiled H100 SAC figure (scale_sim/timed_learner.py), one learner per GPU.
SHAPES = {
    "8 nodes x 32 CPUs + 8 GPUs": {"cpus": 8 * 32, "learners": 8},
}
TASKS = {"HalfCheetah-v5": 59e-6, "Humanoid-v5": 467e-6}
GPU_UPDATE_S = 1.4e-3


def bottleneck(k: Constants, runners: int, envs: int, train_every: int, step_s: float, update_s: float, batch: int,
               utd: int) -> tuple[float, str]:
    """(env steps/s on a cluster, one core per runner, and the term of t_iter that dominates)."""
    terms = {
        "runners (env steps and acting)": train_every * (envs * (step_s + k.c_env) + k.c_act) + k.c_chunk,
        "learner (updates and sampled rows)": train_every * utd * (update_s + batch * k.c_row),
    }
    overlapped = max(terms.values())
    first = max(terms, key=terms.__getitem__)
    serial = {
        "replay actor (adding the chunks)": runners * envs * train_every * k.c_add,
        "driver (per runner per iteration)": runners * k.c_runner + k.c_iter,
    }
    t_iter = overlapped + sum(serial.values())
    if max(serial.values()) > overlapped:
        first = max(serial, key=serial.__getitem__)
    return runners * envs * train_every / t_iter, first


def predict_shapes(k: Constants, train_every: int) -> list[dict[str, Any]]:
    rows = []
    for shape, size in SHAPES.items():
        runners = size["cpus"] - size["learners"] - 1  # a core per learner and one for the replay actor
        for task, step_s in TASKS.items():
            for envs in (1, 16):
                for batch in (256, 8192):
                    rate, first = bottleneck(k, runners, envs, train_every, step_s, GPU_UPDATE_S, batch, 1)
                    rows.append({"shape": shape, "task": task, "runners": runners, "envs": envs, "batch": batch,
                                 "env_steps_per_s": round(rate), "first_bottleneck": first})
                    print(f"  {shape}, {task}: R={runners} E={envs:>2} batch {batch:>4}, UTD 1: {rate:10,.0f} env "
                          f"steps/s, first bottleneck: {first}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ceiling", type=Path, required=True)
    parser.add_argument("--efficiency", type=Path, required=True)
    parser.add_argument("--replay", type=Path, required=True)
    parser.add_argument("--runner", type=Path, required=True)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    ceiling = json.loads(args.ceiling.read_text())
    train_every = ceiling["args"]["train_every"]
    k = fit(ceiling["ceiling"], json.loads(args.replay.read_text())["replay"],
            json.loads(args.runner.read_text())["runner"], args.cores, train_every)
    shown = {name: value if name == "cores" else f"{value * 1e6:.1f} us" for name, value in asdict(k).items()}
    print("constants:", shown)
    efficiency = json.loads(args.efficiency.read_text())
    rows = []
    for cell in efficiency["efficiency"]:
        if cell["status"] != "ok":
            continue
        config = cell["config"]
        predicted = env_steps_per_s(k, config["runners"], config["envs"], efficiency["args"]["train_every"],
                                    efficiency["args"]["step_s"])
        error = predicted / cell["env_steps_per_s"] - 1
        rows.append({**config, "measured": round(cell["env_steps_per_s"]), "predicted": round(predicted),
                     "error": round(error, 3)})
        print(f"  runners {config['runners']:>2} nodes {config['nodes']} envs {config['envs']:>2}: measured "
              f"{cell['env_steps_per_s']:8.0f}  predicted {predicted:8.0f}  error {error:+.0%}")
    if rows:
        print(f"largest error {max(abs(r['error']) for r in rows):.0%}, median "
              f"{float(np.median([abs(r['error']) for r in rows])):.0%}")
    print(f"cluster shapes (sync mode, train_every {train_every}):")
    shapes = predict_shapes(k, train_every)
    if args.json:
        args.json.write_text(json.dumps({"constants": asdict(k), "check": rows, "shapes": shapes}, indent=2))


if __name__ == "__main__":
    main()
