"""`benchmarks/gpu_check.py --dry-run`: the GPU check's code path on the CPU at tiny sizes, so the
script a GPU box runs once, unattended, is known to work before it gets there. One run of every part
(`--part all`, as the box runs it) serves the tests of the timings, the training slice and the batched
path; the compiled row, whose subject is its own child process, has a run of its own."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu_check.py"


def run_check(tmp_path: Path, *args: str, timeout: float = 120) -> dict[str, Any]:
    out = tmp_path / "gpu_check.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run", "--out", str(out), *args],
        capture_output=True, text=True, cwd=REPO, timeout=timeout,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert out.with_suffix(".md").is_file()
    result = json.loads(out.read_text())
    # what the GPU box lacks: the inline, untracked path must not import them
    assert result["loaded"] == {"ray": False, "mlflow": False}
    return result


@pytest.fixture(scope="module")
def all_parts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The result of one dry run of all three parts: eager timing rows only, a 5 s training slice
    given a budget it cannot reach, and the batched path."""
    # `all` reserves the train part's seconds (5 + 10) and the batched part's (4 x 1 + 5) out of the
    # total before the timings start: 114 s leaves the timings the 90 s they had when run alone. The
    # slice and the batched cells are sized by their own flags (5 s, 1 s), whatever the total.
    return run_check(tmp_path_factory.mktemp("all"), "--part", "all", "--compile", "off", "--total-s", "114",
                     "--train-s", "5", "--train-set", "budget.env_steps=1000000", timeout=300)


def test_timings_dry_run_gives_every_row(all_parts: dict[str, Any]) -> None:
    """Every eager row of the table (each algo x precision), with FLOPs, rate and share of the peak."""
    result = all_parts
    assert result["status"] == "ok", result
    assert {"fp32_256", "bf16_256"} <= set(result["matmul_peak_tflops"])
    assert all(value > 0 for value in result["matmul_peak_tflops"].values())
    rows = result["timings"]
    grid = {(r["algo"], r["batch"], r["compile"], r["precision"]) for r in rows}
    assert grid == {(algo, 32, "off", precision) for algo in ("sac", "sac_simba") for precision in ("fp32", "bf16")}
    for row in rows:
        assert row["status"] == "ok", row
        assert row["gflop_per_update"] > 0
        assert row["updates_per_s"] > 0 and row["transitions_per_s"] == row["updates_per_s"] * 32
        assert row["tflops"] > 0 and row["percent_of_peak"] > 0
    # the same math whatever the precision: one FLOP count per (algo, batch)
    for algo in ("sac", "sac_simba"):
        assert len({r["gflop_per_update"] for r in rows if r["algo"] == algo}) == 1


def test_a_compiled_config_is_timed_in_a_child_process_of_its_own(tmp_path: Path) -> None:
    """A compiled row comes back from a child process (a compile cut short leaves torch's state
    undefined, so no later row may share its process), timed or cut short by the child's own cap:
    at 1 s, a cold CPU compile is cut short; a row the parent had to kill fails here."""
    args = ("--part", "timings", "--algos", "sac", "--compile", "on", "--precisions", "fp32", "--compile-cap-s", "1")
    result = run_check(tmp_path, *args)
    assert result["status"] == "ok", result
    (row,) = result["timings"]
    assert (row["algo"], row["compile"], row["gflop_per_update"] > 0) == ("sac", "on", True), row
    if row["status"] != "ok":
        assert row["status"].startswith("compile timed out (took more than"), row
    else:
        assert row["updates_per_s"] > 0 and row["tflops"] > 0


def test_train_dry_run_trains_inline_until_the_deadline(all_parts: dict[str, Any]) -> None:
    """The training slice with runtime.backend inline and tracking off, on Pendulum-v1, given a
    budget it cannot reach: the wall-clock deadline stops it, after one last evaluation."""
    train = all_parts["train"]
    assert train["status"] == "ok", train
    assert train["deadline_installed"] and train["stop_reason"] == "wall-clock slice"
    assert 64 < train["env_steps"] < 1_000_000 and train["env_steps_per_s"] > 0  # past the 64-step warm-up
    assert train["critic_updates"] > 0 and train["learning_env_steps_per_s"] > 0
    assert math.isfinite(train["last_eval_return"]) and train["last_eval_at_env_steps"] == train["env_steps"]


def test_batched_dry_run_measures_the_device_path(all_parts: dict[str, Any]) -> None:
    """The FastTD3 recipe on PointReach copies (on the CPU here): the simulator alone, collection and
    whole iterations, each slower than the last, and the learner's busy share of them."""
    result = all_parts
    batched = result["batched"]
    assert result["status"] == "ok" and batched["status"] == "ok", batched
    assert "algo.name=fast_td3" in batched["overrides"] and "runtime.mode=device" in batched["overrides"]
    rates = [batched[key] for key in ("simulator_env_steps_per_s", "collect_env_steps_per_s", "learn_env_steps_per_s")]
    assert all(rate > 0 for rate in rates) and rates[0] > rates[1] > rates[2], rates  # each adds work to the last
    assert 0 < batched["learner_busy_share"] <= 1
