"""Sample efficiency on pusher-reach (solved: mean final eval distance < 0.05 m), measured in env
steps so the numbers do not depend on the machine:

- `--part ppo`: PPO (specs/ppo.yaml) vs SAC (specs/sac.yaml), steps to solve over seeds, both in
  this session. The seed tutorial's anchor: SAC 18k, PPO not within 200k.
- `--part pipeline`: the full pipeline specs/pipelines/pusher_rlpd.yaml (PPO -> 100 rollout
  episodes of its policy -> RLPD); the RLPD stage's *online* env steps to solve vs SAC from
  scratch with the same evaluation cadence (every 500 steps), SAC run in this session.

Run:
    .venv/bin/python benchmarks/bench_experiments.py --part ppo --seeds 3       # ~20 minutes
    .venv/bin/python benchmarks/bench_experiments.py --part pipeline --seeds 3  # ~15 minutes
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import SPECS, base_parser, print_table, run_part  # noqa: E402

from aa_ray.runtime.trainer import Trainer  # noqa: E402
from aa_ray.spec.loader import load_spec  # noqa: E402

SOLVED = "budget.stop_at_eval_distance=0.05"
SMOKE_RUN = ("runtime.backend=inline", "eval.episodes=1")


def steps_to_solve(spec_file: str, seed: int, budget: int, eval_every: int, output_dir: str,
                   extra: tuple[str, ...] = ()) -> int | None:
    spec = load_spec(SPECS / spec_file, [
        f"seed={seed}", f"budget.env_steps={budget}", SOLVED, f"eval.every_env_steps={eval_every}",
        "tracking.enabled=false", "checkpoint.save_replay=false", "checkpoint.every_env_steps=null",
        f"runtime.output_dir={output_dir}", *extra,
    ])
    result = Trainer(spec, live=False).run()
    distances = [round(e["eval/distance"], 3) for e in result.evals]
    solved = result.env_steps if result.stop_reason == "target reached" else None
    print(f"{spec_file} seed {seed}: {solved or f'not solved in {budget:,}'}; last evals {distances[-5:]}", flush=True)
    return solved


def summarize(steps: list[int | None]) -> dict:
    solved = [s for s in steps if s is not None]
    return {"steps": steps, "median": statistics.median(solved) if solved else None,
            "min": min(solved, default=None), "max": max(solved, default=None)}


def part_ppo(args) -> dict:
    # smoke: SAC learns for 100 env steps after its warm-up, evaluating once at the end
    sac_budget, sac_eval, ppo_eval = (300, 300, args.ppo_budget) if args.smoke else (20_000, 1_000, 10_000)
    extra = SMOKE_RUN if args.smoke else ()
    results = {
        "sac": summarize([steps_to_solve("sac.yaml", s, sac_budget, sac_eval, args.output_dir,
                                         (*extra, "algo.warm_up_steps=200") if args.smoke else ())
                          for s in range(args.seeds)]),
        "ppo": summarize([steps_to_solve("ppo.yaml", s, args.ppo_budget, ppo_eval, args.output_dir, extra)
                          for s in range(args.seeds)]),
    }
    print_table(["algorithm", "steps to solve per seed", "median", "spread (min-max)"],
                [[n, r["steps"], r["median"], f"{r['min']}-{r['max']}"] for n, r in results.items()])
    return results


def part_pipeline(args) -> dict:
    from mlflow.tracking import MlflowClient

    from aa_ray.tune.pipeline import run_pipeline
    from aa_ray.tune.specs import load_pipeline

    rlpd, sac = [], []
    home = os.getcwd()
    for seed in range(args.seeds):
        with tempfile.TemporaryDirectory() as folder:
            os.chdir(folder)  # a fresh stage cache and MLflow store per seed
            os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{folder}/mlflow.db"
            document = yaml.safe_load((SPECS / "pipelines" / "pusher_rlpd.yaml").read_text())
            for stage in document["stages"].values():
                if "spec" in stage:
                    stage["spec"] = str(SPECS / "pipelines" / stage["spec"])
                if stage["kind"] == "train":
                    stage["set"]["seed"] = seed
            pipeline_file = Path(folder) / "pipeline.yaml"
            pipeline_file.write_text(yaml.safe_dump(document))
            outcome = run_pipeline(load_pipeline(pipeline_file))
            client = MlflowClient()
            history = client.get_metric_history(outcome["stages"]["rlpd"]["mlflow_run_id"], "eval/distance")
            solved = [m.step for m in sorted(history, key=lambda m: m.step) if m.value < 0.05]
            rlpd.append(solved[0] if solved else None)
            dataset = client.get_run(outcome["stages"]["rollouts"]["mlflow_run_id"]).data.metrics
            print(f"pipeline seed {seed}: rlpd solved at {rlpd[-1]}; dataset mean distance "
                  f"{dataset.get('rollout/mean_distance')}", flush=True)
            os.chdir(home)  # before the folder goes
        sac.append(steps_to_solve("sac.yaml", seed, 20_000, 500, args.output_dir))
    results = {"rlpd_stage": summarize(rlpd), "sac_from_scratch": summarize(sac)}
    print_table(["run", "online steps to solve per seed", "median", "spread (min-max)"],
                [[n, r["steps"], r["median"], f"{r['min']}-{r['max']}"] for n, r in results.items()])
    return results


def main() -> None:
    parser = base_parser(__doc__, reps=1)
    parser.add_argument("--part", choices=["ppo", "pipeline"], default="ppo")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--ppo-budget", type=int, default=500_000)
    parser.add_argument("--output-dir", default="/tmp/aa_ray_bench_experiments")
    args = parser.parse_args()
    if args.smoke:  # one seed of each, a few hundred env steps (PPO: one update), in this process: the path
        args.part, args.seeds, args.ppo_budget = "ppo", 1, 1024
    run_part(args, {"ppo": part_ppo, "pipeline": part_pipeline})


if __name__ == "__main__":
    main()
