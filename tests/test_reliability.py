"""Faults injected into real runs (local Ray, MuJoCo pusher-reach, SQLite MLflow): a driver stopped by
SIGTERM, resumed, then killed mid-run and resumed again continues bit-exactly; runner, replay and
learner processes killed by pid are recovered from without losing the run or its replay buffer."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import torch
from mlflow.tracking import MlflowClient

from aa_ray.runtime.checkpoint import load_checkpoint
from aa_ray.runtime.trainer import Trainer
from aa_ray.spec.loader import load_spec

SPECS = Path(__file__).resolve().parents[1] / "specs"
# n-step windows and two runners of two envs each: every kind of runner state is mid-flight at a checkpoint
# no MLflow Model of the final policy: none is read here (benchmarks/RESULTS.md section 35)
SMALL = [
    "algo.actor_hidden_dims=[32,32]",
    "algo.critic_hidden_dims=[32,32]", "algo.batch_size=64", "algo.warm_up_steps=200", "algo.train_every=5",
    "algo.n_step=3", "runners.num_runners=2", "runners.envs_per_runner=2", "eval.episodes=2",
    "tracking.log_model=false",
]
TIMING = ("per_s", "time_s", "time/")  # wall-clock metrics differ between any two runs


def aa_ray_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "aa_ray.cli", "run", str(SPECS / "sac.yaml"), "--plain", *args]


def overrides(*extra: str) -> list[str]:
    return [arg for item in [*SMALL, *extra] for arg in ("--set", item)]


def metric_history(run_id: str, tracking_uri: str | None = None) -> dict[tuple[str, int], float]:
    """(metric, step) -> value; a step logged again after a resume keeps its newest value."""
    client = MlflowClient(tracking_uri)
    history = {}
    for key in client.get_run(run_id).data.metrics:
        if any(part in key for part in TIMING):
            continue
        for point in sorted(client.get_metric_history(run_id, key), key=lambda m: m.timestamp):
            history[(key, point.step)] = point.value
    return history


def mlflow_run_id(stdout: str) -> str:
    return stdout.split("mlflow run: ")[1].split()[0]


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


SETTINGS = overrides("budget.env_steps=900", "checkpoint.every_env_steps=300", "eval.every_env_steps=300")


@dataclass
class Finished:
    metrics: dict[tuple[str, int], float]  # (metric, step) -> value, from the run's MLflow history
    policy: dict[str, torch.Tensor]  # the final checkpoint's policy weights


def finished(stdout: str, output_dir: Path, tracking_uri: str | None = None) -> Finished:
    final = load_checkpoint(next(output_dir.glob("*/checkpoints/final")))
    return Finished(metric_history(mlflow_run_id(stdout), tracking_uri), final.learner.algo["policy"])


@pytest.fixture(scope="module")
def whole_run(tmp_path_factory: pytest.TempPathFactory) -> Finished:
    """The uninterrupted run (sync mode, seed 0) the interrupted ones must repeat, in a folder of its
    own (its own MLflow store). It runs inline: for a fixed seed the inline backend repeats a Ray sync
    run exactly (tests/test_inline_backend.py), so the interrupted Ray runs must match it all the same,
    without a Ray and four actor processes started for the reference."""
    folder = tmp_path_factory.mktemp("whole")
    tracking_uri = f"sqlite:///{folder}/mlflow.db"
    inline = ["--set", "runtime.backend=inline", "--set", f"runtime.output_dir={folder}"]
    whole = subprocess.run(aa_ray_command(*SETTINGS, *inline), capture_output=True,
                           text=True, timeout=600, cwd=folder, env={**os.environ, "MLFLOW_TRACKING_URI": tracking_uri})
    assert whole.returncode == 0, whole.stderr[-3000:]
    return finished(whole.stdout, folder, tracking_uri)


def assert_repeats(whole: Finished, resumed: Finished, *resumed_at: int) -> None:
    """The resumed run's metrics and final policy are the uninterrupted run's."""
    expected, actual = whole.metrics, dict(resumed.metrics)
    for step in resumed_at:  # the one addition: each resume's marker
        assert actual.pop(("run/resumed_at", step)) == step
    after_resume = [key for key in expected if key[1] > resumed_at[-1]]
    assert len(after_resume) > 40 and ("eval/return", max(step for _, step in expected)) in after_resume
    differing = sorted(key for key in expected.keys() | actual.keys() if expected.get(key) != actual.get(key))
    assert not differing, differing[:20]
    for name, tensor in whole.policy.items():
        assert torch.equal(tensor, resumed.policy[name]), name


def step_checkpoints(output_dir: Path) -> list[Path]:
    """The run's complete step checkpoints, oldest first (one being written is named step_*.partial)."""
    return sorted(p for p in output_dir.glob("*/checkpoints/step_*") if "." not in p.name)


