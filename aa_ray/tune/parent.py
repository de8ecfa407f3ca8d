"""What sweeps, suites and pipelines share on the driver: the MLflow parent run their trials nest under
(where `tracking.backends` has mlflow), what each trial is told about where it is tracked
(`trial_tracking`: that parent run, and the group the other backends show its trials in), and absolute
paths (Tune runs each trial in a folder of its own, so a relative path in a spec would point somewhere
else there)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from aa_ray.errors import SpecError
from aa_ray.runtime import cluster
from aa_ray.runtime.run_record import STOP_REASON_TAG
from aa_ray.spec.loader import set_values
from aa_ray.tracking.mlflow_tracker import (
    PARENT_TAG,
    compare_link,
    log_in_batches,
    opening_store,
    resolved_tracking_uri,
    retry_locked,
    run_link,
    search_all_runs,
    start_run,
)

KIND_TAG = "aa_ray.kind"  # "sweep", "suite" or "pipeline" on the parent run


def tune_storage(configured: str | None, default: Path, source: Path) -> str:
    """Tune's storage path. A multi-node cluster needs storage every node reaches (a retried trial
    may start on another node); the default, a folder on this machine, is refused there."""
    import ray

    if configured is not None:
        return configured if "://" in configured else str(Path(configured).expanduser().resolve())
    nodes = [node for node in ray.nodes() if node["Alive"]]
    if len(nodes) > 1:
        raise SpecError(
            f"{source}: this Ray cluster has {len(nodes)} nodes, but Tune would keep trial checkpoints in {default} "
            "on this machine only, where trials on other nodes cannot write or restore them. Set storage: to a path "
            "every node mounts (NFS) or a URI such as s3://bucket/aa-ray, and runtime.output_dir to shared storage "
            "too (run folders, pipeline stage outputs)."
        )
    return str(default)


def absolute_paths(raw: dict[str, Any]) -> dict[str, Any]:
    """A copy of a raw experiment spec whose relative paths (runtime.output_dir, algo.prior_data)
    are made absolute from the current folder, as `aa-ray run` would read them."""
    values = {"runtime.output_dir": str(Path(raw.get("runtime", {}).get("output_dir", "runs")).resolve())}
    prior = raw.get("algo", {}).get("prior_data")
    if isinstance(prior, str):
        values["algo.prior_data"] = str(Path(prior).expanduser().resolve())
    return set_values(raw, values)


class ParentRun:
    """The MLflow run a sweep, suite or pipeline invocation is; its trials/stages are nested child runs.
    `reopen` continues an earlier one (a suite invoked again) where the store still has it."""

    def __init__(self, experiment: str, kind: str, name: str, run_name: str, tags: dict[str, str] | None = None,
                 reopen: str | None = None):
        self.uri = resolved_tracking_uri()
        self.experiment, self.kind, self.name = experiment, kind, name
        self.tags = {f"aa_ray.{kind}": name}  # on the parent and every child
        parent_tags = {**self.tags, KIND_TAG: kind, "mlflow.runName": run_name, **(tags or {})}
        with opening_store(self.uri):
            self.client = MlflowClient(tracking_uri=self.uri)
            if reopen is not None and self._exists(reopen):  # a resumed invocation continues its parent
                self.run_id = reopen
                retry_locked(lambda: self.client.update_run(reopen, status="RUNNING"))
                if STOP_REASON_TAG in self.client.get_run(reopen).data.tags:  # it is no longer stopped
                    retry_locked(lambda: self.client.delete_tag(reopen, STOP_REASON_TAG))
            else:
                self.run_id = start_run(self.client, experiment, parent_tags)
            self.experiment_id = self.client.get_run(self.run_id).info.experiment_id

    def _exists(self, run_id: str) -> bool:
        from mlflow.exceptions import MlflowException

        try:
            return self.client.get_run(run_id).info.lifecycle_stage == "active"
        except MlflowException:  # another store, or deleted for good
            return False

    def child_tracking(self, run_name: str, tags: dict[str, str]) -> dict[str, Any]:
        """What a trial needs to record itself as a child of this run (plain data, sent to Tune)."""
        return {
            "uri": self.uri, "experiment_id": self.experiment_id, "parent_run_id": self.run_id,
            "run_name": run_name, "tags": {**self.tags, **tags},
        }

    @property
    def url(self) -> str:
        """The parent's page in the MLflow UI: its children listed under it."""
        return run_link(self.uri, self.experiment_id, self.run_id)

    def children(self) -> list[Any]:
        return search_all_runs(self.client, [self.experiment_id], f"tags.`{PARENT_TAG}` = '{self.run_id}'")

    def copy_child(self, source_run_id: str, run_name: str, tags: dict[str, str]) -> str:
        """A child run standing for a reused result: the source run's params and the latest value of
        every metric (however many), tagged with where they came from, so this invocation's compare
        view still lines it up."""
        source = self.client.get_run(source_run_id)
        run_id = start_run(self.client, self.experiment, {
            **self.tags, **tags, PARENT_TAG: self.run_id, "mlflow.runName": run_name,
            "aa_ray.reused_from": source_run_id,
        })
        params = [Param(k, v) for k, v in source.data.params.items()]
        metrics = [Metric(k, v, 0, 0) for k, v in source.data.metrics.items()]
        log_in_batches(self.client, run_id, metrics=metrics, params=params)
        retry_locked(lambda: self.client.set_terminated(run_id))
        return run_id

    def log(self, metrics: dict[str, float] | None = None, params: dict[str, Any] | None = None,
            tags: dict[str, str] | None = None) -> None:
        # stamped now: MLflow keeps the newest value of a step as the run's, and with equal stamps the
        # largest, so a resumed sweep's best (min mode) was hidden behind the one logged when it stopped
        now_ms = int(time.time() * 1000)
        retry_locked(lambda: self.client.log_batch(
            self.run_id,
            metrics=[Metric(k, float(v), now_ms, 0) for k, v in (metrics or {}).items()],
            params=[Param(k, str(v)[:6000]) for k, v in (params or {}).items()],
            tags=[RunTag(k, str(v)) for k, v in (tags or {}).items()],
        ))

    def log_artifact(self, path: Path) -> None:
        retry_locked(lambda: self.client.log_artifact(self.run_id, str(path)))

    def finish(self, status: str, reason: str | None = None) -> None:
        """End the parent (with `reason` as its stop reason, when it did not finish); children a
        scheduler stopped mid-run (their process ended without closing the run) are marked KILLED
        rather than left RUNNING."""
        for child in self.children():
            if child.info.status == "RUNNING":
                retry_locked(lambda child=child: self.client.set_terminated(child.info.run_id, status="KILLED"))
        if reason is not None:
            retry_locked(lambda: self.client.set_tag(self.run_id, STOP_REASON_TAG, reason))
        retry_locked(lambda: self.client.set_terminated(self.run_id, status=status))


