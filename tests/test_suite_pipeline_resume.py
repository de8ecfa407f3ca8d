"""A suite and a pipeline stopped by SIGTERM and continued with `--resume latest`: real `aa-ray suite`
and `aa-ray pipeline` processes on a real local Ray, Tune and MLflow store (SQLite in the test's
folder), tiny budgets. The console of each is captured from a file, as a batch job's log is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml
from mlflow.tracking import MlflowClient
from stopping import stop_with_sigterm

from aa_ray.runtime.run_record import STOP_REASON_TAG
from aa_ray.tune.trials import TRIAL_LOG

SPECS = Path(__file__).resolve().parents[1] / "specs"
PUSHER, PENDULUM = "aa_ray/PusherReach-v0", "Pendulum-v1"
CHECKPOINT_EVERY = 300
# each trial's actors in its own process (two fewer processes to start on a busy machine)
TINY = {"algo.actor_hidden_dims": [32, 32], "algo.critic_hidden_dims": [32, 32], "algo.batch_size": 64,
        "algo.warm_up_steps": 200, "algo.buffer_size": 5000, "checkpoint.every_env_steps": CHECKPOINT_EVERY,
        "runtime.backend": "inline"}


def write(path: Path, document: dict) -> Path:
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def has_step_checkpoint(run_dir: Path) -> bool:
    """A complete step checkpoint (not a .partial) and no final one: the run is mid-way."""
    steps = [c for c in run_dir.glob("checkpoints/step_*") if "." not in c.name and (c / "state.pt").is_file()]
    return bool(steps) and not (run_dir / "checkpoints" / "final").exists()


def resume(command: list[str], log: Path, cwd: Path) -> str:
    with log.open("w") as out:
        finished = subprocess.run([*command, "--resume", "latest"], cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                  timeout=400)
    console = log.read_text()
    assert finished.returncode == 0, console[-4000:]
    return console


def assert_event_lines(console: str, labels: list[str]) -> None:
    """Tune's status table and a line per trial event, without colour codes; no trial's own output."""
    assert "\x1b[" not in console, console[max(0, console.find("\x1b[") - 1000):][:2000]
    assert "== Status ==" in console, console[-4000:]
    assert "tensorboard" not in console.lower() and "repeated" not in console
    for label in labels:
        assert f" started [{label}], its log: " in console, (label, console[-4000:])


def runs_under(client: MlflowClient, parent_id: str) -> dict[str, str]:
    """run id -> status of the parent's children."""
    experiment = client.get_run(parent_id).info.experiment_id
    runs = client.search_runs([experiment], filter_string=f"tags.`mlflow.parentRunId` = '{parent_id}'")
    return {run.info.run_id: run.info.status for run in runs}


