"""End-to-end env steps/s on Pendulum-v1: aa-ray on Ray vs Stable-Baselines3 SAC vs aa-ray's own
components in one process without Ray.

Common settings: UTD 1 (one critic + one actor + one temperature update per env step), batch
256, 256x256 MLPs, replay 100k, `--warm-up` random-action steps then learning up to `--budget`
env steps, one env, torch.set_num_threads(1) in this process (the aa-ray actors get 1 torch
thread from the spec and OMP_NUM_THREADS=1 from Ray, which sets it to an actor's CPUs).

Contenders (run alternately, A B C ..., then ... C B A, and so on):
- aa-ray (Ray): `Trainer(spec, live=False, track=False).run()` on an embedded local Ray that this
  script starts once beforehand (Ray start-up is not timed). Env runner, replay and learner are
  separate actor processes; collection of iteration k overlaps the learner's update on k-1.
- SB3: `stable_baselines3.SAC("MlpPolicy", ...)` with learning_starts=warm-up, batch 256,
  train_freq 1, gradient_steps 1, net_arch [256, 256], buffer 100k, device cpu;
  `model.learn(total_timesteps=budget)`.
- aa-ray inline: the same `Trainer` with `runtime.backend: inline`: env runner, replay and
  learner as plain objects in this process, the sync loop in order (no overlap, no Ray).
- the same two aa-ray contenders with `algo.train_every=1` (per-iteration overhead), unless
  `--skip-train-every-1`.

Reported rate: env steps/s over the learning phase only (after the warm-up, to the end), the same
window for every contender; it includes env stepping, acting, replay, updates and weight sync,
and excludes process/actor start-up, the warm-up phase, evaluation and the final checkpoint.

Run:  .venv/bin/python benchmarks/bench_end_to_end.py [--reps 3] [--budget 2000] [--warm-up 1000]
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    NO_SB3,
    SPECS,
    alternate,
    base_parser,
    command_line,
    machine_info,
    median_ratio,
    print_machine,
    print_table,
    sb3_installed,
    write_json,
)
from _timed import actor_niceness, run_timed, start_ray, trainer_overrides  # noqa: E402

from aa_ray.spec.loader import load_spec  # noqa: E402

DETAILS: dict[str, list[dict[str, float]]] = {}  # per contender: the learning-phase breakdown of each run


def breakdown(name: str, phase: dict[str, float], updates_per_iter: int) -> float:
    """Record where the learning phase's time went; returns the env steps/s."""
    iters = max(phase["iterations"], 1)
    DETAILS.setdefault(name, []).append({
        "ms_per_update_in_learner": 1000 * phase["update_s"] / (iters * updates_per_iter),
        "ms_per_iter_outside_learner": 1000 * (phase["seconds"] - phase["update_s"]) / iters,
        "ms_per_iter": 1000 * phase["seconds"] / iters,
        # this process's CPU: all of an inline run's work (its evaluation's few ms included), a Ray run's driver only
        "steps_per_cpu_s": phase["steps"] / phase["driver_cpu_s"],
    })
    return phase["steps_per_s"]


def run_aa_ray(name: str, spec, quiet: bool) -> float:
    phase = run_timed(spec, track=False, quiet=quiet)
    return breakdown(name, phase, spec.algo.train_every * spec.algo.utd_ratio)


