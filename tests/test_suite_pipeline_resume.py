"""A pipeline stopped by SIGTERM and continued with `--resume latest`: a real `aa-ray pipeline` process on
a real local Ray, Tune and MLflow store (SQLite in the test's folder), tiny budgets. Its console is
captured from a file, as a batch job's log is. (A suite's SIGTERM: tests/test_suite.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml
from mlflow.tracking import MlflowClient
from stopping import assert_event_lines, has_step_checkpoint, stop_with_sigterm

from aa_ray.runtime.run_record import STOP_REASON_TAG
from aa_ray.tune.trials import TRIAL_LOG

SPECS = Path(__file__).resolve().parents[1] / "specs"
CHECKPOINT_EVERY = 300
# each trial's actors in its own process (two fewer processes to start on a busy machine)
# no MLflow Model of the final policy: none is read here (benchmarks/RESULTS.md section 35)
TINY = {"algo.actor_hidden_dims": [32, 32], "algo.critic_hidden_dims": [32, 32], "algo.batch_size": 64,
        "algo.warm_up_steps": 200, "algo.buffer_size": 5000, "checkpoint.every_env_steps": CHECKPOINT_EVERY,
        "runtime.backend": "inline", "tracking.log_model": False}


def write(path: Path, document: dict) -> Path:
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def resume(command: list[str], log: Path, cwd: Path) -> str:
    with log.open("w") as out:
        finished = subprocess.run([*command, "--resume", "latest"], cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                  timeout=400)
    console = log.read_text()
    assert finished.returncode == 0, console[-4000:]
    return console


def runs_under(client: MlflowClient, parent_id: str) -> dict[str, str]:
    """run id -> status of the parent's children."""
    experiment = client.get_run(parent_id).info.experiment_id
    runs = client.search_runs([experiment], filter_string=f"tags.`mlflow.parentRunId` = '{parent_id}'")
    return {run.info.run_id: run.info.status for run in runs}


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
