"""Run the benchmarks (each in its own process) and print a summary of their ratios.

Run:  .venv/bin/python benchmarks/run_all.py      (about 20 minutes on a quiet 2-core machine)
      .venv/bin/python benchmarks/run_all.py --smoke   (each one's smallest cell: the path, not results)
Each benchmark's own output (its tables, per-repetition rates) is shown as it runs; the
arguments used are printed so that any line of the summary can be reproduced alone.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, cpu_model, print_table  # noqa: E402

BENCHES = [
    ("bench_learner.py", ["--reps", "8", "--updates", "80"]),
    ("bench_end_to_end.py", ["--reps", "3", "--budget", "2000", "--warm-up", "1000"]),
    ("bench_tracking.py", ["--reps", "3", "--budget", "2000", "--warm-up", "1000"]),
    ("bench_scale_out.py", ["--part", "all", "--reps", "5"]),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="each benchmark's --smoke cell instead (what CI runs)")
    smoke = parser.parse_args().smoke
    here = Path(__file__).resolve().parent
    results, failed = {}, []
    with tempfile.TemporaryDirectory(prefix="aa_ray_bench_all_") as tmp:
        for script, args in BENCHES:
            args = ["--smoke"] if smoke else args
            out = Path(tmp) / f"{script}.json"
            command = [sys.executable, str(here / script), *args, "--json", str(out)]
            print(f"\n===== .venv/bin/python benchmarks/{script} {' '.join(args)}", flush=True)
            start = time.perf_counter()
            rc = subprocess.run(command, cwd=REPO).returncode
            print(f"===== {script}: exit {rc}, {time.perf_counter() - start:.0f} s", flush=True)
            if rc != 0 or not out.is_file():
                failed.append(script)
                continue
            results[script] = json.loads(out.read_text())

    rows = []
    if "bench_learner.py" in results:
        for dims, r in results["bench_learner.py"]["results"].items():
            rows.append([f"learner updates/s, ours / bare-torch reference, {dims}", r["ratio"]])
            rows.append([f"  same, update only (no sampling/conversion), {dims}", r["ratio_update_only"]])
            rows.append([f"  same, update only, vs reference with fused Adam, {dims}",
                         r["ratio_update_only_vs_fused_ref"]])
    if "bench_end_to_end.py" in results:
        if not results["bench_end_to_end.py"]["sb3"]:
            rows.append(["end-to-end against SB3: stable-baselines3 not installed (pip install -e '.[bench]')", "-"])
        for name, value in results["bench_end_to_end.py"]["ratios"].items():
            rows.append([f"end-to-end env steps/s, {name}", value])
    if "bench_tracking.py" in results:
        r = results["bench_tracking.py"]
        rows.append(["tracking env steps/s, MLflow on / off", r["ratio_steps_per_s"]])
        rows.append(["  share of learning window inside MLflow calls", r["tracker_share"]])
        rows.append(["  Trainer.run() wall time, on / off", r["ratio_run_wall"]])
    if "bench_scale_out.py" in results:
        r = results["bench_scale_out.py"]
        for name, value in r["fleet"].items():
            rows.append([f"HalfCheetah collection env steps/s, {name} / 1 runner", value["ratio"]])
        for name, value in r["replay"].items():
            rows.append([f"batches/s, {name} / one learner's consumption", value["ratio"]])
        rows.append(["learner updates/s, L=2 gloo / L=1 (same global batch)", r["ddp"]["ratio_L2_vs_L1"]])
        rows.append(["env steps/s to a fixed budget, async / sync", r["async"]["speedup_async_vs_sync"]])
        for algo, value in r["weights"].items():
            rows.append([f"{algo} weights, CPU per read in a runner: tensors / numpy arrays", value["read_ratio"]])
    print(f"\n===== summary (median ratios; machine: {cpu_model()}, see each section for rates)")
    print_table(["ratio", "value"], rows)
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
        sys.exit(1)


if __name__ == "__main__":
    main()
