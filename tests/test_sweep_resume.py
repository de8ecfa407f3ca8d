"""A sweep that loses a trial's process, is then preempted by SIGTERM and is continued with
`--resume latest`: a real `aa-ray sweep` process on a real local Ray, Tune and MLflow store (SQLite
in the test's folder), a 2x2 grid of tiny trials. (One sweep for both interruptions: each costs a
Ray, Tune and trial processes to start, on a 2-core CI machine.)"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
from pathlib import Path

import psutil
import yaml
from mlflow.tracking import MlflowClient
from stopping import stop_with_sigterm

from aa_ray.runtime.run_record import STOP_REASON_TAG
from aa_ray.tune.trials import TRIAL_LOG

SPECS = Path(__file__).resolve().parents[1] / "specs"
BUDGET = 1500
CHECKPOINT_EVERY = 400


def sweep_command(sweep_file: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "aa_ray.cli", "sweep", str(sweep_file), *args]


def step_checkpoints(trial_dir: Path) -> list[Path]:
    return [c for c in (trial_dir / "checkpoints").glob("step_*") if "." not in c.name]  # not a .partial


def two_running_trials_checkpointed_twice(root: Path) -> bool:
    """Two trials with two checkpoints each (so Tune has surely been handed the first: the second is
    written after the first's report returned), neither finished."""
    trials = [d for d in root.glob("sweep-*/*") if (d / "checkpoints").is_dir()]
    running = [d for d in trials if len(step_checkpoints(d)) >= 2 and not (d / "checkpoints" / "final").exists()]
    return len(running) >= 2


def kill_one_trial() -> int:
    """SIGKILL one trial's own process (the whole trial: its actors run inline in it), as a crashed
    machine would; its pid. (A trial whose learner dies recovers inside the trial: test_reliability.py.)"""
    for process in psutil.Process().children(recursive=True):  # this test's sweep and its Ray, no other
        with contextlib.suppress(psutil.Error):
            if (process.cmdline() or [""])[0].startswith("ray::ImplicitFunc"):
                process.kill()
                return process.pid
    raise AssertionError("no trial process to kill")


def retried_and_going_again(console: Path, root: Path) -> bool:
    """The killed trial was retried and has resumed from its checkpoint, and a trial is mid-run."""
    text = console.read_text()
    running = [d for d in root.glob("sweep-*/*") if step_checkpoints(d) and not (d / "checkpoints" / "final").exists()]
    return "retried from its last checkpoint" in text and "resuming from" in text and bool(running)


def assert_a_readable_console(console: str) -> None:
    """No trial's own output on the console (its progress lines, Ray's "[repeated ...]" marker for
    forwarded lines), no colour codes, no hint to run TensorBoard; Tune's status table and a line per
    trial event, the killed trial's failure in one line."""
    assert "\x1b[" not in console, console[max(0, console.find("\x1b[") - 1000):][:2000]
    assert "env_steps" not in console and "repeated" not in console, console[-4000:]
    assert "tensorboard" not in console.lower()
    assert "== Status ==" in console and "eval/distance" in console
    (failure,) = [line for line in console.splitlines() if "retried from its last checkpoint" in line]
    assert "Error" in failure and "traceback: " in failure, failure
    assert re.search(r"resuming from [\d,]+ env steps", console), console[-4000:]


def sweep_parents(client: MlflowClient) -> list:
    experiment = client.get_experiment_by_name("aa-ray").experiment_id
    return client.search_runs([experiment], filter_string="tags.`aa_ray.kind` = 'sweep'")


def child_runs(client: MlflowClient, parent_id: str) -> dict[str, str]:
    """run id -> status of the parent's children."""
    experiment = client.get_run(parent_id).info.experiment_id
    runs = client.search_runs([experiment], filter_string=f"tags.`mlflow.parentRunId` = '{parent_id}'")
    return {run.info.run_id: run.info.status for run in runs}


def test_a_sweep_loses_a_trial_then_is_stopped_by_sigterm_and_resumes_every_trial_to_its_end(tmp_path: Path) -> None:
    """A 2x2 grid over algo.utd_ratio x algo.bee_lambda, two trials at a time. Once two running trials
    checkpointed twice, one trial's process is SIGKILLed: Tune retries it from its last checkpoint
    (max_failures 1) and it goes on. Then SIGTERM to the sweep's driver: Tune saves its state, the
    parent MLflow run ends KILLED, the trials it stopped too, and the command exits 75.
    `--resume latest` (what a requeued job runs) restores that sweep: every trial finishes its
    budget, in the same parent run with exactly four child runs (the retried trial continued its
    run instead of starting a fifth), each with its own params. The console (a batch job's log) is
    Tune's status table and a line per trial event; each trial's progress is in its own log."""
    sweep_file = tmp_path / "sweep.yaml"
    sweep_file.write_text(yaml.safe_dump({
        "name": "utd_bee_tiny", "base": str(SPECS / "sac_bee.yaml"),
        # the first checkpoint (400) comes before the first evaluation (500): its report still has the metric
        "set": {"algo.actor_hidden_dims": [32, 32], "algo.critic_hidden_dims": [32, 32], "algo.batch_size": 64,
                "algo.warm_up_steps": 300, "eval.every_env_steps": 500, "eval.episodes": 2,
                # no MLflow Model of the final policy: none is read here (benchmarks/RESULTS.md section 35)
                "tracking.log_model": False,
                "budget.env_steps": BUDGET, "checkpoint.every_env_steps": CHECKPOINT_EVERY,
                # each trial's actors in its own process, so the kill takes the whole trial (the Ray
                # actors of a Tune trial: test_tune.py's pipeline, test_suite.py)
                "runtime.backend": "inline"},
        "search_space": {"algo.utd_ratio": {"grid": [1, 2]}, "algo.bee_lambda": {"grid": [0.25, 0.5]}},
        "metric": "eval/distance", "mode": "min", "max_concurrent_trials": 2, "max_failures": 1,
    }, sort_keys=False))
    runs, killed = tmp_path / "runs", []

    def retried_after_a_kill() -> bool:
        """Once two running trials checkpointed twice, kill one; ready once it was retried and resumed."""
        if not killed:
            if two_running_trials_checkpointed_twice(runs):
                killed.append(kill_one_trial())
            return False
        return retried_and_going_again(tmp_path / "stopped.log", runs)

    log = stop_with_sigterm(sweep_command(sweep_file), tmp_path / "stopped.log", tmp_path, retried_after_a_kill,
                            "a killed trial retried from its checkpoint")
    assert_a_readable_console(log)
    (root,) = runs.glob("sweep-utd_bee_tiny-*")
    assert json.loads((root / "sweep.json").read_text())["status"] == "preempted"
    started = [d for d in root.iterdir() if (d / "checkpoints").is_dir()]
    assert any(not (d / "checkpoints" / "final").exists() for d in started), "nothing left to resume"

    client = MlflowClient()
    (parent,) = sweep_parents(client)
    assert parent.info.status == "KILLED" and "SIGTERM" in parent.data.tags[STOP_REASON_TAG]
    children_before = child_runs(client, parent.info.run_id)
    assert len(children_before) <= 4 and "KILLED" in children_before.values(), children_before
    for run_id, status in children_before.items():  # why, beside what the trial saw (Tune ending it)
        if status == "KILLED":
            assert "stopped by SIGTERM" in client.get_run(run_id).data.tags[STOP_REASON_TAG]

    resumed = subprocess.run(sweep_command(sweep_file, "--resume", "latest"), capture_output=True, text=True,
                             timeout=400)
    log = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, log[-4000:]
    assert f"resuming the sweep in {root}" in log
    steps_resumed_from = [int(n.replace(",", "")) for n in re.findall(r"resuming from ([\d,]+) env steps", log)]
    assert steps_resumed_from and all(CHECKPOINT_EVERY <= n < BUDGET for n in steps_resumed_from), log[-4000:]

    trials = json.loads((root / "trials.json").read_text())
    assert sorted((t["params"]["algo.utd_ratio"], t["params"]["algo.bee_lambda"]) for t in trials) == [
        (1, 0.25), (1, 0.5), (2, 0.25), (2, 0.5)]
    assert all(t["finished"] and t["error"] is None and t["env_steps"] >= BUDGET for t in trials), trials
    assert any(t["resumed"] for t in trials), trials
    for trial in trials:
        assert "env_steps" in (root / trial["trial_id"] / TRIAL_LOG).read_text()
    assert list(runs.glob("sweep-*")) == [root]  # no second sweep folder
    assert json.loads((root / "sweep.json").read_text())["status"] == "finished"

    (parent_after,) = sweep_parents(client)  # the same parent, not a second one
    assert parent_after.info.run_id == parent.info.run_id and parent_after.info.status == "FINISHED"
    assert STOP_REASON_TAG not in parent_after.data.tags
    assert parent_after.data.metrics["best/eval/distance"] == min(t["metric"] for t in trials)
    children_after = child_runs(client, parent.info.run_id)
    assert set(children_before) <= set(children_after) and len(children_after) == 4, children_after
    assert set(children_after.values()) == {"FINISHED"}, children_after
    for run_id in children_after:
        run = client.get_run(run_id)
        assert run.data.tags["aa_ray.sweep"] == "utd_bee_tiny"
        sampled = yaml.safe_load(run.data.tags["aa_ray.params"])
        assert float(run.data.params["algo.bee_lambda"]) == sampled["algo.bee_lambda"]
        assert int(run.data.params["algo.utd_ratio"]) == sampled["algo.utd_ratio"]
        assert "eval/distance" in run.data.metrics
