"""Every backend of a run behind one `Tracker`: `open_trackers` opens the ones `tracking.backends`
names, importing a backend's client only when it is named (an untracked run imports none), and
`Trackers` fans each call out to them. Apart from `tracker.py` so the backends, which need its
`RunContext`, are not imported back by the module that opens them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from aa_ray.errors import UserError
from aa_ray.spec.experiment import ExperimentSpec
from aa_ray.tracking.credentials import scrub_uris
from aa_ray.tracking.tracker import RunContext, Tracker, TrackingRuns

if TYPE_CHECKING:
    from aa_ray.tracking.mlflow_tracker import MlflowTracker
    from aa_ray.tracking.models import ModelUpload, SavedModel
    from aa_ray.tracking.outbox import Notice


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
