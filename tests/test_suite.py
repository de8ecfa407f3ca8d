"""Benchmark suites end to end on a real local Ray, real Tune, real gymnasium envs (pusher-reach, Pendulum) and a
real MLflow store, with tiny budgets: one parent run with a child per (spec, env, seed), an
invocation killed mid-suite and run again (finished runs are not run again, the others resume),
and the report with published markers, the equal-steps table and the IQM across envs. Bad suite
files are refused before anything starts."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import yaml
from mlflow.tracking import MlflowClient

from aa_ray import cli
from aa_ray.spec.loader import SpecError
from aa_ray.tracking.curves import load_curve
from aa_ray.tracking.report import make_report
from aa_ray.tune.specs import load_suite

ROOT = Path(__file__).resolve().parents[1]
PUSHER, PENDULUM = "aa_ray/PusherReach-v0", "Pendulum-v1"
TINY = {"algo.actor_hidden_dims": [32, 32], "algo.critic_hidden_dims": [32, 32], "algo.batch_size": 64,
        "algo.warm_up_steps": 200, "algo.buffer_size": 5000, "checkpoint.every_env_steps": 300}
# markers at 300 env steps (an evaluation step of every run) and the normalization constants
REFERENCES = {
    "normalization": {"Pendulum": {"random": -1500.0, "reference": -150.0, "source": "test"}},
    "returns": [{"algo": "sac", "env": "Pendulum", "env_version": "v1", "env_steps": 300, "return": -1000.0,
                 "source_label": "test paper", "source": "test"},
                {"algo": "sac", "env": "Pendulum", "env_version": "v1", "env_steps": 100000, "return": -150.0,
                 "source_label": "test paper", "source": "test"}],
}


def write(path: Path, document: dict) -> Path:
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def tiny_suite(folder: Path, **changes: object) -> Path:
    write(folder / "references.yaml", REFERENCES)
    return write(folder / "suite.yaml", {
        "name": "tiny", "specs": {"sac": str(ROOT / "specs" / "sac.yaml")},
        # the short pusher runs come first, so the kill below finds them finished and pendulum mid-run
        "envs": {PUSHER: {"budget.env_steps": 400}, PENDULUM: {}},
        "seeds": [0, 1], "env_steps": 1500, "eval": {"every_env_steps": 300, "episodes": 2},
        "set": TINY, "references": "references.yaml", "max_concurrent_trials": 2, **changes,
    })


def newest_per_step(history: list) -> tuple[list[int], list[float]]:
    """A metric's curve; a run resumed from a checkpoint logs the steps after it again (newest counts)."""
    latest = {p.step: p.value for p in sorted(history, key=lambda p: (p.step, p.timestamp))}
    return list(latest), list(latest.values())


def kill_tree(process: subprocess.Popen) -> None:
    """SIGKILL the invocation and everything it started (the embedded Ray's daemons and workers)."""
    family = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
    for member in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            member.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    psutil.wait_procs([p for p in family if p.is_running()], timeout=30)


