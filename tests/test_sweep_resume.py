"""A sweep preempted by SIGTERM and continued with `--resume latest`: a real `aa-ray sweep` process
on a real local Ray, Tune and MLflow store (SQLite in the test's folder), two tiny trials."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import yaml
from mlflow.tracking import MlflowClient

from aa_ray.cli import PREEMPTED_EXIT_CODE
from aa_ray.runtime.run_record import STOP_REASON_TAG

SPECS = Path(__file__).resolve().parents[1] / "specs"
BUDGET = 1200
CHECKPOINT_EVERY = 300


def sweep_command(sweep_file: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "aa_ray.cli", "sweep", str(sweep_file), *args]


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within {timeout_s:g} s"
        time.sleep(0.2)


def step_checkpoints(trial_dir: Path) -> list[Path]:
    return [c for c in (trial_dir / "checkpoints").glob("step_*") if "." not in c.name]  # not a .partial


def both_trials_checkpointed_twice(root: Path) -> bool:
    """Two checkpoints each, so Tune has surely been handed the first (the second is written after
    the first's report returned), and neither trial has finished."""
    trials = [d for d in root.glob("sweep-*/*") if (d / "checkpoints").is_dir()]
    return len(trials) == 2 and all(
        len(step_checkpoints(d)) >= 2 and not (d / "checkpoints" / "final").exists() for d in trials
    )


def sweep_parents(client: MlflowClient) -> list:
    experiment = client.get_experiment_by_name("aa-ray").experiment_id
    return client.search_runs([experiment], filter_string="tags.`aa_ray.kind` = 'sweep'")


def child_runs(client: MlflowClient, parent_id: str) -> dict[str, str]:
    """run id -> status of the parent's children."""
    experiment = client.get_run(parent_id).info.experiment_id
    runs = client.search_runs([experiment], filter_string=f"tags.`mlflow.parentRunId` = '{parent_id}'")
    return {run.info.run_id: run.info.status for run in runs}


def test_a_sweep_stopped_by_sigterm_resumes_its_trials_from_their_checkpoints(tmp_path: Path) -> None:
    """SIGTERM to the sweep's driver once both trials checkpointed: Tune saves its state, the parent
    MLflow run ends KILLED and the command exits 75. `--resume latest` (what a requeued job runs)
    restores that sweep: both trials continue from their checkpoints to the end of their budget,
    in the same parent run and the same child runs."""
    sweep_file = tmp_path / "sweep.yaml"
    sweep_file.write_text(yaml.safe_dump({
        "name": "resume_tiny", "base": str(SPECS / "sac_bee.yaml"),
        "set": {"algo.actor_hidden_dims": [32, 32], "algo.critic_hidden_dims": [32, 32], "algo.batch_size": 64,
                "algo.warm_up_steps": 200, "eval.every_env_steps": 600, "eval.episodes": 2,
                "budget.env_steps": BUDGET, "checkpoint.every_env_steps": CHECKPOINT_EVERY,
                # each trial's actors in its own process: two fewer processes to start on a busy machine
                "runtime.backend": "inline"},
        # the values do not change a trial's speed, so both reach their checkpoints together
        "search_space": {"algo.bee_lambda": {"grid": [0.25, 0.5]}},
        "metric": "eval/distance", "mode": "min", "max_concurrent_trials": 2, "max_failures": 0,
    }, sort_keys=False))

    stopped = subprocess.Popen(sweep_command(sweep_file), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    runs = tmp_path / "runs"
    wait_for(lambda: both_trials_checkpointed_twice(runs) or stopped.poll() is not None, "two checkpoints per trial")
    assert stopped.poll() is None, "the sweep ended before it could be stopped"
    stopped.send_signal(signal.SIGTERM)  # to the driver alone, as `kill -TERM` and Kubernetes send it
    out, err = stopped.communicate(timeout=180)
    assert stopped.returncode == PREEMPTED_EXIT_CODE, (out + err)[-4000:]
    assert "--resume latest" in err
    (root,) = runs.glob("sweep-resume_tiny-*")
    assert json.loads((root / "sweep.json").read_text())["status"] == "preempted"
    assert not list(root.glob("*/checkpoints/final")), "a trial finished before the signal: nothing to resume"

    client = MlflowClient()
    (parent,) = sweep_parents(client)
    assert parent.info.status == "KILLED" and "SIGTERM" in parent.data.tags[STOP_REASON_TAG]
    children_before = child_runs(client, parent.info.run_id)
    assert len(children_before) == 2 and set(children_before.values()) == {"KILLED"}, children_before
    for run_id in children_before:  # why, beside what the trial saw (Tune ending it)
        assert "stopped by SIGTERM" in client.get_run(run_id).data.tags[STOP_REASON_TAG]

    resumed = subprocess.run(sweep_command(sweep_file, "--resume", "latest"), capture_output=True, text=True,
                             timeout=400)
    log = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, log[-4000:]
    assert f"resuming the sweep in {root}" in log
    steps_resumed_from = [int(n.replace(",", "")) for n in re.findall(r"resuming from ([\d,]+) env steps", log)]
    assert steps_resumed_from and all(CHECKPOINT_EVERY <= n < BUDGET for n in steps_resumed_from), log[-4000:]

    trials = json.loads((root / "trials.json").read_text())
    assert len(trials) == 2 and all(t["finished"] and t["error"] is None and t["env_steps"] >= BUDGET
                                    for t in trials), trials
    assert any(t["resumed"] for t in trials), trials
    assert list(runs.glob("sweep-*")) == [root]  # no second sweep folder
    assert json.loads((root / "sweep.json").read_text())["status"] == "finished"

    (parent_after,) = sweep_parents(client)  # the same parent, not a second one
    assert parent_after.info.run_id == parent.info.run_id and parent_after.info.status == "FINISHED"
    assert STOP_REASON_TAG not in parent_after.data.tags
    children_after = child_runs(client, parent.info.run_id)
    assert set(children_after) == set(children_before), (children_before, children_after)
    assert set(children_after.values()) == {"FINISHED"}, children_after
