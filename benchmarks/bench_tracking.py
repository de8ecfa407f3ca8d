"""Cost of MLflow tracking: the same short aa-ray run (Pendulum-v1, Ray) with tracking on and off.

- on: `Trainer(spec, live=False, track=True)` with MLFLOW_TRACKING_URI pointing at a real SQLite
  store in a temp dir (created, and its schema migrated, before any timing). The driver buffers
  every iteration's metrics and sends them with `log_batch` every `tracking.flush_every_s`
  (spec default 10 s); the run's creation (params, tags), the spec artifact, the final flush and
  the checkpoint artifacts happen outside the training loop.
- off: `track=False`.
Contenders alternate (on off, off on, on off, ...) on one embedded Ray started beforehand; torch
threads 1 in this process, 1 per actor.

Reported: env steps/s over the learning phase (as bench_end_to_end: after warm-up, to the end,
evaluation excluded) and the wall time of the whole `Trainer.run()` (actor start-up, MLflow
run creation and artifact uploads, final checkpoint included). Aim: < 5% difference in env steps/s.

Run:  .venv/bin/python benchmarks/bench_tracking.py [--reps 3] [--budget 2000]
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    SPECS,
    base_parser,
    command_line,
    machine_info,
    median_ratio,
    print_machine,
    print_table,
    write_json,
)
from _timed import actor_niceness, run_timed, start_ray, trainer_overrides  # noqa: E402

from aa_ray.spec.loader import load_spec  # noqa: E402


def main() -> None:
    parser = base_parser(__doc__.splitlines()[0], reps=3)
    parser.add_argument("--budget", type=int, default=2000, help="env steps per run")
    parser.add_argument("--warm-up", type=int, default=1000, help="random-action steps before learning")
    parser.add_argument("--verbose", action="store_true", help="show the Trainer's progress lines")
    args = parser.parse_args()
    if args.smoke:  # the inline backend at a tiny budget: the script's path without a Ray start; three
        # learning iterations (16 env steps each) after the warm-up make the learning phase
        args.reps, args.budget, args.warm_up = 1, 256, 200
    torch.set_num_threads(1)
    info = machine_info()
    print_machine(info)

    out = Path(tempfile.mkdtemp(prefix="aa_ray_bench_tracking_"))
    uri = f"sqlite:///{out / 'mlflow.db'}"
    os.environ["MLFLOW_TRACKING_URI"] = uri
    from mlflow.tracking import MlflowClient

    MlflowClient(uri).search_experiments()  # creates the store and runs its migrations, untimed
    backend = ["runtime.backend=inline"] if args.smoke else []
    spec = load_spec(SPECS / "sac_pendulum.yaml", [*trainer_overrides(args.budget, args.warm_up, None, out), *backend])
    if not args.smoke:
        start_ray(spec)
        info["ray_actor_niceness"] = actor_niceness()
    print(f"# Pendulum-v1, budget {args.budget}, warm-up {args.warm_up}, train_every {spec.algo.train_every}, "
          f"flush_every_s {spec.tracking.flush_every_s}, {args.reps} reps; MLflow store {uri}")

    quiet = not args.verbose
    results: dict[str, list[dict[str, float]]] = {"tracking on": [], "tracking off": []}
    for rep in range(args.reps):
        order = (("tracking on", True), ("tracking off", False))
        for name, track in order if rep % 2 == 0 else order[::-1]:
            r = run_timed(spec, track=track, quiet=quiet)
            results[name].append(r)
            print(f"  rep {rep + 1}/{args.reps}  {name:<13s} {r['steps_per_s']:8.1f} env steps/s  "
                  f"run() {r['run_wall_s']:6.1f} s  in tracker calls {1000 * r['log_s']:7.1f} ms  "
                  f"driver CPU {r['driver_cpu_s']:5.2f} s", flush=True)

    rates = {k: [r["steps_per_s"] for r in v] for k, v in results.items()}
    walls = {k: [1.0 / r["run_wall_s"] for r in v] for k, v in results.items()}  # as rates: higher is better
    ratio = median_ratio(rates, "tracking on", "tracking off")
    wall_ratio = 1.0 / median_ratio(walls, "tracking on", "tracking off")
    # the driver is on the critical path while it logs (actors wait for its next submission), so the
    # share of the learning window spent inside tracker calls is a direct, low-noise overhead estimate
    share = statistics.median(r["log_s"] / r["seconds"] for r in results["tracking on"])
    print("\nmedians over reps")
    print_table(
        ["contender", "env steps/s (learning)", "run() wall s", "ms in tracker calls (learning)",
         "driver CPU s (learning)"],
        [[k, statistics.median(rates[k]), statistics.median(r["run_wall_s"] for r in results[k]),
          1000 * statistics.median(r["log_s"] for r in results[k]),
          statistics.median(r["driver_cpu_s"] for r in results[k])] for k in results],
    )
    print()
    print_table(["ratio", "value"], [
        ["env steps/s, on / off (median of per-rep ratios)", ratio],
        ["run() wall time, on / off", wall_ratio],
        ["share of learning window in tracker calls (on)", share],
    ])
    verdict = "within" if abs(1 - ratio) < 0.05 else "NOT within"
    print(f"\ntracking changes learning-phase throughput by {100 * (ratio - 1):+.1f}% ({verdict} the 5% aim)")
    write_json(args.json, {
        "bench": "tracking", "machine": info, "command": command_line(), "results": results,
        "ratio_steps_per_s": ratio, "ratio_run_wall": wall_ratio, "tracker_share": share, "budget": args.budget,
    })


if __name__ == "__main__":
    main()
