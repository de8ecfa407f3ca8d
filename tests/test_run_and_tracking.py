"""End to end on a real local Ray and a real MLflow (SQLite) store: the CLI run, what MLflow holds
afterwards, and resuming a run from its checkpoint into the same MLflow run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from mlflow.tracking import MlflowClient

from aa_ray.runtime.trainer import Trainer
from aa_ray.spec.loader import load_spec

ROOT = Path(__file__).resolve().parents[1]
SPECS = ROOT / "specs"

# What the CLI's path is checked for does not depend on the network: 64 wide, a batch of 64 (a few
# times cheaper per update than the spec's 256 on 2 cores)
SMALL_NETS = [arg for setting in ("algo.actor_hidden_dims=[64,64]", "algo.critic_hidden_dims=[64,64]",
                                  "algo.batch_size=64") for arg in ("--set", setting)]


def aa_ray(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "aa_ray.cli", *args], capture_output=True, text=True, timeout=600,
        env={**os.environ, **(env or {})},
    )


RAY_BIN = Path(sys.executable).parent / "ray"
CLUSTER = "127.0.0.1:6391"
TOKEN_AUTH = {"RAY_AUTH_MODE": "token"}
JOINING = {**TOKEN_AUTH, "RAY_ADDRESS": CLUSTER}  # only for the commands given it: nothing leaves the module


@pytest.fixture(scope="module")
def short_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """One short Pendulum run through the CLI on Ray, then a resume (inline) that extends its budget.
    The run joins a `ray start` cluster (token authentication on) through RAY_ADDRESS, up until the
    module ends for the tests that join it too; the CLI's own embedded Ray (the README's command) is
    run to the end by tests/test_reliability.py and tests/test_resume_edges.py."""
    workdir = tmp_path_factory.mktemp("cli")
    temp_dir = tempfile.mkdtemp(prefix="aa_ray_", dir="/tmp")  # short: Ray's socket paths live under it
    try:
        # undone when the runs end: a later module's tests (and the clusters they start) must not
        # inherit this folder or this store
        with pytest.MonkeyPatch.context() as patch:
            patch.chdir(workdir)  # the cluster's too: its workers start in the run's folder, as an embedded Ray's do
            patch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{workdir / 'mlflow.db'}")
            start = start_cluster(temp_dir)
            assert start.returncode == 0, start.stderr[-2000:]
            first = aa_ray(
                "run",
                str(SPECS / "sac_pendulum.yaml"),
                "--plain",
                "--set",
                "budget.env_steps=2000",
                "--set",
                "checkpoint.every_env_steps=1000",
                *SMALL_NETS,
                env=JOINING,
            )
            assert first.returncode == 0, first.stderr[-3000:]
            run_dir = next((workdir / "runs").iterdir())
            client = MlflowClient()
            run = client.search_runs([client.get_experiment_by_name("aa-ray").experiment_id])[0]
            first_history = [m.step for m in client.get_metric_history(run.info.run_id, "env/steps")]
            second = aa_ray(
                "run",
                str(SPECS / "sac_pendulum.yaml"),
                "--plain",
                "--set",
                "budget.env_steps=3000",
                # inline (no Ray to start): what is checked of the resume is its place in MLflow
                "--set",
                "runtime.backend=inline",
                "--resume",
                str(run_dir / "checkpoints" / "final"),
                *SMALL_NETS,
            )
            uri = os.environ["MLFLOW_TRACKING_URI"]
        yield {
            "first": first,
            "second": second,
            "run_dir": run_dir,
            "run_id": run.info.run_id,
            "first_history": first_history,
            "uri": uri,
        }
    finally:
        stop_cluster(temp_dir)


def test_cli_run_exits_zero_and_writes_checkpoints(short_run: dict) -> None:
    assert short_run["first"].returncode == 0
    checkpoints = short_run["run_dir"] / "checkpoints"
    assert (checkpoints / "final" / "state.pt").is_file()
    assert (checkpoints / "final" / "replay.parquet").is_file()
    assert any(p.name.startswith("step_") for p in checkpoints.iterdir())  # the periodic one


def test_mlflow_holds_params_metrics_and_artifacts(short_run: dict) -> None:
    client = MlflowClient(tracking_uri=short_run["uri"])
    run = client.get_run(short_run["run_id"])
    assert run.data.params["algo.name"] == "sac"
    assert run.data.params["env.id"] == "Pendulum-v1"
    assert run.data.tags["algo"] == "sac" and run.data.tags["env"] == "Pendulum-v1"
    assert len(run.data.tags["spec_hash"]) == 12
    for metric in ("env/steps", "eval/return", "train/episode_return", "replay/size", "critic/q_loss", "actor/alpha"):
        assert client.get_metric_history(run.info.run_id, metric), metric
    evals = client.get_metric_history(run.info.run_id, "eval/return")
    assert len(evals) >= 2  # a curve, not a single point
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"spec", "checkpoints"} <= artifacts
    final = {a.path for a in client.list_artifacts(run.info.run_id, "checkpoints/final")}
    assert {"checkpoints/final/state.pt", "checkpoints/final/spec.yaml"} <= final


def test_resume_continues_env_steps_and_the_same_mlflow_run(short_run: dict) -> None:
    assert short_run["second"].returncode == 0, short_run["second"].stderr[-3000:]
    client = MlflowClient(tracking_uri=short_run["uri"])
    runs = client.search_runs([client.get_experiment_by_name("aa-ray").experiment_id])
    assert len(runs) == 1  # resumed into the same run, not a fork
    steps = [m.step for m in client.get_metric_history(short_run["run_id"], "env/steps")]
    first_last = max(short_run["first_history"])
    assert first_last >= 2000
    resumed = [s for s in steps if s > first_last]
    assert resumed and min(resumed) <= first_last + 100  # picks up where it stopped, not from zero
    assert max(steps) >= 3000
    # the resume is marked at the checkpoint's env steps, so reports drop nothing of an attempt that ended there
    (marker,) = client.get_metric_history(short_run["run_id"], "run/resumed_at")
    assert marker.step == marker.value == first_last
    assert client.get_run(short_run["run_id"]).info.status == "FINISHED"


def test_resume_with_a_different_algo_is_refused(short_run: dict) -> None:
    result = aa_ray(
        "run",
        str(SPECS / "sac_pendulum.yaml"),
        "--set",
        "algo.critic_hidden_dims=[64]",
        "--resume",
        str(short_run["run_dir"] / "checkpoints" / "final"),
    )
    assert result.returncode == 2
    assert "algo.critic_hidden_dims" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.usefixtures("short_run")  # its cluster, of CPUs only
def test_asking_for_a_gpu_the_cluster_lacks_fails_fast_naming_it() -> None:
    result = aa_ray("run", str(SPECS / "sac_pendulum.yaml"), "--set", "learners.gpus_per_learner=1", "--no-track",
                    env=JOINING)
    assert result.returncode == 1
    assert "needs 1 GPU" in result.stderr and "Traceback" not in result.stderr


def test_ray_address_joins_an_existing_cluster(short_run: dict) -> None:
    """With RAY_ADDRESS set the run joins that cluster (token authentication on) instead of
    starting its own, and leaves the cluster running."""
    first = short_run["first"]
    assert first.returncode == 0, first.stderr[-3000:]
    assert CLUSTER in first.stderr  # connected to the existing cluster
    assert "Started a local Ray" not in first.stdout + first.stderr
    status = subprocess.run(
        [str(RAY_BIN), "status", "--address", CLUSTER],
        capture_output=True,
        text=True,
        env={**os.environ, **TOKEN_AUTH},
        timeout=60,
    )
    assert status.returncode == 0  # still up after the run


def start_cluster(temp_dir: str) -> subprocess.CompletedProcess:
    """A `ray start` head of 4 CPUs on CLUSTER's port, in the current folder and environment."""
    return subprocess.run(
        [
            str(RAY_BIN),
            "start",
            "--head",
            "--port",
            CLUSTER.rsplit(":", 1)[1],
            "--num-cpus",
            "4",
            "--include-dashboard=false",
            "--disable-usage-stats",
            f"--temp-dir={temp_dir}",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, **TOKEN_AUTH},
        timeout=120,
    )