def run_sb3(budget: int, warm_up: int, seed: int = 0) -> float:
    import gymnasium as gym
    from stable_baselines3 import SAC
    from stable_baselines3.common.callbacks import BaseCallback

    class Stamp(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.start: tuple[float, int] | None = None

        def _on_step(self) -> bool:
            if self.start is None and self.num_timesteps >= warm_up:
                self.start = (time.perf_counter(), self.num_timesteps)
                self.cpu_start = time.process_time()
            return True

    model = SAC(
        "MlpPolicy", gym.make("Pendulum-v1"), learning_starts=warm_up, batch_size=256, train_freq=1,
        gradient_steps=1, buffer_size=100_000, policy_kwargs={"net_arch": [256, 256]}, device="cpu",
        seed=seed, verbose=0,
    )
    torch.set_num_threads(1)
    callback = Stamp()
    model.learn(total_timesteps=budget, callback=callback)
    end, cpu_end = time.perf_counter(), time.process_time()
    t0, s0 = callback.start
    steps = model.num_timesteps - s0
    DETAILS.setdefault("SB3 SAC", []).append({"steps_per_cpu_s": steps / (cpu_end - callback.cpu_start)})
    return steps / (end - t0)


def main() -> None:
    parser = base_parser(__doc__.splitlines()[0], reps=3)
    parser.add_argument("--budget", type=int, default=2000, help="env steps per run")
    parser.add_argument("--warm-up", type=int, default=1000, help="random-action steps before learning")
    parser.add_argument("--skip-train-every-1", action="store_true", help="only the spec's train_every")
    parser.add_argument("--ray-worker-niceness", type=int, default=None,
                        help="set RAY_worker_niceness (Ray's default is 15) for a sensitivity check")
    parser.add_argument("--verbose", action="store_true", help="show the Trainer's progress lines")
    args = parser.parse_args()
    if args.smoke:  # the inline contenders (and SB3) at a tiny budget: the script's path without a Ray start;
        # three learning iterations (16 env steps each) after the warm-up make the learning phase
        args.reps, args.budget, args.warm_up, args.skip_train_every_1 = 1, 256, 200, True
    torch.set_num_threads(1)
    info = machine_info()
    print_machine(info)

    out = Path(tempfile.mkdtemp(prefix="aa_ray_bench_"))
    spec = load_spec(SPECS / "sac_pendulum.yaml", trainer_overrides(args.budget, args.warm_up, None, out))
    spec_te1 = load_spec(SPECS / "sac_pendulum.yaml", trainer_overrides(args.budget, args.warm_up, 1, out))
    inline_spec, inline_te1 = (
        load_spec(SPECS / "sac_pendulum.yaml", [*trainer_overrides(args.budget, args.warm_up, every, out),
                                                "runtime.backend=inline"])
        for every in (None, 1)
    )
    te = spec.algo.train_every
    if not args.smoke:
        start_ray(spec, args.ray_worker_niceness)
        info["ray_actor_niceness"] = actor_niceness()
    quiet = not args.verbose
    print(f"# Pendulum-v1, budget {args.budget}, warm-up {args.warm_up}, UTD 1, batch 256, 256x256, "
          f"spec train_every {te}, {args.reps} reps; rates = env steps/s in the learning phase")
    if not args.smoke:
        print(f"# Ray actors run at nice {info['ray_actor_niceness']}, this process (SB3, inline) at nice "
              f"{os.nice(0)}")

    ray16, noray16 = f"aa-ray Ray (train_every={te})", f"aa-ray inline (train_every={te})"
    ray1, noray1 = "aa-ray Ray (train_every=1)", "aa-ray inline (train_every=1)"
    contenders = [
        (ray16, lambda: run_aa_ray(ray16, spec, quiet)),
        ("SB3 SAC", lambda: run_sb3(args.budget, args.warm_up)),
        (noray16, lambda: run_aa_ray(noray16, inline_spec, quiet)),
    ]
    if args.smoke:
        contenders = [c for c in contenders if c[0] != ray16]
    if not sb3_installed():
        print(NO_SB3)
        contenders = [c for c in contenders if c[0] != "SB3 SAC"]
    if not args.skip_train_every_1:
        contenders += [
            (ray1, lambda: run_aa_ray(ray1, spec_te1, quiet)),
            (noray1, lambda: run_aa_ray(noray1, inline_te1, quiet)),
        ]
    names = [n for n, _ in contenders]
    rates = alternate(contenders, args.reps)

    def detail(name: str, key: str) -> float | str:
        known = [d[key] for d in DETAILS.get(name, []) if key in d]
        return statistics.median(known) if known else "-"

    print("\nenv steps/s, learning phase (median over reps); time per learner iteration: inside")
    print("Learner.update (as the learner times it) and the rest (acting/env, replay, Ray calls, weights)")
    print_table(
        ["contender", "env steps/s", "min", "max", "ms/iter", "ms/update in learner", "ms/iter outside learner",
         "env steps per CPU-s (this process)"],
        [[n, statistics.median(rates[n]), min(rates[n]), max(rates[n]), detail(n, "ms_per_iter"),
          detail(n, "ms_per_update_in_learner"), detail(n, "ms_per_iter_outside_learner"),
          detail(n, "steps_per_cpu_s")] for n in names],
    )
    def ratio(num: str, den: str) -> float | None:  # None: a contender left out (--smoke, no SB3)
        return median_ratio(rates, num, den) if num in rates and den in rates else None

    ratios = {
        f"aa-ray Ray te={te} / SB3": ratio(ray16, "SB3 SAC"),
        f"aa-ray Ray te={te} / aa-ray inline te={te}": ratio(ray16, noray16),
        f"aa-ray inline te={te} / SB3": ratio(noray16, "SB3 SAC"),
    }
    if not args.skip_train_every_1:
        ratios.update({
            "aa-ray Ray te=1 / SB3": ratio(ray1, "SB3 SAC"),
            f"aa-ray Ray te=1 / Ray te={te}": ratio(ray1, ray16),
            f"aa-ray inline te=1 / inline te={te}": ratio(noray1, noray16),
            "aa-ray Ray te=1 / inline te=1": ratio(ray1, noray1),
        })
    if noray16 in DETAILS and "SB3 SAC" in DETAILS:
        # CPU time drifts far less than wall time on a shared machine: the in-process contenders' work per env step
        ours, theirs = DETAILS[noray16], DETAILS["SB3 SAC"]
        ratios[f"aa-ray inline te={te} / SB3, env steps per CPU-second"] = statistics.median(
            a["steps_per_cpu_s"] / b["steps_per_cpu_s"] for a, b in zip(ours, theirs, strict=True))
    ratios = {name: value for name, value in ratios.items() if value is not None}
    print("\nratios (median of per-rep ratios)")
    print_table(["ratio", "value"], [[k, v] for k, v in ratios.items()])
    write_json(args.json, {
        "bench": "end_to_end", "machine": info, "command": command_line(), "rates": rates, "ratios": ratios,
        "budget": args.budget, "warm_up": args.warm_up, "train_every": te, "breakdown": DETAILS,
        "sb3": sb3_installed(), "smoke": args.smoke,
    })


if __name__ == "__main__":
    main()