def test_a_suite_stopped_by_sigterm_resumes_its_cells(tmp_path: Path) -> None:
    """Two cells: pusher-reach (300 env steps) finishes first, Pendulum (1,800: far enough from its
    end that it cannot finish while Tune stops it, as 900 once did) is SIGTERMed after a checkpoint.
    Its child run and the parent end KILLED with the stop reason; `--resume latest` leaves the
    finished cell alone and continues Pendulum from its checkpoint in the same runs."""
    suite_file = write(tmp_path / "suite.yaml", {
        "name": "stop_tiny", "specs": {"sac": str(SPECS / "sac.yaml")},
        "envs": {PUSHER: {"budget.env_steps": 300}, PENDULUM: {}}, "seeds": [0], "env_steps": 1800,
        "eval": {"every_env_steps": 300, "episodes": 1}, "set": TINY, "max_concurrent_trials": 2, "max_failures": 0,
    })
    root = tmp_path / "runs" / "suites" / "stop_tiny"
    command = [sys.executable, "-m", "aa_ray.cli", "suite", str(suite_file)]

    def pusher_done_pendulum_mid_run() -> bool:
        """The pusher trial has returned (Tune says it finished: its run is closed, not just its
        record written), Pendulum has a checkpoint and no final one."""
        pendulum = list(root.glob("sac-Pendulum-v1-*"))
        return len(pendulum) == 1 and has_step_checkpoint(pendulum[0]) \
            and " finished at " in (tmp_path / "stopped.log").read_text()

    stopped = stop_with_sigterm(command, tmp_path / "stopped.log", tmp_path, pusher_done_pendulum_mid_run,
                                "pusher finished and Pendulum checkpointed")
    assert_event_lines(stopped, ["sac-aa_ray_PusherReach-v0-s0", "sac-Pendulum-v1-s0"])
    assert " checkpointed at " in stopped and " finished at " in stopped
    (pusher,) = root.glob("sac-aa_ray_PusherReach-v0-*")
    (pendulum,) = root.glob("sac-Pendulum-v1-*")
    assert "env_steps" in (pendulum / TRIAL_LOG).read_text()  # its progress went to its log, not the console
    assert "env_steps" not in stopped
    assert json.loads((root / "suite.json").read_text())["status"] == "preempted"
    pusher_record = (pusher / "cell.json").read_text()

    client = MlflowClient()
    parent_id = json.loads((root / "suite.json").read_text())["parent_run_id"]
    parent = client.get_run(parent_id)
    assert parent.info.status == "KILLED" and "SIGTERM" in parent.data.tags[STOP_REASON_TAG]
    before = {run.data.tags["aa_ray.suite_cell"]: run for run in client.search_runs(
        [parent.info.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{parent_id}'")}
    assert {cell: run.info.status for cell, run in before.items()} == {
        "sac-aa_ray_PusherReach-v0-s0": "FINISHED", "sac-Pendulum-v1-s0": "KILLED"}
    assert "SIGTERM" in before["sac-Pendulum-v1-s0"].data.tags[STOP_REASON_TAG]
    pusher_run = before["sac-aa_ray_PusherReach-v0-s0"].info.run_id
    pusher_history = [(p.step, p.value) for p in client.get_metric_history(pusher_run, "eval/return")]

    resumed = resume(command, tmp_path / "resumed.log", tmp_path)
    assert f"resuming the suite in {root}" in resumed and "2 runs, 1 finished earlier, 1 to run" in resumed
    assert "sac-Pendulum-v1-s0: resuming from step_" in resumed
    assert_event_lines(resumed, ["sac-Pendulum-v1-s0"])
    assert (pusher / "cell.json").read_text() == pusher_record  # not run again
    assert json.loads((root / "suite.json").read_text())["status"] == "finished"
    assert client.get_run(parent_id).info.status == "FINISHED"
    assert STOP_REASON_TAG not in client.get_run(parent_id).data.tags
    after = runs_under(client, parent_id)
    assert after == {run.info.run_id: "FINISHED" for run in before.values()}  # the same two runs, finished
    assert [(p.step, p.value) for p in client.get_metric_history(pusher_run, "eval/return")] == pusher_history
    pendulum_steps = client.get_metric_history(before["sac-Pendulum-v1-s0"].info.run_id, "run/resumed_at")
    assert pendulum_steps and pendulum_steps[-1].value >= CHECKPOINT_EVERY


def test_a_pipeline_stopped_by_sigterm_resumes_its_stage(tmp_path: Path) -> None:
    """A scripted rollout, then RLPD on its dataset, SIGTERMed after RLPD checkpointed: the RLPD run
    and the parent end KILLED; `--resume latest` continues that parent run, leaves the rollout
    stage alone (not rerun, nor copied again) and resumes RLPD from its checkpoint in its own run."""
    pipeline_file = write(tmp_path / "pipeline.yaml", {"name": "stop_tiny", "stages": {
        "demos": {"kind": "rollout", "scripted": True, "spec": str(SPECS / "rlpd.yaml"), "episodes": 2,
                  "set": {"runtime.backend": "inline"}},
        "rlpd": {"kind": "train", "spec": str(SPECS / "rlpd.yaml"), "inputs": {"algo.prior_data": "demos.dataset"},
                 "set": {**TINY, "algo.warm_up_steps": 100, "algo.utd_ratio": 1, "budget.env_steps": 900,
                         "eval.every_env_steps": 300, "eval.episodes": 1}},
    }})
    root = tmp_path / "runs" / "pipelines" / "stop_tiny"
    command = [sys.executable, "-m", "aa_ray.cli", "pipeline", str(pipeline_file)]

    def rlpd_mid_run() -> bool:  # a checkpoint on disk, and Tune told of one (the console says so)
        folders = list(root.glob("rlpd-*"))
        return len(folders) == 1 and has_step_checkpoint(folders[0]) \
            and " checkpointed at " in (tmp_path / "stopped.log").read_text()

    stopped = stop_with_sigterm(command, tmp_path / "stopped.log", tmp_path, rlpd_mid_run, "an RLPD checkpoint")
    assert_event_lines(stopped, ["demos", "rlpd"])
    assert " checkpointed at " in stopped and " finished at " in stopped
    assert json.loads((root / "pipeline.json").read_text())["status"] == "preempted"
    (demos,) = root.glob("demos-*")
    demos_record, dataset_written = (demos / "stage.json").read_text(), (demos / "dataset.parquet").stat().st_mtime_ns
    (rlpd,) = root.glob("rlpd-*")
    assert "env_steps" in (rlpd / TRIAL_LOG).read_text() and "env_steps" not in stopped

    client = MlflowClient()
    parent_id = json.loads((root / "pipeline.json").read_text())["parent_run_id"]
    parent = client.get_run(parent_id)
    assert parent.info.status == "KILLED" and "SIGTERM" in parent.data.tags[STOP_REASON_TAG]
    before = {run.data.tags["aa_ray.stage"]: run for run in client.search_runs(
        [parent.info.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{parent_id}'")}
    assert {stage: run.info.status for stage, run in before.items()} == {"demos": "FINISHED", "rlpd": "KILLED"}
    assert "SIGTERM" in before["rlpd"].data.tags[STOP_REASON_TAG]

    resumed = resume(command, tmp_path / "resumed.log", tmp_path)
    assert f"resuming the pipeline in {root}" in resumed and f"mlflow parent run: {parent_id}" in resumed
    assert "stage demos: finished earlier in this parent run" in resumed
    assert "stage rlpd: resuming from step_" in resumed
    assert_event_lines(resumed, ["rlpd"])
    assert (demos / "stage.json").read_text() == demos_record
    assert (demos / "dataset.parquet").stat().st_mtime_ns == dataset_written  # not run again
    assert (rlpd / "checkpoints" / "final").is_dir()
    assert json.loads((root / "pipeline.json").read_text())["status"] == "finished"
    assert client.get_run(parent_id).info.status == "FINISHED"
    assert runs_under(client, parent_id) == {run.info.run_id: "FINISHED" for run in before.values()}
    resumed_at = client.get_metric_history(before["rlpd"].info.run_id, "run/resumed_at")
    assert resumed_at and resumed_at[-1].value >= CHECKPOINT_EVERY
