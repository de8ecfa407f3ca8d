"""The off-policy family on pusher-reach: learner updates/s relative to plain `sac` (same process,
alternating), and steps-to-solve (mean eval distance < 0.05 m) over seeds.

Run:
    .venv/bin/python benchmarks/bench_family.py --part updates          # ~2 minutes
    .venv/bin/python benchmarks/bench_family.py --part solve --seeds 3  # ~10-20 minutes per variant
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    SPECS,
    alternate,
    base_parser,
    median_ratio,
    print_table,
    random_transitions,
    run_part,
)

from aa_ray.runtime.learner import Learner  # noqa: E402
from aa_ray.runtime.replay import ReplayBuffer  # noqa: E402
from aa_ray.spec.loader import load_spec  # noqa: E402

VARIANTS = {  # name -> spec file (all on aa_ray/PusherReach-v0)
    "sac": "sac.yaml",
    "sac_simba": "sac_simba.yaml",
    "sac_bee": "sac_bee.yaml",
    "sac_dist": "sac_dist.yaml",
    "sac_dist_simba": "sac_dist_simba.yaml",
    "td3": "td3.yaml",
    "crossq": "crossq.yaml",  # critics 256 x 2
    "crossq_2048": "mujoco/crossq.yaml",  # the paper's 2048 x 2 critics
    "droq": "droq.yaml",
}
OBS_DIM, ACT_DIM = 10, 2


def learner_rate(spec_file: str, updates: int) -> Callable[[], float]:
    # one update per stacked batch (utd 1) so every variant does the same number of critic steps
    spec = load_spec(SPECS / spec_file, ["algo.utd_ratio=1", "algo.prior_data=null"])
    learner = Learner(spec, OBS_DIM, ACT_DIM)
    replay = ReplayBuffer(50_000, OBS_DIM, ACT_DIM, seed=0)
    replay.add(random_transitions(20_000, OBS_DIM, ACT_DIM))
    batch = spec.algo.batch_size

    def run() -> float:
        samples = replay.sample(updates, batch)
        start = time.perf_counter()
        learner.update([], samples)
        return updates / (time.perf_counter() - start)

    return run


def part_updates(args) -> dict:
    torch.set_num_threads(1)
    contenders = [(name, learner_rate(spec_file, args.updates)) for name, spec_file in VARIANTS.items()]
    rates = alternate(contenders, args.reps)
    rows = [[name, statistics.median(r), median_ratio(rates, name, "sac")] for name, r in rates.items()]
    print_table(["variant", "updates/s (median)", "ratio vs sac"], rows)
    return {
        "updates_per_s": {name: statistics.median(r) for name, r in rates.items()},
        "ratio_vs_sac": {row[0]: row[2] for row in rows},
    }


def part_solve(args) -> dict:
    from aa_ray.runtime.trainer import Trainer

    results = {}
    for name in args.variants or VARIANTS:
        steps = []
        for seed in range(args.seeds):
            spec = load_spec(
                SPECS / VARIANTS[name],
                [
                    f"seed={seed}",
                    "budget.env_steps=20000",
                    "budget.stop_at_eval_distance=0.05",
                    "tracking.enabled=false",
                    "checkpoint.save_replay=false",
                    "eval.every_env_steps=1000",
                    f"runtime.output_dir={args.output_dir}",
                ],
            )
            result = Trainer(spec, live=False).run()
            steps.append(result.env_steps if result.stop_reason == "target reached" else None)
            print(f"{name} seed {seed}: {steps[-1] or 'not solved in 20k'}", flush=True)
        solved = [s for s in steps if s is not None]
        results[name] = {
            "steps": steps,
            "median": statistics.median(solved) if solved else None,
            "min": min(solved, default=None),
            "max": max(solved, default=None),
        }
    print_table(
        ["variant", "steps to solve per seed", "median", "spread (min-max)"],
        [[n, r["steps"], r["median"], f"{r['min']}-{r['max']}"] for n, r in results.items()],
    )
    return results


def main() -> None:
    parser = base_parser(__doc__, reps=3)
    parser.add_argument("--part", choices=["updates", "solve"], default="updates")
    parser.add_argument("--updates", type=int, default=40, help="updates per timed repetition")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--variants", nargs="*", help="subset of variants for --part solve")
    parser.add_argument("--output-dir", default="/tmp/aa_ray_bench_family")
    args = parser.parse_args()
    if args.smoke:  # every variant's learner, one call of two updates
        args.part, args.updates, args.reps = "updates", 2, 1
    run_part(args, {"updates": part_updates, "solve": part_solve})


if __name__ == "__main__":
    main()
