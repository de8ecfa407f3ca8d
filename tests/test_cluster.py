"""The cluster path for real: `cluster/local_cluster.sh` starts a head and a worker node (token
authentication on), `ray job submit` runs `aa-ray run` on them, and the MLflow store named in
the job's runtime env holds the finished run. Submissions without the token are refused, and a
job that would lose its MLflow record fails at once, saying how to fix it."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@pytest.fixture(scope="module")
def two_nodes():
    """A head (2 CPUs) and a worker node (2 CPUs) on this machine, stopped afterwards."""
    state = tempfile.mkdtemp(prefix="aac_", dir="/tmp")  # short: Ray's socket paths live under it
    gcs, dashboard, head_metrics, worker_metrics = free_ports(4)
    env = {
        **os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "RAY": str(BIN / "ray"), "AA_RAY_CLUSTER_DIR": state,
        "GCS_PORT": str(gcs), "DASHBOARD_PORT": str(dashboard), "HEAD_METRICS_PORT": str(head_metrics),
        "WORKER_METRICS_PORT": str(worker_metrics),
    }
    env.pop("RAY_ADDRESS", None)
    env.pop("MLFLOW_TRACKING_URI", None)  # the nodes get no store of their own: each job names its own
    script = str(ROOT / "cluster" / "local_cluster.sh")
    started = subprocess.run([script, "start"], env=env, capture_output=True, text=True, timeout=300)
    try:
        assert started.returncode == 0, started.stderr[-3000:]
        client_env = {**env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": f"{state}/auth_token"}
        yield {"env": client_env, "address": f"http://127.0.0.1:{dashboard}", "state": Path(state)}
    finally:
        subprocess.run([script, "stop"], env=env, capture_output=True, timeout=120)
        shutil.rmtree(state, ignore_errors=True)


def submit(cluster: dict, working_dir: Path, *entrypoint: str, env_vars: dict | None = None,
           extra_env: dict | None = None, no_wait: bool = False) -> subprocess.CompletedProcess:
    command = [str(BIN / "ray"), "job", "submit", "--address", cluster["address"], "--working-dir", str(working_dir),
               *(["--no-wait"] if no_wait else [])]
    if env_vars:
        command += ["--runtime-env-json", json.dumps({"env_vars": env_vars})]
    return subprocess.run([*command, "--", *entrypoint], env={**cluster["env"], **(extra_env or {})},
                          capture_output=True, text=True, timeout=600)


def test_a_stopped_job_checkpoints_and_its_resubmission_resumes_there(two_nodes: dict, tmp_path: Path) -> None:
    """`ray job stop` (SIGTERM, then SIGKILL after the cluster's RAY_JOB_STOP_WAIT_TIME_S, which
    cluster/local_cluster.sh raises to 30 s) as a preempted job's scheduler would: the driver writes a
    checkpoint and ends its MLflow run KILLED; the same command resubmitted with --resume latest
    continues that run from that checkpoint."""
    store, out = f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "runs"
    command = ["aa-ray", "run", "specs/sac_pendulum.yaml", "--plain", "--set", f"runtime.output_dir={out}",
               "--set", "algo.actor_hidden_dims=[32,32]", "--set", "algo.critic_hidden_dims=[32,32]",
               "--set", "eval.episodes=1", "--set", "checkpoint.every_env_steps=400", "--resume", "latest"]
    job = submit(two_nodes, ROOT, *command, "--set", "budget.env_steps=100000", env_vars={"MLFLOW_TRACKING_URI": store},
                 no_wait=True)
    job_id = job.stdout.split("Job '")[1].split("'")[0]
    deadline = time.monotonic() + 300
    while not [p for p in out.glob("*/checkpoints/step_*") if "." not in p.name]:
        assert time.monotonic() < deadline, "no checkpoint within 300 s"
        time.sleep(0.5)
    ray = [str(BIN / "ray"), "job"]
    subprocess.run([*ray, "stop", "--address", two_nodes["address"], job_id], env=two_nodes["env"], check=True,
                   capture_output=True, timeout=120)
    [event] = [json.loads(line) for line in next(out.glob("*/events.jsonl")).read_text().splitlines()]
    assert event["event"] == "preempted" and event["signal"] == "SIGTERM", event
    stopped_at = int(Path(event["checkpoint"]).name.removeprefix("step_"))
    client = MlflowClient(store)
    (run,) = client.search_runs([client.get_experiment_by_name("aa-ray").experiment_id])
    assert run.info.status == "KILLED"

    resumed = submit(two_nodes, ROOT, *command, "--set", f"budget.env_steps={stopped_at + 200}",
                     env_vars={"MLFLOW_TRACKING_URI": store})
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-4000:]
    assert f"resuming from {event['checkpoint']}" in resumed.stdout
    (run,) = client.search_runs([client.get_experiment_by_name("aa-ray").experiment_id])
    assert run.info.status == "FINISHED" and run.data.metrics["run/resumed_at"] == stopped_at


def test_a_job_on_two_nodes_trains_the_users_env_package_and_records_in_mlflow(two_nodes: dict, tmp_path: Path) -> None:
    """`aa-ray run` as a job, with a spec that needs more CPUs (3.5) than one node has (2): the actors
    spread over both nodes, Ray ships the user's own env package (tests/user_envs/myenvs, named in
    env.py_modules, not importable from the working dir's root) to the runners on both, the job
    succeeds, and its finished run is in the store it was pointed at. The two runners learn: a random
    policy's 40-step return is about -40, the trained one's better than -25 after 3,000 env steps
    (tests/test_user_envs.py trains the same package inline; a built-in env's job: the stopped-job
    test above, which also finishes its run)."""
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    job = submit(two_nodes, ROOT, "aa-ray", "run", "tests/user_envs/point_reach.yaml", "--plain",
                 "--set", "runners.num_runners=2", "--set", "budget.env_steps=3000",
                 "--set", "eval.every_env_steps=1500", env_vars={"MLFLOW_TRACKING_URI": store})
    assert job.returncode == 0 and "succeeded" in job.stdout + job.stderr, (job.stdout + job.stderr)[-4000:]
    client = MlflowClient(store)
    (run,) = client.search_runs([client.get_experiment_by_name("aa-ray").experiment_id])
    assert run.info.status == "FINISHED" and run.data.metrics["env/steps"] >= 3000
    assert run.data.params["runners.num_runners"] == "2" and run.data.tags["env"] == "myenvs/PointReach-v0"
    assert run.data.metrics["eval/return"] > -25.0, run.data.metrics


def test_a_job_without_a_tracking_uri_fails_saying_how_to_fix_it(two_nodes: dict, tmp_path: Path) -> None:
    (tmp_path / "tiny.yaml").write_text((ROOT / "specs" / "sac_pendulum.yaml").read_text())
    job = submit(two_nodes, tmp_path, "aa-ray", "run", "tiny.yaml", "--set", "budget.env_steps=1200")
    output = job.stdout + job.stderr
    assert job.returncode != 0 and "MLFLOW_TRACKING_URI is not set" in output, output[-3000:]
    assert "--runtime-env-json" in output and "Traceback" not in output


def test_submissions_without_the_token_are_refused(two_nodes: dict, tmp_path: Path) -> None:
    job = submit(two_nodes, tmp_path, "python", "-c", "print('ran')", extra_env={"RAY_AUTH_TOKEN": "not-the-token"})
    assert job.returncode != 0 and "ran" not in job.stdout
    assert "token is invalid" in job.stdout + job.stderr
    with pytest.raises(urllib.error.HTTPError) as refused:  # the job API itself, with no token at all
        urllib.request.urlopen(f"{two_nodes['address']}/api/jobs/", timeout=10)
    assert refused.value.code == 401
    token = (two_nodes["state"] / "auth_token").read_text().strip()
    request = urllib.request.Request(f"{two_nodes['address']}/api/jobs/", headers={"Authorization": f"Bearer {token}"})
    assert urllib.request.urlopen(request, timeout=10).status == 200


def test_cluster_configs_parse_and_keep_auth_and_loopback() -> None:
    """The launcher and KubeRay files are valid YAML of the right kinds, run specs that exist, keep
    token authentication on and the dashboard on loopback (or behind a ClusterIP service)."""
    import yaml

    for name, provider in (("aws.yaml", "aws"), ("onprem.yaml", "local")):
        config = yaml.safe_load((ROOT / "cluster" / name).read_text())
        assert config["provider"]["type"] == provider
        head = " ".join(config["head_start_ray_commands"])
        assert "RAY_AUTH_MODE=token" in head and "--dashboard-host=127.0.0.1" in head
    manifests = {}
    for name in ("raycluster.yaml", "rayjob.yaml"):
        (document,) = yaml.safe_load_all((ROOT / "cluster" / "kuberay" / name).read_text())
        manifests[document["kind"]] = document
    assert set(manifests) == {"RayCluster", "RayJob"}
    assert manifests["RayCluster"]["spec"]["authOptions"]["mode"] == "token"
    job = manifests["RayJob"]["spec"]
    assert job["rayClusterSpec"]["authOptions"]["mode"] == "token"
    command = job["entrypoint"].split()
    assert command[:2] == ["aa-ray", "run"] and (ROOT / command[2]).is_file()
