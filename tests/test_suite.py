"""Benchmark suites end to end on a real local Ray, real Tune, real gymnasium envs (pusher-reach, Pendulum) and a
real MLflow store, with tiny budgets: one parent run with a child per (spec, env, seed), stopped by
SIGTERM, resumed, SIGKILLed and run again (finished runs are not run again, the others resume), and
the report with published markers, the equal-steps table and the IQM across envs. Bad suite
files are refused before anything starts."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from html import escape
from pathlib import Path

import numpy as np
import psutil
import pytest
import yaml
from mlflow.tracking import MlflowClient
from stopping import assert_event_lines, has_step_checkpoint, stop_with_sigterm, wait_for

from aa_ray import cli
from aa_ray.errors import SpecError
from aa_ray.runtime.run_record import STOP_REASON_TAG
from aa_ray.spec.loader import load_spec
from aa_ray.tracking.curves import NOT_REACHED, load_curve
from aa_ray.tracking.machine import CPU_COUNT_TAG, CPU_TAG, HOST_TAG, machine_tags
from aa_ray.tracking.mlflow_tracker import PARENT_TAG, MlflowTracker
from aa_ray.tracking.report import make_report
from aa_ray.tracking.suite_report import ENV_TAG, LABEL_TAG
from aa_ray.tune.specs import load_suite
from aa_ray.tune.trials import TRIAL_LOG

ROOT = Path(__file__).resolve().parents[1]
PUSHER, PENDULUM = "aa_ray/PusherReach-v0", "Pendulum-v1"
# each cell's actors in its trial's own process (as tests/test_sweep_resume.py's): three fewer processes
# to start per cell on a busy machine; the Ray actors of a Tune trial are test_tune.py's pipeline's
# no MLflow Model of the final policy: none is read here (benchmarks/RESULTS.md section 35)
TINY = {"algo.actor_hidden_dims": [32, 32], "algo.critic_hidden_dims": [32, 32], "algo.batch_size": 64,
        "algo.warm_up_steps": 200, "algo.buffer_size": 5000, "checkpoint.every_env_steps": 300,
        "runtime.backend": "inline", "tracking.log_model": False}
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


def pusher_histories(client: MlflowClient, parent_id: str) -> dict[str, list[tuple[int, float]]]:
    """The pusher cells' eval/return curves, by cell."""
    return {
        run.data.tags["aa_ray.suite_cell"]: [(p.step, p.value) for p in client.get_metric_history(run.info.run_id,
                                                                                                   "eval/return")]
        for run in client.search_runs([client.get_run(parent_id).info.experiment_id],
                                      f"tags.`mlflow.parentRunId` = '{parent_id}'")
        if run.data.tags["aa_ray.suite_env"] == PUSHER
    }


