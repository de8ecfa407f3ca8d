"""MLflow tracking for one training run: params, tags, batched metrics and artifacts.

Talks to the store through `MlflowClient` with an explicit run id (no global active run), and
buffers metrics so the store sees one `log_batch` call every few seconds, not one per value.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import mlflow
from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from aa_ray.spec.experiment import ExperimentSpec
from aa_ray.spec.loader import flatten, spec_hash, spec_to_dict

_MAX_BATCH = 1000  # MLflow's limit of metrics per log_batch call
_MAX_PARAMS = 100  # and of params per call


def git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
            cwd=Path(__file__).resolve().parent,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


class MlflowTracker:
    def __init__(self, spec: ExperimentSpec, run_id: str | None = None, tracking_uri: str | None = None):
        self.client = MlflowClient(tracking_uri=tracking_uri or mlflow.get_tracking_uri())
        self.flush_every_s = spec.tracking.flush_every_s
        self.pending: list[Metric] = []
        self.last_flush = time.monotonic()
        if run_id is not None:  # resuming: keep writing into the same run
            self.run_id = run_id
            self.client.update_run(run_id, status="RUNNING")
            return
        experiment = self.client.get_experiment_by_name(spec.tracking.experiment)
        experiment_id = (
            experiment.experiment_id if experiment else self.client.create_experiment(spec.tracking.experiment)
        )
        tags = {
            "algo": spec.algo.name,
            "env": spec.env.id,
            "spec_hash": spec_hash(spec),
            "mlflow.runName": f"{spec.name}-{spec_hash(spec)[:6]}",
        }
        commit = git_commit()
        if commit:
            tags["git_commit"] = commit
        run = self.client.create_run(experiment_id, tags=tags)
        self.run_id = run.info.run_id
        params = [Param(k, str(v)[:6000]) for k, v in flatten(spec_to_dict(spec)).items()]
        for i in range(0, len(params), _MAX_PARAMS):
            self.client.log_batch(self.run_id, params=params[i : i + _MAX_PARAMS])

    @property
    def uri(self) -> str:
        return str(self.client.tracking_uri)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        now_ms = int(time.time() * 1000)
        self.pending += [Metric(k, float(v), now_ms, step) for k, v in metrics.items()]
        if time.monotonic() - self.last_flush >= self.flush_every_s:
            self.flush()

    def flush(self) -> None:
        for i in range(0, len(self.pending), _MAX_BATCH):
            self.client.log_batch(self.run_id, metrics=self.pending[i : i + _MAX_BATCH])
        self.pending = []
        self.last_flush = time.monotonic()

    def set_tag(self, key: str, value: str) -> None:
        self.client.log_batch(self.run_id, tags=[RunTag(key, value)])

    def log_artifacts(self, folder: Path, artifact_path: str) -> None:
        self.client.log_artifacts(self.run_id, str(folder), artifact_path)

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(self.run_id, str(path), artifact_path)

    def finish(self, status: str = "FINISHED") -> None:
        self.flush()
        self.client.set_terminated(self.run_id, status=status)
