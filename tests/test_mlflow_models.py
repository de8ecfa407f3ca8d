"""A run's policy as an MLflow Model (`aa_ray.tracking.models`).

Real runs (inline backend, small networks, a few hundred env steps, the test's SQLite store) log
their final policy with MLflow's model API: `mlflow.pyfunc.load_model(runs:/<run>/policy)` acts as
`load_policy(checkpoint).predict`, in a process where aa_ray cannot be imported too; the PyTorch
flavor does the same; the signature takes one tensor for a flat observation and names the actor's
keys for a Dict one; `mlflow models serve` answers a real HTTP request with those actions; the
register knob makes a registered version; the best evaluation's policy is the weights of that
evaluation. The upload goes through the outbox: an outage in the middle of it is resumed (one
logged model), a name the registry refuses is one event and leaves the model stored."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mlflow.pyfunc
import mlflow.pytorch
import numpy as np
import torch
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import TEMPORARILY_UNAVAILABLE
from mlflow.tracking import MlflowClient

from aa_ray import cli
from aa_ray.algos.registry import build_policy
from aa_ray.api import Experiment, RunResult, load_policy
from aa_ray.envs import env_dims
from aa_ray.runtime.run_files import EVENTS_FILE
from aa_ray.spec.loader import read_yaml, set_values, validate_spec
from aa_ray.tracking.models import BEST_MODEL, FINAL_MODEL, ModelUpload, save_policy_model
from aa_ray.tracking.outbox import Outbox

SPECS = Path(__file__).resolve().parents[1] / "specs"
SHORT_RUN = {
    "runtime.backend": "inline", "runners.num_runners": 1, "runners.envs_per_runner": 1, "budget.env_steps": 300,
    "algo.warm_up_steps": 100, "algo.batch_size": 32, "eval.every_env_steps": 150, "eval.episodes": 1,
    "checkpoint.every_env_steps": 150, "checkpoint.keep_last": 10, "algo.normalize_obs": True,
}
SMALL_MLP = {"algo.actor_hidden_dims": [32, 32], "algo.critic_hidden_dims": [32, 32]}
SMALL_SIMBA = {"algo.actor_hidden_dim": 32, "algo.critic_hidden_dim": 32}


def train(spec_file: str, tmp_path: Path, **overrides: Any) -> RunResult:
    settings = {**SHORT_RUN, "runtime.output_dir": str(tmp_path / "runs"), **overrides}
    return Experiment(SPECS / spec_file, settings).fit(progress="plain")


def observations(policy: Any, rows: int = 16) -> np.ndarray:
    """Raw observations spread wider than the env's, so the normalizer's clip matters too."""
    return np.random.default_rng(3).normal(size=(rows, policy.obs_dim)).astype(np.float32) * 3


def run_events(result: RunResult) -> list[dict[str, Any]]:
    events = result.run_dir / EVENTS_FILE  # written with a run's first event
    return [json.loads(line) for line in events.read_text().splitlines()] if events.is_file() else []


def test_a_flat_observation_policy_loads_as_pyfunc_and_pytorch_and_is_registered(tmp_path: Path) -> None:
    result = train("sac.yaml", tmp_path, **SMALL_MLP, **{"tracking.register_model": "pusher-policy",
                                                        "tracking.log_best_model": True})
    policy = load_policy(result.checkpoint)
    obs = observations(policy)
    expected = policy.predict(obs)
    assert not np.allclose(expected, expected[0])  # it acts on the observations

    uri = f"runs:/{result.mlflow_run_id}/{FINAL_MODEL}"
    model = mlflow.pyfunc.load_model(uri)
    np.testing.assert_allclose(model.predict(obs), expected, atol=1e-5)
    (inputs,) = model.metadata.signature.inputs.inputs
    assert inputs.shape == (-1, policy.obs_dim) and inputs.type == np.dtype(np.float32)
    assert model.metadata.signature.outputs.inputs[0].shape == (-1, policy.act_dim)
    example = model.input_example
    assert isinstance(example, np.ndarray) and example.shape[1:] == (policy.obs_dim,)
    with torch.no_grad():  # the PyTorch flavor: the same program, called directly
        pytorch = mlflow.pytorch.load_model(uri)(torch.from_numpy(obs)).numpy()
    np.testing.assert_allclose(pytorch, expected, atol=1e-5)

    # loading needs MLflow and torch, not aa-ray
    np.save(tmp_path / "obs.npy", obs)
    script = f"""