def test_suite_stopped_resumed_killed_then_run_again_and_reported(tmp_path: Path) -> None:
    """One suite interrupted twice, as a batch job can be: SIGTERMed (a preemption) once both pusher cells
    finished and a Pendulum cell checkpointed, continued with `--resume latest`, SIGKILLed with all it
    started once a Pendulum cell checkpointed again, then run again with the plain command to its end.
    Finished cells are never run again, the others resume in their own runs under one parent, and the
    report reads them. (One suite for the three invocations: each starts Ray, Tune and trial processes,
    which on a 2-core CI machine is most of a tiny suite's cost.)"""
    suite_file = tiny_suite(tmp_path)
    root = tmp_path / "runs" / "suites" / "tiny"
    command = [sys.executable, "-m", "aa_ray.cli", "suite", str(suite_file)]
    client = MlflowClient()

    def pendulum_checkpoints() -> dict[str, int]:
        """Cell -> its complete step checkpoints, for each Pendulum cell with one and not yet finished (a
        cell's folder is its name and the hash of its spec)."""
        return {d.name.rsplit("-", 1)[0]: len([c for c in d.glob("checkpoints/step_*") if "." not in c.name])
                for d in root.glob("sac-Pendulum-v1-*") if has_step_checkpoint(d)}

    def pushers_finished_pendulum_mid_run() -> bool:  # Tune said both pusher trials finished: their runs are closed
        return len(list(root.glob("sac-aa_ray_PusherReach-v0-*/cell.json"))) == 2 and bool(pendulum_checkpoints()) \
            and (tmp_path / "stopped.log").read_text().count(" finished at ") >= 2

    # 1. SIGTERM: the finished cells stay FINISHED, the running ones and the parent end KILLED
    stopped = stop_with_sigterm(command, tmp_path / "stopped.log", tmp_path, pushers_finished_pendulum_mid_run,
                                "both pusher cells finished and a Pendulum one checkpointed")
    assert_event_lines(stopped, ["sac-aa_ray_PusherReach-v0-s0", "sac-aa_ray_PusherReach-v0-s1"])
    assert " checkpointed at " in stopped and "env_steps" not in stopped  # progress goes to each trial's log
    checkpointed = sorted(pendulum_checkpoints())[0]
    (log,) = root.glob(f"{checkpointed}-*/{TRIAL_LOG}")
    assert "env_steps" in log.read_text()
    state = json.loads((root / "suite.json").read_text())
    assert state["status"] == "preempted"
    parent_id = state["parent_run_id"]
    parent = client.get_run(parent_id)
    assert parent.info.status == "KILLED" and "SIGTERM" in parent.data.tags[STOP_REASON_TAG]
    before = {run.data.tags["aa_ray.suite_cell"]: run for run in client.search_runs(
        [parent.info.experiment_id], f"tags.`mlflow.parentRunId` = '{parent_id}'")}
    for cell, run in before.items():
        pusher = cell.startswith("sac-aa_ray_PusherReach")
        assert run.info.status == ("FINISHED" if pusher else "KILLED"), (cell, run.info.status)
        assert pusher or "SIGTERM" in run.data.tags[STOP_REASON_TAG]
    assert checkpointed in before
    finished_before = {p.parent.name: p.read_text() for p in root.glob("*/cell.json")}
    pusher_history = pusher_histories(client, parent_id)

    # 2. `--resume latest`, SIGKILLed with everything it started once a Pendulum cell checkpointed again
    checkpoints_at_stop = pendulum_checkpoints()
    with (tmp_path / "resumed.log").open("w") as out:
        resumed = subprocess.Popen([*command, "--resume", "latest"], cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT,
                                   env={**os.environ, "PYTHONUNBUFFERED": "1"})
        wait_for(lambda: any(n > checkpoints_at_stop.get(name, 0) for name, n in pendulum_checkpoints().items()),
                 resumed, "a Pendulum checkpoint after the resume")
        kill_tree(resumed)
    console = (tmp_path / "resumed.log").read_text()
    assert f"resuming the suite in {root}" in console and "4 runs, 2 finished earlier, 2 to run" in console
    assert f"{checkpointed}: resuming from step_" in console
    assert_event_lines(console, ["sac-Pendulum-v1-s0", "sac-Pendulum-v1-s1"])
    assert not list(root.glob("sac-Pendulum-v1-*/checkpoints/final"))

    # 3. the plain command again: what is unfinished resumes, in the same parent and runs
    third = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert third.returncode == 0, third.stdout[-3000:] + third.stderr[-3000:]
    assert "4 runs, 2 finished earlier, 2 to run" in third.stdout
    assert "resuming from step_" in third.stdout
    assert json.loads((root / "suite.json").read_text())["parent_run_id"] == parent_id
    assert json.loads((root / "suite.json").read_text())["status"] == "finished"
    for name, text in finished_before.items():  # not run again
        assert (root / name / "cell.json").read_text() == text

    experiment = client.get_run(parent_id).info.experiment_id
    children = client.search_runs([experiment], f"tags.`mlflow.parentRunId` = '{parent_id}'")
    cells = sorted(run.data.tags["aa_ray.suite_cell"] for run in children)
    assert cells == ["sac-Pendulum-v1-s0", "sac-Pendulum-v1-s1", "sac-aa_ray_PusherReach-v0-s0",
                     "sac-aa_ray_PusherReach-v0-s1"]
    assert {run.info.status for run in children} == {"FINISHED"}
    for cell, run in before.items():  # each cell kept its run
        assert {r.data.tags["aa_ray.suite_cell"]: r.info.run_id for r in children}[cell] == run.info.run_id
    assert client.get_run(parent_id).info.status == "FINISHED"
    assert STOP_REASON_TAG not in client.get_run(parent_id).data.tags
    assert pusher_histories(client, parent_id) == pusher_history  # nothing logged into the finished runs again
    resumed_at = client.get_metric_history(before[checkpointed].info.run_id, "run/resumed_at")
    assert resumed_at and resumed_at[-1].value >= TINY["checkpoint.every_env_steps"]
    for run in children:
        history = client.get_metric_history(run.info.run_id, "eval/return")
        budget = 400 if run.data.tags["aa_ray.suite_env"] == PUSHER else 1500
        assert max(p.step for p in history) >= budget
        assert run.data.params["seed"] == run.data.tags["aa_ray.suite_seed"]

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
    assert logged == {"report/report.png", "report/report_time.png", "report/report.html", "report/summary.json"}




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
@pytest.mark.fresh_store  # it checks that no MLflow store is made
def test_bad_suites_are_refused_before_anything_runs(tmp_path: Path, change: dict, expected: str,
                                                     capsys: pytest.CaptureFixture) -> None:
    suite_file = tiny_suite(tmp_path, **change)
    with pytest.raises(SpecError, match=expected.replace(".", r"\.")):
        load_suite(suite_file)
    assert cli.main(["suite", str(suite_file)]) == 2
    assert expected in capsys.readouterr().err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "mlflow.db").exists()


