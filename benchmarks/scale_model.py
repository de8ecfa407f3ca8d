"""The capacity model of docs/scaling.md: a sync-mode run's env steps/s from its shape, with the
constants fitted to what `benchmarks/bench_scale.py` measured, and its predictions checked against
the simulation.

    .venv/bin/python benchmarks/scale_model.py --ceiling c.json --efficiency e.json [--gpu g.json]

One sync iteration (docs/architecture.md): every runner steps its E envs T times (T = train_every)
while the learner trains on the previous data; then the driver collects, publishes and adds.

    t_runner  = T * (E * (step_s + c_env) + c_act) + c_chunk        one runner's chunk (its own core)
    t_learner = T * utd * update_s + T * utd * B * c_row            the updates and the sample's rows
    t_iter    = max(t_runner, t_learner) + c_iter + R * c_runner    the driver's share does not overlap
    X         = R * E * T / t_iter                                  env steps/s

and on a machine with C cores shared by everything (the simulation here, not a cluster), the CPU
the runtime spends per transition bounds it: X <= C / kappa(E), kappa(E) = k_env + k_act / E.
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
    k_env: float  # CPU s per transition, all processes (simulation's CPU bound)
    k_act: float  # CPU s per vector step, all processes
    cores: int


def iteration_s(k: Constants, runners: int, envs: int, train_every: int, step_s: float, update_s: float = 0.0,
                batch: int = 256, utd: int = 1) -> float:
    t_runner = train_every * (envs * (step_s + k.c_env) + k.c_act) + k.c_chunk
    t_learner = train_every * utd * (update_s + batch * k.c_row)
    return max(t_runner, t_learner) + k.c_iter + runners * k.c_runner


def env_steps_per_s(k: Constants, runners: int, envs: int, train_every: int, step_s: float, update_s: float = 0.0,
                    batch: int = 256, utd: int = 1, shared_cores: bool = True) -> float:
    rate = runners * envs * train_every / iteration_s(k, runners, envs, train_every, step_s, update_s, batch, utd)
    if shared_cores:  # the simulation: every process on the same few cores
        rate = min(rate, k.cores / (k.k_env + k.k_act / envs))
    return rate


def fit(ceiling: list[dict[str, Any]], cores: int, train_every: int) -> Constants:
    """Least squares over the zero-cost cells that do not saturate the cores (one and two runners):
    seconds per iteration = T (E c_env + c_act) + c_chunk + c_iter + R c_runner, and CPU per
    transition = k_env + k_act / E."""
    cells = [c for c in ceiling if c["status"] == "ok" and c["config"]["runners"] <= 2]
    rows = np.array([[train_every * c["config"]["envs"], train_every, 1.0, c["config"]["runners"]] for c in cells])
    seconds = np.array([c["driver_ms_per_iteration"] / 1e3 for c in cells])
    (c_env, c_act, c_fixed, c_runner), *_ = np.linalg.lstsq(rows, seconds, rcond=None)
    cpu = np.array([[1.0, 1.0 / c["config"]["envs"]] for c in cells])
    kappa = np.array([c["cpu_us_per_transition"]["total"] / 1e6 for c in cells])
    (k_env, k_act), *_ = np.linalg.lstsq(cpu, kappa, rcond=None)
    # the fixed part is split between the chunk (overlaps the learner) and the driver (does not) as the
    # zero-cost cells cannot tell them apart; the prediction only needs their sum while t_runner dominates
    return Constants(c_env=max(c_env, 0.0), c_act=max(c_act, 0.0), c_chunk=max(c_fixed, 0.0) / 2,
                     c_iter=max(c_fixed, 0.0) / 2, c_runner=max(c_runner, 0.0), c_row=0.0,
                     k_env=max(k_env, 0.0), k_act=max(k_act, 0.0), cores=cores)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ceiling", type=Path, required=True)
    parser.add_argument("--efficiency", type=Path, required=True)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    ceiling = json.loads(args.ceiling.read_text())
    train_every = ceiling["args"]["train_every"]
    k = fit(ceiling["ceiling"], args.cores, train_every)
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
    if args.json:
        args.json.write_text(json.dumps({"constants": asdict(k), "check": rows}, indent=2))


if __name__ == "__main__":
    main()
