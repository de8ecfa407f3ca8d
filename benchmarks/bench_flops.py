"""Learner FLOP efficiency on the CPU: achieved FLOP/s of `Learner.update` divided by this core's
1-thread fp32 matmul peak, both measured in this process (the ratio the speed issue asks for).

- FLOPs per update: `torch.utils.flop_counter.FlopCounterMode` over one eager update (batch 256,
  HalfCheetah's obs 17 / act 6), as `benchmarks/gpu_check.py` counts them on a GPU.
- Rate: `Learner.update` on replay samples of `train_every` batches (one critic step per batch,
  actor and temperature once per fleet step at UTD 1), best of `--reps` timed calls, alternating
  with the peak measurement so both see the same machine state.
- Peak: the best of square fp32 matmuls of 256, 512 and 1024, 1 thread.
Specs: `sac` (256x256 MLPs) and `sac_simba` as shipped, plus `td3`; `--compile` adds compiled rows.

Run:  .venv/bin/python benchmarks/bench_flops.py [--reps 5] [--compile]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    SPECS,
    base_parser,
    command_line,
    machine_info,
    print_machine,
    print_table,
    random_transitions,
    write_json,
)
from gpu_check import ACT_DIM, OBS_DIM, flops_per_update, matmul_peak  # noqa: E402

from aa_ray.runtime.learner import Learner  # noqa: E402
from aa_ray.runtime.replay import ReplayBuffer  # noqa: E402
from aa_ray.spec.loader import load_spec  # noqa: E402

BATCH, FLEET_STEPS = 256, 10


def updates_per_s(learner: Learner, replay: ReplayBuffer) -> float:
    samples = replay.sample(FLEET_STEPS, BATCH)
    start = time.perf_counter()
    learner.update([], samples)
    return FLEET_STEPS / (time.perf_counter() - start)


def main() -> None:
    parser = base_parser(__doc__.splitlines()[0], reps=5)
    parser.add_argument("--compile", action="store_true", help="also time learners.compile=on")
    args = parser.parse_args()
    specs = ("sac", "sac_simba", "td3")
    peak_sizes, peak_s = (256, 512, 1024), 0.3  # matmuls timed for the peak, seconds per size
    if args.smoke:  # one spec, one timing; the peak from the smallest matmul's minimum repetitions
        args.reps, args.compile, specs = 1, False, ("sac",)
        peak_sizes, peak_s = (256,), 0.0
    torch.set_num_threads(1)
    info = machine_info()
    print_machine(info)
    replay = ReplayBuffer(50_000, OBS_DIM, ACT_DIM, seed=0)
    replay.add(random_transitions(50_000, OBS_DIM, ACT_DIM))
    cpu = torch.device("cpu")
    rows, results = [], {}
    for name in specs:
        for compile_setting in ("off", "on") if args.compile else ("off",):
            spec = load_spec(SPECS / f"{name}.yaml", [
                f"algo.batch_size={BATCH}", "algo.utd_ratio=1", f"algo.train_every={FLEET_STEPS}",
                f"learners.compile={compile_setting}",
            ])
            flops = flops_per_update(spec, replay.sample(1, BATCH))
            learner = Learner(spec, OBS_DIM, ACT_DIM)
            updates_per_s(learner, replay)  # warm-up (and compilation)
            rates, peaks = [], []
            for _ in range(args.reps):
                peaks.append(max(matmul_peak(cpu, peak_sizes, seconds=peak_s, labels=("fp32",)).values()))
                rates.append(updates_per_s(learner, replay))
            rate, peak = max(rates), max(peaks) * 1e12
            efficiency = flops * rate / peak
            rows.append([name, compile_setting, flops / 1e6, rate, peak / 1e9, 100 * efficiency])
            results[f"{name}/{compile_setting}"] = {"mflop_per_update": flops / 1e6, "updates_per_s": rates,
                                                   "peak_gflops": [p * 1e3 for p in peaks], "efficiency": efficiency}
    print(f"\nbatch {BATCH}, obs {OBS_DIM}, act {ACT_DIM}, 1 torch thread, best of {args.reps}")
    print_table(["spec", "compile", "MFLOP/update", "updates/s", "peak GFLOP/s", "% of peak"], rows)
    write_json(args.json, {"bench": "flops", "machine": info, "command": command_line(), "results": results})


if __name__ == "__main__":
    main()
