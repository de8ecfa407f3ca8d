"""Memory per copy of a robot task through aa-ray's EnvPool adapter: for each count of copies, a fresh
process makes the adapter, resets it with a seed (which makes the pool) and steps it a few times;
what that added to the process's resident memory, over the count, is the cost of one copy. The
figure a run's memory estimate and `runners.envs_per_runner` have to live with (issue 56).

    .venv/bin/python benchmarks/robot_memory.py [--task Go1JoystickFlatTerrain-v1] [--copies 8 32 64]
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import sys, psutil, torch
from aa_ray.envs.batched import make_batched_env
process = psutil.Process()
before = process.memory_info().rss
envs = make_batched_env("envpool", sys.argv[1], int(sys.argv[2]), num_threads=1)
envs.reset(seed=12345)
for _ in range(5):
    envs.step(torch.zeros(envs.num_envs, envs.act_dim))
print(process.memory_info().rss - before)
"""


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="Go1JoystickFlatTerrain-v1")
    parser.add_argument("--copies", type=int, nargs="+", default=[8, 32, 64])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "robot_memory.json")
    args = parser.parse_args()
    rows = []
    for copies in args.copies:
        added = int(subprocess.run([sys.executable, "-c", PROBE, args.task, str(copies)], capture_output=True,
                                   text=True, check=True, timeout=900).stdout.split()[-1])
        rows.append({"task": args.task, "copies": copies, "added_mib": round(added / 2**20),
                     "mib_per_copy": round(added / 2**20 / copies, 1)})
        row = rows[-1]
        print(f"{args.task}  {copies:>5} copies  {row['added_mib']:>6} MiB  {row['mib_per_copy']:>6} MiB a copy",
              flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"cpu": cpu_model(), "command": " ".join(sys.argv), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
