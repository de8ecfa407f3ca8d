"""The capacity model of docs/scaling.md: a sync-mode run's env steps/s from its shape, with the
constants fitted to what `benchmarks/bench_scale.py` measured, and its predictions checked against
the simulation.

    .venv/bin/python benchmarks/scale_model.py --ceiling c.json --efficiency e.json --replay r.json

One sync iteration (docs/architecture.md): every runner steps its E envs T times (T = train_every)
while the learner samples and trains on the previous data; then the driver collects the chunks,
publishes the weights and adds the chunks to the replay buffer.

    t_runner  = T (E (step_s + c_env) + c_act) + c_chunk          one runner's chunk, on its own core
    t_learner = T utd (update_s + B c_row)                        the sample's rows, then the updates
    t_iter    = max(t_runner, t_learner) + R E T c_add + c_iter + R c_runner
    X         = R E T / t_iter                                    env steps/s

c_add and c_row come from the replay part (rows/s through Ray, across nodes); c_env, c_act, the
fixed c_chunk + c_iter and c_runner are fitted to the zero-cost ceiling cells of one and two runners.
On a machine whose C cores every process shares (this simulation, not a cluster), the CPU the
runtime spends per transition bounds X too: X <= C / kappa(E), kappa(E) = k_env + k_act / E,
fitted to the same cells.
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
    k_env: float  # CPU s per transition, all processes (simulation's CPU bound)
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


def fit(ceiling: list[dict[str, Any]], replay: list[dict[str, Any]], cores: int, train_every: int) -> Constants:
    """Least squares over the zero-cost cells that do not saturate the cores (one and two runners),
    where the runner's chunk outlasts the learner's sample: seconds per iteration - R E T c_add =
    T (E c_env + c_act) + (c_chunk + c_iter) + R c_runner, and CPU per transition = k_env + k_act / E."""
    c_add, c_row = replay_costs(replay)
    cells = [c for c in ceiling if c["status"] == "ok" and c["config"]["runners"] <= 2]
    shape = [(c["config"]["runners"], c["config"]["envs"]) for c in cells]
    rows = np.array([[train_every * e, train_every, 1.0, r] for r, e in shape])
    seconds = np.array([c["driver_ms_per_iteration"] / 1e3 - r * e * train_every * c_add
                        for c, (r, e) in zip(cells, shape, strict=True)])
    (c_env, c_act, c_fixed, c_runner), *_ = np.linalg.lstsq(rows, seconds, rcond=None)
    cpu = np.array([[1.0, 1.0 / e] for _, e in shape])
    kappa = np.array([c["cpu_us_per_transition"]["total"] / 1e6 for c in cells])
    (k_env, k_act), *_ = np.linalg.lstsq(cpu, kappa, rcond=None)
    # the zero-cost cells cannot tell the chunk's fixed part (overlapping the learner) from the
    # driver's (not overlapping): split evenly; while the runners' chunks dominate only the sum counts
    return Constants(c_env=max(c_env, 0.0), c_act=max(c_act, 0.0), c_chunk=max(c_fixed, 0.0) / 2,
                     c_iter=max(c_fixed, 0.0) / 2, c_runner=max(c_runner, 0.0), c_row=c_row, c_add=c_add,
                     k_env=max(k_env, 0.0), k_act=max(k_act, 0.0), cores=cores)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ceiling", type=Path, required=True)
    parser.add_argument("--efficiency", type=Path, required=True)
    parser.add_argument("--replay", type=Path, required=True)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    ceiling = json.loads(args.ceiling.read_text())
    train_every = ceiling["args"]["train_every"]
    k = fit(ceiling["ceiling"], json.loads(args.replay.read_text())["replay"], args.cores, train_every)
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
