"""GPU check: sac_simba learner updates/s on CUDA at batch 8192 (the SimbaV2 paper's regime is
large batches on one accelerator). Skips cleanly, exit status 0, where torch sees no CUDA device.

Run:
    .venv/bin/python benchmarks/gpu_check.py [--updates 200] [--batch 8192] [--precision bf16]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
OBS_DIM, ACT_DIM = 17, 6  # HalfCheetah-v5's sizes: a realistic network input


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--updates", type=int, default=200)
    parser.add_argument("--batch", type=int, default=8192)
    parser.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_check: skipped, torch sees no CUDA device on this machine")
        return 0

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _common import random_transitions

    from aa_ray.runtime.learner import Learner
    from aa_ray.runtime.replay import ReplayBuffer
    from aa_ray.spec.loader import load_spec

    spec = load_spec(
        REPO / "specs" / "sac_simba.yaml",
        ["learners.gpus_per_learner=1", f"algo.batch_size={args.batch}", "algo.utd_ratio=1",
         f"algo.precision={args.precision}", "algo.buffer_size=200000"],
    )
    learner = Learner(spec, OBS_DIM, ACT_DIM)
    replay = ReplayBuffer(200_000, OBS_DIM, ACT_DIM, seed=0)
    replay.add(random_transitions(200_000, OBS_DIM, ACT_DIM))
    chunk = 20
    learner.update(replay.sample(chunk, args.batch), [])  # warm-up: CUDA context, kernels, allocator
    torch.cuda.synchronize()
    elapsed = 0.0
    for _ in range(args.updates // chunk):
        samples = replay.sample(chunk, args.batch)
        start = time.perf_counter()
        learner.update(samples, [])
        torch.cuda.synchronize()
        elapsed += time.perf_counter() - start
    done = (args.updates // chunk) * chunk
    print(
        f"gpu_check: {torch.cuda.get_device_name(0)}  sac_simba  batch {args.batch}  {args.precision}  "
        f"{done / elapsed:.1f} updates/s ({done * args.batch / elapsed:,.0f} transitions/s; "
        "host-to-device copies included)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