def stop_cluster(temp_dir: str) -> None:
    """Stop only the cluster whose processes live under `temp_dir`: `ray stop` would stop every
    Ray on the machine, a user's runs included."""
    cluster = [
        process
        for process in psutil.process_iter(["cmdline"])
        if any(temp_dir in part for part in process.info["cmdline"] or [])
    ]
    for process in cluster:
        process.terminate()
    # the GCS and the raylet outlive SIGTERM by far more than the test cares to wait (the full 30 s
    # measured): what has not gone in a few seconds is killed, as `ray stop --force` would
    _, alive = psutil.wait_procs(cluster, timeout=3)
    for process in alive:
        process.kill()
    shutil.rmtree(temp_dir, ignore_errors=True)


POINT_REACH = ROOT / "tests" / "user_envs" / "point_reach.yaml"
TINY_INLINE = [  # a few seconds in this process: inline backend, tiny networks, evaluations every 100 env steps
    f"env.py_modules=[{ROOT / 'tests' / 'user_envs' / 'myenvs'}]", "runtime.backend=inline",
    "algo.warm_up_steps=50", "algo.batch_size=16", "algo.actor_hidden_dims=[16]", "algo.critic_hidden_dims=[16]",
    "eval.every_env_steps=100", "eval.episodes=3", "budget.env_steps=300", "checkpoint.save_replay=false",
]


@pytest.mark.parametrize(("stop_at", "evaluations", "reason"), [
    ("{metric: eval/error, below: 100}", 1, "target reached"),  # the distance to the target is below 3
    ("{metric: eval/return, above: -1000}", 1, "target reached"),  # 40 steps of rewards above -3
    ("{metric: eval/error, above: 100}", 3, "budget"),  # never: the run goes to its budget (evaluating at the end)
])
def test_a_listed_info_metric_reaches_mlflow_and_can_stop_the_run(stop_at: str, evaluations: int, reason: str) -> None:
    """The point env (tests/user_envs) reports info["error"] and info["is_success"] and declares no
    task metrics; the spec lists `error`. Its mean at the eval episodes' ends is eval/error, the
    recent training episodes' is train/error, and is_success gives eval/success and train/success,
    all in the run's MLflow metrics; budget.stop_at on any of them stops the run."""
    spec = load_spec(POINT_REACH, [*TINY_INLINE, "eval.info_metrics=[error]", f"budget.stop_at={stop_at}"])
    result = Trainer(spec, live=False).run()
    assert result.stop_reason == reason and len(result.evals) == evaluations
    assert (result.env_steps >= 300) == (reason == "budget")
    client = MlflowClient()
    metrics = client.get_run(result.mlflow_run_id).data.metrics
    last_eval = result.evals[-1]
    assert metrics["eval/error"] == pytest.approx(last_eval["eval/error"]) and 0 < last_eval["eval/error"] < 3
    assert 0 <= metrics["eval/success"] <= 1 and metrics["eval/success"] == pytest.approx(last_eval["eval/success"])
    assert 0 < metrics["train/error"] < 3 and 0 <= metrics["train/success"] <= 1  # 40-step episodes ended
    assert len(client.get_metric_history(result.mlflow_run_id, "eval/error")) == evaluations
