"""The one seam between a run and where it is recorded. The runtime (`runtime.run_record`) and Tune
(`tune.trials`) talk to a `Tracker`; `trackers.open_trackers` opens one per backend the spec names in
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

if TYPE_CHECKING:
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