import sys; sys.modules["aa_ray"] = None
import numpy as np, mlflow.pyfunc
np.save("actions.npy", mlflow.pyfunc.load_model({uri!r}).predict(np.load("obs.npy")))
"""
    loaded = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                            cwd=tmp_path)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    np.testing.assert_allclose(np.load(tmp_path / "actions.npy"), expected, atol=1e-5)

    client = MlflowClient()
    assert client.get_registered_model("pusher-policy").name == "pusher-policy"
    (version,) = client.search_model_versions("name='pusher-policy'")
    assert version.run_id == result.mlflow_run_id
    np.testing.assert_allclose(mlflow.pyfunc.load_model("models:/pusher-policy/1").predict(obs), expected, atol=1e-5)

    # aa-ray reads a logged model's policy data, never the code the model ships: a command planted in
    # its pyfunc loader (as in a model someone else logged) does not run, and the policy acts the same
    folder = result.run_dir / "models" / FINAL_MODEL
    marker = tmp_path / "ran"
    (loader,) = (folder / "code").rglob("policy_pyfunc.py")
    loader.write_text(f"import os\nos.system('touch {marker}')\n" + loader.read_text())
    for source in (folder, uri, "models:/pusher-policy/1"):
        np.testing.assert_allclose(load_policy(source).predict(obs), expected, atol=1e-6)
    assert cli.main(["eval", str(folder), "--episodes", "1"]) == 0
    assert not marker.exists()

    # the best evaluation's policy (the highest eval/return: sac.yaml has no stop rule) is the one the
    # checkpoint of that evaluation's iteration holds
    history = client.get_metric_history(result.mlflow_run_id, "eval/return")
    assert len(history) == 2
    best_step = max(history, key=lambda point: point.value).step
    best_checkpoint = result.run_dir / "checkpoints" / ("final" if best_step == result.env_steps
                                                        else f"step_{best_step:09d}")
    best = mlflow.pyfunc.load_model(f"runs:/{result.mlflow_run_id}/{BEST_MODEL}")
    np.testing.assert_allclose(best.predict(obs), load_policy(best_checkpoint).predict(obs), atol=1e-5)
    assert not any(event["kind"] == "model_not_logged" for event in run_events(result))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def serving(model_uri: str, cwd: Path) -> Iterator[str]:
    """`mlflow models serve` of the model on loopback (this environment, no new one); yields its base URL.

    The CLI starts `uvicorn` by name, so this environment's bin folder goes first on PATH, as it is for
    a user who activated it (`make test` runs .venv/bin/pytest without activating: CI found no uvicorn).
    """
    port = free_port()
    bin_folder = str(Path(sys.executable).parent)
    log = cwd / "serve.log"  # a file, not a pipe nobody reads while waiting: it cannot fill up
    with log.open("wb") as output:
        server = subprocess.Popen(
            [f"{bin_folder}/mlflow", "models", "serve", "-m", model_uri, "--env-manager", "local",
             "-h", "127.0.0.1", "-p", str(port)],
            stdout=output, stderr=subprocess.STDOUT, cwd=cwd, start_new_session=True,
            env={**os.environ, "PATH": os.pathsep.join([bin_folder, os.environ.get("PATH", "")])},
        )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError(f"mlflow models serve did not answer /ping (exit code {server.poll()}):\n"
                                       f"{log.read_text()[-3000:]}") from None
                time.sleep(0.5)
        yield f"http://127.0.0.1:{port}"
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)  # the server's session: the CLI and the uvicorn it started
            server.wait(timeout=30)


def test_a_dict_observation_policy_names_the_actor_keys_and_is_served_over_http(tmp_path: Path) -> None:
    result = train("sac_simba_grouped.yaml", tmp_path, **SMALL_SIMBA)
    policy = load_policy(result.checkpoint)
    assert policy.obs_keys == ("proprio", "command")
    obs = observations(policy)
    proprio = obs.shape[1] - 2  # command: the target's x, y
    by_key = {"proprio": obs[:, :proprio], "command": obs[:, proprio:]}
    expected = policy.predict(by_key)

    uri = f"runs:/{result.mlflow_run_id}/{FINAL_MODEL}"
    model = mlflow.pyfunc.load_model(uri)
    signature = model.metadata.signature.inputs
    assert signature.input_names() == ["proprio", "command"]  # the actor's keys, not the critic's privileged one
    assert [spec.shape for spec in signature.inputs] == [(-1, proprio), (-1, 2)]
    assert sorted(model.input_example) == ["command", "proprio"]
    np.testing.assert_allclose(model.predict(by_key), expected, atol=1e-5)

    with serving(uri, tmp_path) as base:
        body = json.dumps({"inputs": {key: value.tolist() for key, value in by_key.items()}}).encode()
        request = urllib.request.Request(f"{base}/invocations", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as answer:
            served = np.asarray(json.loads(answer.read())["predictions"], dtype=np.float32)
    np.testing.assert_allclose(served, expected, atol=1e-5)


class OnceUnavailable:
    """An MlflowClient whose artifact upload meets an outage (a 503) the first time."""

    def __init__(self, client: MlflowClient):
        self.client, self.failed = client, False
        self.created = 0

    def create_logged_model(self, *args: Any, **kwargs: Any) -> Any:
        self.created += 1
        return self.client.create_logged_model(*args, **kwargs)

    def log_model_artifacts(self, *args: Any, **kwargs: Any) -> None:
        if not self.failed:
            self.failed = True
            raise MlflowException("the server is restarting", error_code=TEMPORARILY_UNAVAILABLE)
        self.client.log_model_artifacts(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


def test_an_outage_mid_upload_resumes_it_and_a_refused_name_loses_only_the_registration(tmp_path: Path) -> None:
    raw = set_values(read_yaml(SPECS / "sac.yaml"), SMALL_MLP, source="test")
    spec = validate_spec(raw)
    obs, act_dim = env_dims(spec)
    state = build_policy(spec.algo, obs, act_dim).state_dict()  # untrained weights do for the plumbing
    saved = save_policy_model(spec, state, tmp_path / "model", FINAL_MODEL, env_steps=0)

    client = MlflowClient()
    experiment_id = client.create_experiment("models")
    run_id = client.create_run(experiment_id).info.run_id
    flaky = OnceUnavailable(client)
    upload = ModelUpload(flaky, run_id, experiment_id, saved)  # type: ignore[arg-type]
    outbox = Outbox(client.tracking_uri, lambda metrics: None, flush_every_s=0.1, retry_every_s=0.2)
    outbox.put_call("model", upload.send)
    outbox.put_call("registering", lambda: upload.register("bad/name"))
    assert outbox.close(wait_s=60) == 0

    assert flaky.failed and flaky.created == 1 and upload.stored  # resumed, not started over
    (logged,) = client.search_logged_models(experiment_ids=[experiment_id])
    assert logged.name == FINAL_MODEL and logged.source_run_id == run_id
    assert mlflow.pyfunc.load_model(f"runs:/{run_id}/{FINAL_MODEL}").metadata.signature is not None
    kinds = {notice.kind: notice.details for notice in outbox.take_notices()}
    assert "bad/name" in kinds["tracking_refused"]["reason"] and kinds["tracking_refused"]["what"] == "registering"
    assert "tracking_restored" in kinds