def trial_tracking(parent: ParentRun | None, kind: str, name: str, group: str, run_name: str,
                   tags: dict[str, str]) -> dict[str, Any]:
    """What a trial or stage of the sweep, suite or pipeline `name` needs to be tracked (plain data
    sent to Tune): a child of the MLflow `parent` run where there is one, and in every backend part
    of `group` (W&B's group; in TensorBoard, the trials' run folders are in the folder of that name)."""
    if parent is not None:
        return {**parent.child_tracking(run_name, tags), "group": group}
    return {"uri": None, "experiment_id": None, "parent_run_id": None, "run_name": run_name,
            "tags": {f"aa_ray.{kind}": name, **tags}, "group": group}


def end_invocation(parent: ParentRun | None, status: str, started_ray: bool, report: Any = print,
                   reason: str | None = None) -> None:
    """What every sweep, suite and pipeline invocation does last: end its parent run (and show
    where the MLflow UI compares its children), and the embedded Ray it started (a cluster it
    joined is left running)."""
    if parent is not None:
        parent.finish(status, reason)
        children = [child.info.run_id for child in parent.children() if child.info.status == "FINISHED"]
        if len(children) > 1:
            report(f"compare in the MLflow UI: {compare_link(parent.uri, parent.experiment_id, children)}")
    cluster.disconnect(started_ray)
