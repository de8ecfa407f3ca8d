"""The one seam between a run and where it is recorded. The runtime (`runtime.run_record`) and Tune
(`tune.trials`) talk to a `Tracker`; `open_trackers` opens one per backend the spec names in
`tracking.backends` and hands back a `Trackers` that fans every call out to them:

- `mlflow` (`mlflow_tracker.py`, the default): the MLflow store, every write through the outbox,
  so a store that stops answering loses nothing; logged models; sweep, suite and pipeline parent runs.
- `tensorboard` (`tensorboard_tracker.py`): event files in the run folder (`tensorboard --logdir runs/`);
  a sweep's trials are subfolders of the sweep's folder.
- `wandb` (`wandb_tracker.py`): a Weights & Biases run through its own client (its own queue and
  process: the outbox's guarantees are MLflow's); a sweep's trials share a W&B group.

A run's tracking identity is a mapping from backend name to that backend's run id. Checkpoints keep
it, so a resumed run continues the same run in every backend: the MLflow run, the W&B run (same id,
resumed), the TensorBoard folder (appended to).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from aa_ray.errors import UserError
from aa_ray.spec.experiment import ExperimentSpec
from aa_ray.tracking.credentials import scrub_uris

if TYPE_CHECKING:
    from aa_ray.tracking.mlflow_tracker import MlflowTracker
    from aa_ray.tracking.models import ModelUpload, SavedModel
    from aa_ray.tracking.outbox import Notice

TrackingRuns = dict[str, str]  # backend name ("mlflow", "tensorboard", "wandb") -> that backend's run id


@dataclass(frozen=True)
class RunContext:
    """Where a run is recorded when it is part of something bigger (a sweep trial, a pipeline stage)."""

    tracking_uri: str | None = None  # the MLflow store
    parent_run_id: str | None = None  # the MLflow parent run
    run_name: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    run_id: str | None = None  # continue this MLflow run (a retried trial that had not checkpointed yet)
    group: str | None = None  # the sweep, suite or pipeline the run belongs to: its W&B group


class Tracker(Protocol):
    """One backend's record of one run. Opening it (the backend's constructor) starts the run, or
    continues the one whose id it is given, and records the spec's values as the run's params."""

    backend: str  # its name in tracking.backends

    @property
    def run_id(self) -> str:
        """What finds this run again in its backend: a resumed run is opened with it."""

    @property
    def url(self) -> str | None:
        """Where a person sees the run (None where the backend has no page for it)."""

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Metrics at `step` (env steps); returns without waiting for a store."""

    def flush(self) -> bool:
        """Everything logged so far written (within a bounded wait); whether it all was."""

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        """A file of the run (its spec, events, trace, videos, checkpoint files) kept with the run."""

    def log_model(self, saved: SavedModel, register_as: str | None = None) -> ModelUpload | None:
        """A policy saved as a model folder, stored with the run; None where the backend keeps no models."""

    def set_tag(self, key: str, value: str) -> None:
        """A label on the run (why it stopped)."""

    def notices(self) -> list[Notice]:
        """What happened to the backend's store since the last call (it stopped answering, answers again)."""

    def finish(self, status: str, say: Callable[[str], None] = print, wait_s: float | None = None) -> int:
        """End the run with `status` (FINISHED, FAILED, KILLED); the number of metrics never stored."""


class Trackers:
    """Every backend a run is recorded in, called in the order `tracking.backends` names them. A
    backend that fails to end its run does not keep the others from ending theirs."""

    def __init__(self, trackers: list[Tracker]):
        self.by_backend = {tracker.backend: tracker for tracker in trackers}

    @property
    def run_ids(self) -> TrackingRuns:
        return {backend: tracker.run_id for backend, tracker in self.by_backend.items()}

    @property
    def mlflow(self) -> MlflowTracker | None:
        """The MLflow run, where the spec names it (models and datasets are logged there only)."""
        return self.by_backend.get("mlflow")  # type: ignore[return-value]

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        for tracker in self.by_backend.values():
            tracker.log_metrics(metrics, step)

    def flush(self) -> bool:
        return all([tracker.flush() for tracker in self.by_backend.values()])  # a list: every one flushes

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        for tracker in self.by_backend.values():
            tracker.log_artifact(path, artifact_path)

    def log_model(self, saved: SavedModel, register_as: str | None = None) -> ModelUpload | None:
        """The model in every backend that keeps models; MLflow's upload, which says whether it was stored."""
        mlflow_upload = None
        for backend, tracker in self.by_backend.items():
            upload = tracker.log_model(saved, register_as)
            if backend == "mlflow":
                mlflow_upload = upload
        return mlflow_upload

    def set_tag(self, key: str, value: str) -> None:
        for tracker in self.by_backend.values():
            tracker.set_tag(key, value)

    def notices(self) -> list[Notice]:
        return [notice for tracker in self.by_backend.values() for notice in tracker.notices()]

    def finish(self, status: str, say: Callable[[str], None] = print, wait_s: float | None = None) -> int:
        """End the run in every backend. Training is over by now: a TensorBoard or W&B run that cannot
        be ended is said, not raised; an MLflow error is raised as before, once the others ended."""
        unsent, mlflow_error = 0, None
        for backend, tracker in self.by_backend.items():
            try:
                unsent += tracker.finish(status, say=say, wait_s=wait_s)
            except Exception as err:  # noqa: BLE001 - the other backends still end their runs
                if backend == "mlflow":
                    mlflow_error = err
                else:
                    say(scrub_uris(f"{backend} could not end its run: {type(err).__name__}: {err}")[:500])
        if mlflow_error is not None:
            raise mlflow_error
        return unsent


class TrackerMissing(UserError):
    """A backend named in tracking.backends whose client is not installed where the run runs."""


def open_trackers(
    spec: ExperimentSpec, run_dir: Path, runs: TrackingRuns | None = None, context: RunContext | None = None,
) -> Trackers:
    """Open the run in every backend of `tracking.backends`: a new run in each, or, for a backend
    `runs` has an id for (a resumed run), that run continued. A backend opened before one that
    fails is ended FAILED, so nothing stays open."""
    runs = runs or {}
    opened: list[Tracker] = []
    try:
        for backend in spec.tracking.backends:
            opened.append(_open(backend, spec, run_dir, runs.get(backend), context))
    except BaseException:
        for tracker in opened:
            tracker.finish("FAILED", say=lambda _: None, wait_s=5.0)
        raise
    return Trackers(opened)


def _open(backend: str, spec: ExperimentSpec, run_dir: Path, run_id: str | None, context: RunContext | None) -> Tracker:
    if backend == "mlflow":
        from aa_ray.tracking.mlflow_tracker import MlflowTracker

        return MlflowTracker(spec, run_id=run_id, context=context)
    try:
        if backend == "tensorboard":
            from aa_ray.tracking.tensorboard_tracker import TensorBoardTracker

            return TensorBoardTracker(spec, run_dir, run_id=run_id, context=context)
        from aa_ray.tracking.wandb_tracker import WandbTracker
    except ImportError as err:  # a worker or trial where the package is missing (the driver checked its own)
        raise TrackerMissing(
            f"tracking.backends: {backend} needs the {err.name or backend} package, which is not installed where "
            f"this run runs: pip install 'aa-ray[{backend}]' there, or remove {backend} from tracking.backends."
        ) from None
    return WandbTracker(spec, run_dir, run_id=run_id, context=context)
