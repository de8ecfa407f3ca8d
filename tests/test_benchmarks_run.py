"""Every script under benchmarks/ runs to its end at its smallest size, as `make bench` runs them:
each in a process of its own with its `--smoke` cell (or, for the two that only read measurements,
on the recorded ones in benchmarks/results: scale_model.py with --smoke's few bootstrap refits), exit
status 0 and the output it says it writes. The numbers are not checked (a smoke cell's are not
results, and CI machines are shared); that the scripts still run on today's code is. A new script
fails `test_every_script_has_a_smallest_cell` until it is given one here.

Stable-Baselines3 comes with the bench extra, not with dev: where it is missing, the scripts that
time it beside aa-ray run aa-ray's side alone and say so, which the tests check; the one script
that times SB3 alone (bench_sb3_suite.py) is skipped, saying why."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"
RECORDED = BENCHMARKS / "results" / "scale"
SB3 = importlib.util.find_spec("stable_baselines3") is not None
LEFT_OUT = "stable-baselines3 is not installed"  # what a script prints when it leaves SB3's contender out

# scripts whose smallest cell another test runs
ELSEWHERE = {
    "gpu_check.py": "tests/test_gpu_check.py runs its --dry-run",
    "bench_scale.py": "tests/test_scale_harness.py runs its tiny part",
    "bench_learner.py": "run_all.py --smoke runs its --smoke cell",
    "bench_end_to_end.py": "run_all.py --smoke runs its --smoke cell",
    "bench_tracking.py": "run_all.py --smoke runs its --smoke cell",
    "bench_scale_out.py": "run_all.py --smoke runs its --smoke cell",
}
JSON_OUT = "{json}"  # stands for a file in the test's folder, which the script must write
SMALLEST = {
    "run_all.py": ["--smoke"],
    "bench_actor_start.py": ["--smoke", "--json", JSON_OUT],
    "bench_batched.py": ["--smoke", "--json", JSON_OUT],
    "bench_env_stepping.py": ["--smoke", "--json", JSON_OUT],
    "bench_envpool_score.py": ["--smoke", "--json", JSON_OUT],
    "bench_experiments.py": ["--smoke", "--json", JSON_OUT],
    "bench_family.py": ["--smoke", "--json", JSON_OUT],
    "bench_fast_cpu.py": ["--smoke", "--json", JSON_OUT],
    "bench_flops.py": ["--smoke", "--json", JSON_OUT],
    "bench_replay_path.py": ["--smoke"],
    "bench_scale_rllib.py": ["--smoke", "--json", JSON_OUT],
    "bench_soak.py": ["--smoke", "--json", JSON_OUT],
    "check_denormals.py": ["--smoke"],
    "hostile_inputs.py": ["--smoke", "--out", JSON_OUT],
    "robot_memory.py": ["--copies", "2", "--out", JSON_OUT],
    "robot_side_by_side.py": ["--smoke", "--json", JSON_OUT],
    "bench_sb3_suite.py": [str(REPO / "specs" / "suites" / "fast_cpu.yaml"), "--smoke"],
    "plot_scale.py": ["--ceiling", str(RECORDED / "after_ceiling.json"), "--efficiency",
                      str(RECORDED / "after_eff.json"), "--gpu", str(RECORDED / "after_gpu.json"), "--out", "{png}"],
    "scale_model.py": ["--ceiling", str(RECORDED / "after_ceiling.json"), "--efficiency",
                       str(RECORDED / "after_eff.json"), "--replay", str(RECORDED / "after_replay.json"),
                       "--runner", str(RECORDED / "runner.json"), "--json", JSON_OUT, "--smoke"],
}


def run_script(script: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path / "out.json"
    args = [a.format(json=out, png=tmp_path / "out.png") for a in SMALLEST[script]]
    # a store and a working folder of the test's own: scripts that track write there, not into the repo
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, str(BENCHMARKS / script), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    print(f"{script} {' '.join(SMALLEST[script])}: exit {done.returncode} in {time.perf_counter() - start:.1f} s")
    assert done.returncode == 0, f"{script} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done, out


def test_every_script_has_a_smallest_cell() -> None:
    scripts = {path.name for path in BENCHMARKS.glob("*.py") if not path.name.startswith("_")}
    assert scripts == set(SMALLEST) | set(ELSEWHERE)


@pytest.mark.parametrize("script", sorted(set(SMALLEST) - {"run_all.py", "bench_sb3_suite.py"}))
def test_the_smallest_cell_runs(script: str, tmp_path: Path) -> None:
    done, out = run_script(script, tmp_path)
    if JSON_OUT in SMALLEST[script]:
        assert json.loads(out.read_text()), f"{script} wrote an empty result"
    if script == "plot_scale.py":
        assert (tmp_path / "out.png").read_bytes()[:4] == b"\x89PNG"
    if script == "hostile_inputs.py":
        assert all(case["handled"] for case in json.loads(out.read_text()))
    if script in ("bench_replay_path.py", "check_denormals.py"):  # they print their table only
        assert "| env steps" in done.stdout if script == "check_denormals.py" else "learner update" in done.stdout
    if script == "bench_fast_cpu.py" and not SB3:
        assert LEFT_OUT in done.stdout and json.loads(out.read_text())["ratio_vs"] == "sac (SB3 zoo settings)"


def test_make_bench_runs_every_benchmark_at_its_smallest_size(tmp_path: Path) -> None:
    """`make bench`'s script with --smoke: bench_learner, bench_end_to_end and bench_tracking (both
    timed through the Trainer's on_iteration event), bench_scale_out; none failed, the summary printed."""
    done, _ = run_script("run_all.py", tmp_path)
    assert "===== summary" in done.stdout and "failed:" not in done.stdout
    for script in ("bench_learner.py", "bench_end_to_end.py", "bench_tracking.py", "bench_scale_out.py"):
        assert f"===== {script}: exit 0" in done.stdout
    assert "tracking env steps/s, MLflow on / off" in done.stdout  # bench_tracking's stamps were taken
    if SB3:
        assert "end-to-end env steps/s, aa-ray inline te=16 / SB3" in done.stdout
    else:
        assert LEFT_OUT in done.stdout and "end-to-end against SB3: stable-baselines3 not installed" in done.stdout


@pytest.mark.skipif(not SB3, reason="bench_sb3_suite.py times Stable-Baselines3 alone, which the bench extra "
                                    "installs (pip install -e '.[bench]'); dev does not")
def test_the_sb3_suite_contender_logs_a_child_run_the_report_reads(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    run_script("bench_sb3_suite.py", tmp_path)
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (child,) = [run for run in client.search_runs([e.experiment_id for e in client.search_experiments()])
                if run.data.params.get("contender", "").startswith("stable-baselines3")]
    assert child.info.status == "FINISHED"
    assert client.get_metric_history(child.info.run_id, "eval/return")
    # 400 env steps, all inside the 5k warm-up: the learner count says SB3 has not learned yet
    assert [p.value for p in client.get_metric_history(child.info.run_id, "learner/gradient_updates")] == [0.0]
