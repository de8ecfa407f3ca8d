"""What a run leaves for people: its MLflow run (metrics and artifacts), the events in its
`events.jsonl`, the lines of its progress display, its evaluation videos and its trace. The trainer
decides what happened; this room says it, in each place it belongs.

What it says is scrubbed of credentials (`tracking.credentials`: a URI in an error message or an
event's details loses its `user:password@` and secret query values) and, on the console, escaped
(`progress.shown`). The MLflow store's own news (it stopped answering, answers again, refused a
write) become events like any other.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aa_ray import metric_names as m
from aa_ray.runtime.checkpoint import SPEC_FILE, STATE_FILE
from aa_ray.runtime.phases import Phases
from aa_ray.runtime.progress import ProgressDisplay, task_metric
from aa_ray.runtime.run_files import EVENTS_FILE, write_event, write_video
from aa_ray.spec.experiment import ExperimentSpec
from aa_ray.spec.loader import spec_yaml
from aa_ray.tracking.credentials import scrub_uris, scrubbed

STOP_REASON_TAG = "stop_reason"  # on a run that did not finish: why (a stop signal, an interrupt)

if TYPE_CHECKING:
    from aa_ray.tracking.mlflow_tracker import MlflowTracker, RunContext


class RunRecord:
    def __init__(
        self, spec: ExperimentSpec, run_dir: Path, phases: Phases, track: bool, live: bool | None,
        context: RunContext | None,
    ):
        self.spec, self.run_dir, self.phases = spec, run_dir, phases
        self.track, self.live, self.context = track, live, context
        self.tracker: MlflowTracker | None = None  # made by `start` when the run is tracked
        self.progress: ProgressDisplay | None = None  # shown while `showing_progress` lasts
        self.last_step = 0  # env steps of the last metrics logged (where the run's last events go)
        if track:  # a tracking server that does not answer stops the run here, before anything starts
            from aa_ray.tracking.mlflow_tracker import check_store_answers, store_uri

            check_store_answers(store_uri(context))

    @property
    def mlflow_run_id(self) -> str | None:
        return self.tracker.run_id if self.tracker else None

    @property
    def mlflow_url(self) -> str | None:
        return self.tracker.url if self.tracker else None

    def start(self, mlflow_run_id: str | None) -> None:
        """Open the MLflow run (the interrupted one's, on a resume) and log the spec into it."""
        if not self.track:
            return
        from aa_ray.tracking.mlflow_tracker import MlflowTracker  # an untracked run needs no MLflow

        self.tracker = MlflowTracker(self.spec, run_id=mlflow_run_id, context=self.context)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / SPEC_FILE).write_text(spec_yaml(self.spec))
        self.tracker.log_artifact(self.run_dir / SPEC_FILE, "spec")

    @contextmanager
    def showing_progress(self) -> Iterator[None]:
        with ProgressDisplay(self.spec.name, self.spec.budget.env_steps, live=self.live,
                             task_metric=task_metric(self.spec)) as self.progress:
            yield

    def log(self, metrics: dict[str, float], step: int) -> None:
        if self.tracker is not None:
            with self.phases.timed(m.PHASE_TRACKING):
                self.tracker.log_metrics(metrics, step)
            self.last_step = step
            self._tracking_events(step)

    def _tracking_events(self, env_steps: int) -> None:
        """The store's news since the last look (tracking_unreachable, tracking_restored, ...) as events."""
        for notice in self.tracker.notices():
            self.event(notice.kind, env_steps, **notice.details)

    def show(self, env_steps: int, metrics: dict[str, float]) -> None:
        """An iteration's metrics, logged and on the progress display."""
        self.log(metrics, env_steps)
        if self.progress is not None:
            self.progress.update(env_steps, metrics)

    def message(self, text: str) -> None:
        if self.progress is not None:
            self.progress.message(scrub_uris(text))

    def event(self, kind: str, env_steps: int, **details: Any) -> None:
        """Print an event and append it to the run's events.jsonl (an MLflow artifact at the end)."""
        self.message(write_event(self.run_dir, kind, env_steps, **scrubbed(details)))

    def video(self, env_steps: int, video: bytes) -> None:
        path = write_video(self.run_dir, env_steps, video)
        if self.tracker is not None:
            self.tracker.log_artifact(path, "videos")

    def flush(self) -> None:
        """Every metric logged so far is stored (after a checkpoint: a crash then loses none of them)."""
        if self.tracker is not None:
            self.tracker.flush()

    def final_checkpoint(self, folder: Path) -> None:
        """The final checkpoint's state and spec as artifacts, and every metric stored (before the
        final report: Tune may end a trial's process right after it)."""
        if self.tracker is not None:
            for name in (STATE_FILE, SPEC_FILE):
                self.tracker.log_artifact(folder / name, f"checkpoints/{folder.name}")
        self.flush()

    def close(self, status: str, ray_timeline: list[dict[str, Any]] | None, reason: str | None = None) -> None:
        """The trace (also of a failed run: where it spent its time until then), the events file, and
        the MLflow run ended with `status` (and `reason`, a `stop_reason` tag, where it says why)."""
        if ray_timeline is not None:
            path = self.phases.write_trace(self.run_dir, ray_timeline)
            self.message(f"trace: {path} (open it in https://ui.perfetto.dev)")
            if self.tracker is not None:
                self.tracker.log_artifact(path)
        if self.tracker is not None:
            if (self.run_dir / EVENTS_FILE).is_file():
                self.tracker.log_artifact(self.run_dir / EVENTS_FILE)
            if reason is not None:
                self.tracker.set_tag(STOP_REASON_TAG, reason)
            # a preempted run's checkpoint is on disk already, and its grace period is short
            unsent = self.tracker.finish(status, say=self.message, wait_s=10.0 if status == "KILLED" else None)
            self._tracking_events(self.last_step)
            if unsent:
                self.event("tracking_unsent", self.last_step, metrics=unsent, reason="the MLflow store did not answer "
                           "before the run's end; these metrics are not in the MLflow run")