def test_a_run_stopped_by_sigterm_then_killed_resumes_each_time_and_repeats_the_uninterrupted_one(
        whole_run: Finished, tmp_path: Path) -> None:
    """Sync mode, seed 0, interrupted twice. SIGTERM (a preemption notice) between two checkpoints: the
    driver ends its iteration, writes a checkpoint there, marks the MLflow run KILLED and exits with 75.
    `--resume latest` (the command a requeued job runs) continues from that checkpoint in the same run;
    SIGKILLed after its next checkpoint, it is resumed from that one with `--resume CHECKPOINT`. The
    metric history and the final policy equal the uninterrupted run's exactly. (All env steps before
    each interruption come from separate processes, so this also shows sync mode reproducible.)"""
    checkpoints = tmp_path / "runs"
    stopped = subprocess.Popen(aa_ray_command(*SETTINGS), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)
    wait_for(lambda: bool(step_checkpoints(checkpoints)) or stopped.poll() is not None, "the first checkpoint")
    # into the next interval (what SIGKILL would lose), but well before the budget: on a quiet 2-core
    # machine the run goes from its first checkpoint to its last step in under a second
    time.sleep(0.1)
    assert stopped.poll() is None, "the run ended before it could be stopped"
    sent = time.monotonic()
    stopped.send_signal(signal.SIGTERM)  # to the driver alone, as `kill -TERM` and Kubernetes send it
    _, err = stopped.communicate(timeout=60)
    assert stopped.returncode == 75, err[-3000:]
    assert time.monotonic() - sent < 25  # runtime.stop_grace_s's default
    assert "Traceback" not in err and "--resume latest" in err
    [event] = [json.loads(line) for line in next(checkpoints.glob("*/events.jsonl")).read_text().splitlines()]
    assert event["event"] == "preempted" and event["signal"] == "SIGTERM"
    last = Path(event["checkpoint"])
    stopped_at = load_checkpoint(last).driver.counters.env_steps
    assert 300 <= stopped_at < 600 and last.name == f"step_{stopped_at:09d}"
    client = MlflowClient()
    [run] = client.search_runs([client.get_experiment_by_name("aa-ray").experiment_id])
    assert run.info.status == "KILLED" and run.data.tags["stop_reason"].startswith("stopped by SIGTERM")

    with (tmp_path / "resumed.log").open("w") as out:
        killed = subprocess.Popen(aa_ray_command(*SETTINGS, "--resume", "latest"), stdout=out, stderr=subprocess.STDOUT,
                                  start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        wait_for(lambda: step_checkpoints(checkpoints)[-1].name != last.name or killed.poll() is not None,
                 "a checkpoint after the resume")
        # a few iterations past the checkpoint, for the next resume to overwrite what they logged (the
        # resumed run reaches its budget a second after it; a killed one writes no final checkpoint)
        time.sleep(0.2)
        assert killed.poll() is None, "the run ended before it could be killed"
        os.killpg(killed.pid, signal.SIGKILL)
        killed.wait()
    console = (tmp_path / "resumed.log").read_text()
    assert f"resuming from {last}" in console
    newest = step_checkpoints(checkpoints)[-1]
    assert not (newest.parent / "final").exists()
    killed_at = load_checkpoint(newest).driver.counters.env_steps
    assert 600 <= killed_at < 900

    resumed = subprocess.run(aa_ray_command(*SETTINGS, "--resume", str(newest)), capture_output=True, text=True,
                             timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert mlflow_run_id(resumed.stdout) == run.info.run_id
    assert client.get_run(run.info.run_id).info.status == "FINISHED"
    assert_repeats(whole_run, finished(resumed.stdout, checkpoints), stopped_at, killed_at)


def kill_actor_process(class_name: str) -> int:
    """SIGKILL the process of one live actor of this class (as the OOM killer or a crash would),
    among this test's own processes (the embedded Ray is started from this one)."""
    for process in psutil.Process().children(recursive=True):
        cmdline = []
        with contextlib.suppress(psutil.Error):
            cmdline = process.cmdline()
        if cmdline and cmdline[0].startswith(f"ray::{class_name}"):
            process.kill()
            return process.pid
    raise AssertionError(f"no {class_name} process to kill")


def test_chaos_runner_then_replay_then_learner_killed_by_pid(tmp_path: Path) -> None:
    """A runner is replaced in place; the replay actor and then a learner each take the actor graph
    back to the last checkpoint. The run still ends at its budget, as one FINISHED MLflow run with
    the restarts logged, and after each recovery the replay holds at least the checkpointed rows."""
    spec = load_spec(SPECS / "sac.yaml", [*SMALL, "budget.env_steps=2400", "checkpoint.every_env_steps=400",
                                          "eval.every_env_steps=800"])
    trainer = Trainer(spec, run_dir=tmp_path / "run", live=False)
    outcome: dict = {}
    thread = threading.Thread(target=lambda: outcome.update(result=trainer.run()), daemon=True)
    thread.start()
    checkpointed_rows = []

    wait_for(lambda: trainer.last_checkpoint is not None, "the first checkpoint")
    kill_actor_process("EnvRunner")
    wait_for(lambda: trainer.runner_restarts == 1, "the runner restart")

    checkpoint = trainer.last_checkpoint
    checkpointed_rows.append(load_checkpoint(checkpoint).replay_rows)
    kill_actor_process("ReplayBuffer")
    wait_for(lambda: trainer.graph_restarts == 1, "the first graph restart")

    wait_for(lambda: trainer.last_checkpoint not in (None, checkpoint), "a checkpoint after the recovery")
    checkpointed_rows.append(load_checkpoint(trainer.last_checkpoint).replay_rows)
    kill_actor_process("Learner")
    wait_for(lambda: trainer.graph_restarts == 2, "the second graph restart")
    thread.join(timeout=300)

    result = outcome["result"]
    assert result.env_steps >= 2400 and result.replay_size > max(checkpointed_rows)
    assert result.runner_restarts == 1 and result.graph_restarts == 2
    events = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events] == ["runner_restart", "actor_graph_restart", "actor_graph_restart"]
    assert events[1]["lost"] == ["replay"] and events[2]["lost"] == ["learner 0"]
    for event, rows in zip(events[1:], checkpointed_rows, strict=True):
        assert event["replay_size"] >= rows > 0

    client = MlflowClient()
    runs = client.search_runs([client.get_experiment_by_name("aa-ray").experiment_id])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"  # recovered in place, not forked
    run_id = runs[0].info.run_id
    assert client.get_metric_history(run_id, "runtime/graph_restarts")[-1].value == 2.0
    assert client.get_metric_history(run_id, "runtime/runner_restarts")[-1].value == 1.0
    sizes = sorted(client.get_metric_history(run_id, "replay/size"), key=lambda m: m.timestamp)
    restarts = sorted(client.get_metric_history(run_id, "runtime/graph_restarts"), key=lambda m: m.timestamp)
    for restart, rows in zip(restarts, checkpointed_rows, strict=True):
        after = [m.value for m in sizes if m.timestamp >= restart.timestamp]
        assert after and min(after) >= rows  # the buffer came back whole and only grew from there
    assert "events.jsonl" in {a.path for a in client.list_artifacts(run_id)}