@pytest.mark.fresh_store  # it checks that no MLflow store is made
def test_only_names_a_label_or_env_of_the_suite(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    suite_file = tiny_suite(tmp_path)
    assert cli.main(["suite", str(suite_file), "--only", "Walker2d-v5"]) == 2
    assert "--only Walker2d-v5: not a spec label or env id of the suite (labels sac;" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "mlflow.db").exists()


# wall-clock: runs logged with controlled timestamps, in minutes from an arbitrary moment
T0_MS = 1_700_000_000_000
MACHINE = {CPU_TAG: "Test CPU 9000", CPU_COUNT_TAG: "2", HOST_TAG: "box"}


def at(minute: float) -> int:
    return T0_MS + round(minute * 60_000)


def logged_run(client: MlflowClient, experiment_id: str, start: float, end: float,
               evals: list[tuple[float, int, float]], resumes: list[tuple[float, int]] = (),
               alive: list[float] = (), tags: dict[str, str] | None = None,
               params: dict[str, str] | None = None, updates: list[tuple[float, int, float]] = ()) -> str:
    """A run from minute `start` to `end`: eval/return (minute, env steps, value) with env/steps beside
    each, env/steps alone at the `alive` minutes, run/resumed_at (minute, env steps) markers, and
    learner/gradient_updates (minute, env steps, count) as the learner reports them."""
    run_id = client.create_run(experiment_id, start_time=at(start), tags={**MACHINE, **(tags or {})}).info.run_id
    for key, value in (params or {}).items():
        client.log_param(run_id, key, value)
    for minute, step, count in updates:
        client.log_metric(run_id, "learner/gradient_updates", count, timestamp=at(minute), step=step)
    for minute, step, value in evals:
        client.log_metric(run_id, "eval/return", value, timestamp=at(minute), step=step)
        client.log_metric(run_id, "env/steps", step, timestamp=at(minute), step=step)
    for minute in alive:
        client.log_metric(run_id, "env/steps", 0, timestamp=at(minute), step=0)
    for minute, step in resumes:
        client.log_metric(run_id, "run/resumed_at", step, timestamp=at(minute), step=step)
    client.set_terminated(run_id, "FINISHED", end_time=at(end))
    return run_id


def test_the_time_axis_is_each_runs_own_time_without_its_stops(tmp_path: Path) -> None:
    """Run A evaluates at minutes 1 and 3, is killed (its checkpoint at 200 env steps), stays stopped an
    hour, resumes at minute 63 and reaches -200 at minute 65: 5 minutes of its own time. Run B ran
    during A's stop (so never beside it) from minute 10, and never reaches -200."""
    client = MlflowClient()
    experiment_id = client.create_experiment("aa-ray")
    run_a = logged_run(client, experiment_id, 0, 65.5, [(1, 100, -900.0), (3, 300, -500.0), (64, 300, -400.0),
                                                       (65, 400, -150.0)], resumes=[(63, 200)],
                       params={"algo.utd_ratio": "1"})
    run_b = logged_run(client, experiment_id, 10, 20, [(12, 100, -800.0), (19, 400, -600.0)],
                       params={"algo.utd_ratio": "2"})
    curve = load_curve(client, client.get_run(run_a), "eval/return")
    assert curve.steps.tolist() == [100, 300, 400]
    assert curve.minutes.tolist() == pytest.approx([1.0, 4.0, 5.0])  # the hour stopped is left out
    assert curve.running == [(at(0), at(3)), (at(63), at(65.5))]

    result = make_report(tmp_path / "report", run_ids=[run_a, run_b], threshold=-200.0)
    rows = {row["group"]: row for row in result["rows"]}
    assert rows["algo.utd_ratio=1"]["minutes_to_threshold"] == pytest.approx(5.0)
    assert rows["algo.utd_ratio=2"]["minutes_to_threshold"] == NOT_REACHED
    assert rows["algo.utd_ratio=1"]["runs_at_once"] == rows["algo.utd_ratio=2"]["runs_at_once"] == 1
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert summary["curves"]["algo.utd_ratio=1"]["minutes"]["x"][-1] == pytest.approx(5.0)
    assert summary["curves"]["algo.utd_ratio=2"]["minutes"]["x"][-1] == pytest.approx(9.0)  # from B's own start
    cpu_line = "CPU: Test CPU 9000 (2 CPUs): 2 runs. Runs at once on one machine: up to 1"
    assert summary["machine"].startswith(cpu_line)
    assert cpu_line in (tmp_path / "report" / "report.html").read_text()