def test_suite_killed_and_resumed_then_reported(tmp_path: Path) -> None:
    suite_file = tiny_suite(tmp_path)
    root = tmp_path / "runs" / "suites" / "tiny"
    command = [sys.executable, "-m", "aa_ray.cli", "suite", str(suite_file)]
    first = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + 400
    while time.monotonic() < deadline:  # both pusher runs finished, a pendulum run checkpointed but not done
        records = list(root.glob("sac-aa_ray_PusherReach-v0-*/cell.json"))
        pendulum = [d for d in root.glob("sac-Pendulum-v1-*")
                    if [c for c in d.glob("checkpoints/step_*") if "." not in c.name]]  # complete ones only
        if len(records) == 2 and pendulum and not list(root.glob("sac-Pendulum-v1-*/checkpoints/final")):
            break
        assert first.poll() is None, "the suite ended before it could be interrupted"
        time.sleep(0.2)
    else:
        pytest.fail("the suite never reached the point to interrupt it")
    kill_tree(first)
    finished_before = {p.parent.name: p.read_text() for p in root.glob("*/cell.json")}
    parent_id = json.loads((root / "suite.json").read_text())["parent_run_id"]
    client = MlflowClient()
    pusher_history = {
        run.data.tags["aa_ray.suite_cell"]: [(p.step, p.value) for p in client.get_metric_history(run.info.run_id,
                                                                                                   "eval/return")]
        for run in client.search_runs([client.get_run(parent_id).info.experiment_id],
                                      f"tags.`mlflow.parentRunId` = '{parent_id}'")
        if run.data.tags["aa_ray.suite_env"] == PUSHER
    }

    second = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "4 runs, 2 finished earlier, 2 to run" in second.stdout
    assert "resuming from step_" in second.stdout  # the checkpointed pendulum run went on from there
    assert json.loads((root / "suite.json").read_text())["parent_run_id"] == parent_id  # the same parent
    for name, text in finished_before.items():  # not run again
        assert (root / name / "cell.json").read_text() == text

    experiment = client.get_run(parent_id).info.experiment_id
    children = client.search_runs([experiment], f"tags.`mlflow.parentRunId` = '{parent_id}'")
    cells = sorted(run.data.tags["aa_ray.suite_cell"] for run in children)
    assert cells == ["sac-Pendulum-v1-s0", "sac-Pendulum-v1-s1", "sac-aa_ray_PusherReach-v0-s0",
                     "sac-aa_ray_PusherReach-v0-s1"]
    assert {run.info.status for run in children} == {"FINISHED"}
    assert client.get_run(parent_id).info.status == "FINISHED"
    for run in children:
        history = client.get_metric_history(run.info.run_id, "eval/return")
        budget = 400 if run.data.tags["aa_ray.suite_env"] == PUSHER else 1500
        assert max(p.step for p in history) >= budget
        assert run.data.params["seed"] == run.data.tags["aa_ray.suite_seed"]
        if run.data.tags["aa_ray.suite_env"] == PUSHER:  # nothing logged into the finished runs again
            assert [(p.step, p.value) for p in history] == pusher_history[run.data.tags["aa_ray.suite_cell"]]

    report = make_report(tmp_path / "report", parent=parent_id)
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    pendulum = [run for run in children if run.data.tags["aa_ray.suite_env"] == PENDULUM]
    curves = [newest_per_step(client.get_metric_history(run.info.run_id, "eval/return")) for run in pendulum]
    at_300 = [np.interp(300, steps, values) for steps, values in curves]
    (row,) = summary["comparison"]  # the 100k marker is past the runs' budget: no row for it
    assert (row["env"], row["ours"], row["env_steps"], row["published"]) == (PENDULUM, "sac", 300, -1000.0)
    assert row["ours_median"] == pytest.approx(float(np.median(at_300)))
    assert [m["env_steps"] for m in summary["markers"][PENDULUM]] == [300, 100000]
    assert summary["markers"][PUSHER] == []
    (iqm,) = summary["iqm"]  # pendulum alone has normalization constants
    assert (iqm["ours"], iqm["runs"], iqm["envs"]) == ("sac", 2, 1)
    assert iqm["ci95_low"] <= iqm["iqm_normalized"] <= iqm["ci95_high"]
    scores = [(np.interp(summary["score_steps"][PENDULUM], steps, values) + 1500) / 1350 for steps, values in curves]
    assert iqm["iqm_normalized"] == pytest.approx(np.mean(scores))  # 2 runs: the IQM is their mean
    assert set(summary["curves"]) == {PENDULUM, PUSHER}
    assert report["png"].stat().st_size > 10_000
    logged = {a.path for a in client.list_artifacts(parent_id, "report")}
    assert logged == {"report/report.png", "report/report.html", "report/summary.json"}


def test_a_resumed_runs_curve_is_its_newest_attempt() -> None:
    """Interrupted after evaluating at 35,020 and 40,004 but checkpointed at 30,017, a run resumed
    from there evaluates at 40,036: the first attempt's 35,020 and 40,004 are not part of the curve.
    A step logged again (an older run, resumed before the marker existed) keeps its newest value."""
    client = MlflowClient()
    run_id = client.create_run(client.create_experiment("curves")).info.run_id
    clock = iter(range(1_000_000, 2_000_000, 1000))
    for step, value in [(30017, 345.3), (35020, 555.4), (40004, 1011.7)]:
        client.log_metric(run_id, "eval/return", value, timestamp=next(clock), step=step)
    client.log_metric(run_id, "run/resumed_at", 30017, timestamp=next(clock), step=30017)
    for step, value in [(40036, 752.0), (45014, 27.8), (45014, 30.5), (50022, 986.4)]:
        client.log_metric(run_id, "eval/return", value, timestamp=next(clock), step=step)
    curve = load_curve(client, client.get_run(run_id), "eval/return")
    assert curve.steps.tolist() == [30017, 40036, 45014, 50022]
    assert curve.values.tolist() == [345.3, 752.0, 30.5, 986.4]


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"seeds": [0, 0]}, "seeds repeat a value"),
        ({"envs": {PENDULUM: {"algo.batch_size": -1}}}, "sac-Pendulum-v1-s0"),
        ({"envs": {PENDULUM: {"algo.no_such_knob": 1}}}, "no_such_knob"),
        ({"references": "missing.yaml"}, "missing.yaml"),
        ({"specs": {"sac": "nowhere.yaml"}}, "nowhere.yaml"),
        ({"unknown_section": 1}, "unknown_section"),
    ],
)
def test_bad_suites_are_refused_before_anything_runs(tmp_path: Path, change: dict, expected: str,
                                                     capsys: pytest.CaptureFixture) -> None:
    suite_file = tiny_suite(tmp_path, **change)
    with pytest.raises(SpecError, match=expected.replace(".", r"\.")):
        load_suite(suite_file)
    assert cli.main(["suite", str(suite_file)]) == 2
    assert expected in capsys.readouterr().err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "mlflow.db").exists()


def test_only_names_a_label_or_env_of_the_suite(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    suite_file = tiny_suite(tmp_path)
    assert cli.main(["suite", str(suite_file), "--only", "Walker2d-v5"]) == 2
    assert "--only Walker2d-v5: not a spec label or env id of the suite (labels sac;" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "mlflow.db").exists()
