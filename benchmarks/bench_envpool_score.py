"""Minutes to a score with EnvPool's batched envs against today's runners (issue 35, item 6).

The same spec trained twice per seed, one run after the other, inline and untracked, changing only
where the env copies come from: `runners.kind: vector` (E gymnasium copies in a sync vector env, what
aa-ray ran before batched envs) and `env.batched: envpool` (EnvPool's C++ pool of the same task, one
thread, `runners.kind: batched`). Each evaluation is stamped with the wall-clock seconds since the run
started (an API callback), after an untimed run that pays the spec's compile; reported per run:
minutes to `--target` as `aa-ray report` counts them (from the first evaluation after a gradient
update, held by the median of it and the next two), the return at the budget, and the whole run's
minutes. The learner's work is the same on both sides,
so the ratio says how much of a run's time the env path is.

Run from the repository root:
    .venv/bin/python benchmarks/bench_envpool_score.py                       # Hopper-v5, 3 seeds (~10 min)
    .venv/bin/python benchmarks/bench_envpool_score.py --quick               # 2 evaluations, seconds (CI)
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

BENCHMARKS = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCHMARKS))

from _common import SPECS, base_parser, command_line, machine_info, print_machine, print_table, write_json  # noqa: E402

from aa_ray import metric_names as m  # noqa: E402
from aa_ray.api import Experiment  # noqa: E402
from aa_ray.spec.loader import load_spec  # noqa: E402
from aa_ray.tracking.curves import Curve, reached  # noqa: E402

SOURCES = {
    "vector (today's runner)": ["runners.kind=vector"],
    "envpool (batched runner)": ["env.batched=envpool", "env.kwargs={num_threads: 1}"],
}


def timed_run(spec_file: Path, overrides: list[str]) -> dict[str, Any]:
    """One run; each evaluation's (env steps, return, seconds since the start, gradient updates so far)."""
    spec = load_spec(spec_file, overrides)
    stamps: list[tuple[int, float, float, float]] = []
    start = time.perf_counter()

    def stamp(report: Any) -> None:
        if "eval/return" in report.metrics and not report.final:  # an evaluation's report (not a checkpoint's)
            stamps.append((report.env_steps, report.metrics["eval/return"], time.perf_counter() - start,
                           report.metrics.get(m.LEARNER_GRADIENT_UPDATES, 0.0)))

    result = Experiment(spec).fit(callbacks=[stamp])
    return {"evals": stamps, "seconds": time.perf_counter() - start, "env_steps": result.env_steps}


def minutes_to(evals: list[tuple[int, float, float, float]], target: float) -> float | None:
    """`aa-ray report`'s rule (`curves.reached`): from the first evaluation after a gradient update,
    the first whose median with the next two is at or above the target."""
    learned = [steps for steps, _, _, updates in evals if updates > 0]
    curve = Curve("", np.array([e[0] for e in evals], float), np.array([e[2] for e in evals]),
                  np.array([e[1] for e in evals]), learning_from=min(learned, default=float("inf")))
    return reached(curve, target, "minutes")


def main() -> None:
    parser = base_parser(__doc__.splitlines()[0], reps=1)
    parser.add_argument("--spec", default="mujoco/fast_cpu.yaml")
    parser.add_argument("--env", default="Hopper-v5")
    parser.add_argument("--envs", type=int, default=4, help="runners.envs_per_runner on both sides")
    parser.add_argument("--env-steps", type=int, default=20_000)
    parser.add_argument("--eval-every", type=int, default=2_000)
    parser.add_argument("--target", type=float, default=347.6, help="SB3's 50k-step median on Hopper-v5 (RESULTS 20)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--quick", action="store_true", help="a few hundred env steps: the path, for CI")
    args = parser.parse_args()
    args.quick = args.quick or args.smoke
    if args.quick:
        args.env_steps, args.eval_every, args.seeds = 384, 256, [0]
    info = machine_info()
    print_machine(info)
    common = [
        f"env.id={args.env}", f"runners.envs_per_runner={args.envs}", f"budget.env_steps={args.env_steps}",
        f"eval.every_env_steps={args.eval_every}", "eval.video=false", "tracking.enabled=false",
        "runtime.backend=inline", "checkpoint.save_replay=false", f"checkpoint.every_env_steps={args.env_steps}",
        "runtime.output_dir=/tmp/aa_ray_bench_envpool_score",
    ]
    if args.quick:
        common += ["algo.warm_up_steps=128", "learners.compile=off", "eval.episodes=1"]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in SOURCES}
    if not args.quick:  # untimed: the first run on a machine compiles the spec's update (Inductor caches it)
        timed_run(SPECS / args.spec, [*common, "budget.env_steps=6000", f"eval.every_env_steps={args.eval_every}"])
    for index, seed in enumerate(args.seeds):
        order = list(SOURCES) if index % 2 == 0 else list(reversed(SOURCES))  # neither always goes first
        for name in order:
            run = timed_run(SPECS / args.spec, [*common, f"seed={seed}", *SOURCES[name]])
            run["seed"] = seed
            runs[name].append(run)
            print(f"{name} seed {seed}: {run['seconds'] / 60:.2f} min, evals {run['evals']}", flush=True)
    rows = []
    for name, done in runs.items():
        reached = [minutes_to(run["evals"], args.target) for run in done]
        rows.append([name, ", ".join("never" if r is None else f"{r:.2f}" for r in reached),
                     statistics.median(run["evals"][-1][1] for run in done),
                     statistics.median(run["seconds"] / 60 for run in done)])
    print_table(["env source", f"minutes to {args.target:g} (per seed)", "return at the budget (median)",
                 "minutes per run (median)"], rows)
    write_json(args.json, {"machine": info, "command": command_line(), "target": args.target, "runs": runs})


if __name__ == "__main__":
    main()