def test_a_tracked_run_records_its_machine() -> None:
    tracker = MlflowTracker(load_spec(ROOT / "specs" / "sac.yaml"))
    tracker.finish()
    tags = MlflowClient().get_run(tracker.run_id).data.tags
    recorded = {key: tags.get(key) for key in (CPU_TAG, CPU_COUNT_TAG, HOST_TAG)}
    assert recorded == machine_tags() and recorded[CPU_TAG] not in ("", "unknown")


def test_suite_minutes_to_reach_the_sb3_median(tmp_path: Path) -> None:
    """X = SB3's median at its budget: median(-300, -200, -100) = -200. SB3's seeds reach it at 10, 10
    and never (median 10), two of them at once then one. sac's three at once reach it at 2 minutes,
    at 3.5 of its own minutes (1.5 before a 30-minute stop, 2 after), and never: median 3.5. slow's
    one at a time: 4, never, never: not reached."""
    client = MlflowClient()
    experiment_id = client.create_experiment("aa-ray")
    parent = client.create_run(experiment_id, tags={"aa_ray.kind": "suite"}).info.run_id
    env = PENDULUM

    def child(label: str, start: float, end: float, evals: list, params: dict | None = None, **more: list) -> None:
        tags = {PARENT_TAG: parent, LABEL_TAG: label, ENV_TAG: env}
        logged_run(client, experiment_id, start, end, evals, tags=tags, params={"algo.name": "sac", **(params or {})},
                   **more)

    sb3 = {"contender": "stable-baselines3 2.7.0"}
    child("sb3_sac", 0, 10, [(5, 500, -600.0), (10, 1000, -300.0)], sb3)
    child("sb3_sac", 0, 10, [(5, 500, -400.0), (10, 1000, -200.0)], sb3)
    child("sb3_sac", 10, 20, [(15, 500, -250.0), (20, 1000, -100.0)], sb3)
    child("sac", 20, 24, [(22, 500, -150.0), (24, 1000, -100.0)])
    child("sac", 20, 54, [(21, 500, -500.0), (53.5, 1000, -180.0)], alive=[21.5], resumes=[(51.5, 500)])
    child("sac", 20, 24, [(22, 500, -700.0), (24, 1000, -400.0)])
    for start, values in [(100, (-300.0, -190.0)), (105, (-900.0, -800.0)), (110, (-900.0, -700.0))]:
        child("slow", start, start + 5, [(start + 2, 500, values[0]), (start + 4, 1000, values[1])])

    result = make_report(tmp_path / "report", parent=parent)
    rows = {row["label"]: row for row in result["minutes"]}
    assert {label: (row["minutes_to_reach_X"], row["reached"], row["runs_at_once"]) for label, row in rows.items()} \
        == {"sac": (pytest.approx(3.5), "2/3", 3), "sb3_sac": (pytest.approx(10.0), "2/3", 2),
            "slow": (NOT_REACHED, "1/3", 1)}
    assert {(row["X"], row["X_is"]) for row in rows.values()} == {(-200.0, "sb3_sac median at 1,000 env steps")}
    assert result["machine"].startswith("CPU: Test CPU 9000 (2 CPUs): 9 runs. Runs at once on one machine: up to 3")
    page = (tmp_path / "report" / "report.html").read_text()
    assert "Minutes to reach X" in page and escape(result["machine"]) in page and page.count("data:image/png") == 2
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert summary["curves_by_minutes"][env]["sac"]["x"][-1] == pytest.approx(4.0)  # s0 and s2 end at 4; s1 at 3.5

    given = make_report(tmp_path / "given", parent=parent, threshold=-500.0)  # X given: sac at 2, 1 and 4
    assert {row["label"]: row["minutes_to_reach_X"] for row in given["minutes"]}["sac"] == pytest.approx(2.0)
    assert {row["X_is"] for row in given["minutes"]} == {"--threshold"}


def test_minutes_to_reach_count_only_a_held_score_after_learning_started(tmp_path: Path) -> None:
    """Ant at 50k steps as it happened (issue 36): the policy evaluated after the random warm-up scores
    980 from the alive bonus, above both contenders' trained returns at 50k (X = SB3's median, 543).
    Evaluations before the first gradient update do not count, nor does one evaluation above X that
    the next two do not hold: aa-ray's seed reaches X at its last evaluation (8 of its minutes), SB3's
    at its last (10; its learner count is 0 until learning starts, as bench_sb3_suite logs it), not in
    the first minute; the report says X is below the untrained policy's return."""
    client = MlflowClient()
    experiment_id = client.create_experiment("aa-ray")
    parent = client.create_run(experiment_id, tags={"aa_ray.kind": "suite"}).info.run_id
    tags = {PARENT_TAG: parent, ENV_TAG: "Ant-v5"}
    warm_up = [(0.13, 5000, 980.0)]  # the untrained policy, evaluated after the warm-up
    logged_run(client, experiment_id, 0, 9, [*warm_up, (2, 10_000, 300.0), (4, 20_000, 600.0), (5, 30_000, 400.0),
                                             (6, 40_000, 500.0), (8, 50_000, 560.0)],
               tags={**tags, LABEL_TAG: "fast_cpu"}, params={"algo.name": "fast_sac"},
               updates=[(0.2, 5_100, 100.0), (8, 50_000, 45_000.0)])
    logged_run(client, experiment_id, 0, 11, [(0.27, 5000, 975.0), (6, 30_000, 200.0), (10, 50_000, 543.0)],
               tags={**tags, LABEL_TAG: "sb3_sac"}, params={"algo.name": "sac", "contender": "stable-baselines3 2"},
               updates=[(0.27, 5000, 0.0), (6, 30_000, 25_000.0), (10, 50_000, 45_000.0)])

    result = make_report(tmp_path / "report", parent=parent)
    rows = {row["label"]: row for row in result["minutes"]}
    assert {label: (row["X"], row["minutes_to_reach_X"], row["reached"]) for label, row in rows.items()} == {
        "fast_cpu": (543.0, pytest.approx(8.0), "1/1"), "sb3_sac": (543.0, pytest.approx(10.0), "1/1")}
    assert rows["fast_cpu"]["untrained_return"] == 980.0 and rows["sb3_sac"]["untrained_return"] == 975.0
    assert all("no better than the untrained policy's" in row["note"] for row in rows.values())
    page = (tmp_path / "report" / "report.html").read_text()
    assert "evaluations of the untrained policy do not count" in page and "untrained policy&#x27;s 980" in page

    # the plain report, threshold 700: above every trained evaluation, below the untrained 980, so the
    # fast run never reaches it; a run that never logged its learner count has every evaluation
    # counted (980 held by the median of 980 and 760) and the row says so
    legacy = logged_run(client, experiment_id, 20, 30, [(21, 5000, 980.0), (29, 50_000, 760.0)],
                        params={"algo.name": "legacy"})
    fast = next(run.info.run_id for run in client.search_runs([experiment_id])
                if run.data.params.get("algo.name") == "fast_sac")
    plain = make_report(tmp_path / "plain", run_ids=[fast, legacy], threshold=700.0)["rows"]
    rows = {row["group"]: row for row in plain}
    assert {group: (row["minutes_to_threshold"], row["steps_to_threshold"]) for group, row in rows.items()} == {
        "algo.name=fast_sac": (NOT_REACHED, NOT_REACHED), "algo.name=legacy": (pytest.approx(1.0), 5000.0)}
    assert "no better than the untrained policy's 980" in rows["algo.name=fast_sac"]["note"]
    assert rows["algo.name=legacy"]["note"] == ("a run logged no learner/gradient_updates: its evaluations before "
                                                "learning count too")
