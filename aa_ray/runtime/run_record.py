"""What a run leaves for people: its tracked run in each of `tracking.backends` (MLflow, TensorBoard,
W&B: metrics and artifacts, through `tracking.trackers`), the events in its
`events.jsonl`, the lines of its progress display, its evaluation videos and its trace. The trainer
decides what happened; this room says it, in each place it belongs.

What it says is scrubbed of credentials (`tracking.credentials`: a URI in an error message or an
event's details loses its `user:password@` and secret query values) and, on the console, escaped
(`progress.shown`). The MLflow store's own news (it stopped answering, answers again, refused a
write) become events like any other. Models are logged where the run is tracked in MLflow.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aa_ray import metric_names as m
from aa_ray.nets.policy import state_tensors
from aa_ray.records import Checkpoint
from aa_ray.runtime.checkpoint import (
    MODEL_POLICY_FOLDER,
    SPEC_FILE,
    STATE_FILE,
    checkpoint_weights,
    load_checkpoint,
    policy_only,
    save_checkpoint,
)
from aa_ray.runtime.phases import Phases
from aa_ray.runtime.progress import ProgressDisplay, task_metric
from aa_ray.runtime.remote import get_results
from aa_ray.runtime.run_files import EVENTS_FILE, write_event, write_video
from aa_ray.spec.experiment import ExperimentSpec
from aa_ray.spec.loader import spec_yaml
from aa_ray.tracking.credentials import scrub_uris, scrubbed

STOP_REASON_TAG = "stop_reason"  # on a run that did not finish: why (a stop signal, an interrupt)

if TYPE_CHECKING:
    import torch

    from aa_ray.tracking.mlflow_tracker import MlflowTracker
    from aa_ray.tracking.models import ModelUpload
    from aa_ray.tracking.tracker import RunContext, TrackingRuns
    from aa_ray.tracking.trackers import Trackers

FINAL_CHECKPOINT = "final"  # the checkpoint of a run's end (a preempted run's last one is not: it resumes)
MODELS_FOLDER = "models"  # in the run folder: each logged MLflow model, also when the store never got it


def resumed_runs(checkpoint: Checkpoint | None) -> TrackingRuns | None:
    """The tracked runs a checkpoint's run was recorded in, to continue (None: start new ones). A
    checkpoint from before `tracking.backends` named its MLflow run only: `load_checkpoint` reads
    that as {"mlflow": its id}."""
    return dict(checkpoint.tracking) if checkpoint is not None and checkpoint.tracking else None


@dataclass(frozen=True)
class BestPolicy:
    """The policy of the run's best evaluation so far (`tracking.log_best_model`)."""

    metric: str
    value: float
    env_steps: int
    state: dict[str, torch.Tensor]


def ranking(spec: ExperimentSpec, evaluation: dict[str, float]) -> tuple[str, float] | None:
    """The metric an evaluation is ranked by for the best policy, and its value signed so that more
    is better: the first stop rule whose metric the evaluation has (as the stop rules decide), else
    the return. None for a value that is not finite."""
    for rule in spec.budget.stop_rules:
        if rule.metric in evaluation:
            metric, sign = rule.metric, -1.0 if rule.below is not None else 1.0
            break
    else:
        metric, sign = m.EVAL_RETURN, 1.0
    value = evaluation.get(metric)
    return (metric, sign * value) if value is not None and math.isfinite(value) else None


class RunRecord:
    def __init__(
        self, spec: ExperimentSpec, run_dir: Path, phases: Phases, track: bool, live: bool | None,
        context: RunContext | None,
    ):
        self.spec, self.run_dir, self.phases = spec, run_dir, phases
        self.track, self.live, self.context = track, live, context
        self.tracker: Trackers | None = None  # every backend of tracking.backends, made by `start` when tracked
        self.progress: ProgressDisplay | None = None  # shown while `showing_progress` lasts
        self.last_step = 0  # env steps of the last metrics logged (where the run's last events go)
        self.best: BestPolicy | None = None  # kept only when the spec asks for the best policy's model
        self.model_uploads: list[ModelUpload] = []  # the run's models on their way to the store
        if track and "mlflow" in spec.tracking.backends:
            # a tracking server that does not answer stops the run here, before anything starts
            from aa_ray.tracking.mlflow_tracker import check_store_answers, store_uri

            check_store_answers(store_uri(context))

    @property
    def mlflow(self) -> MlflowTracker | None:
        """The run's MLflow run, where it is tracked there (models and datasets are logged there)."""
        return self.tracker.mlflow if self.tracker else None

    @property
    def tracking_runs(self) -> TrackingRuns:
        """The run's id in each tracking backend (none untracked): a checkpoint keeps them for a resume."""
        return self.tracker.run_ids if self.tracker else {}

    @property
    def mlflow_run_id(self) -> str | None:
        return self.mlflow.run_id if self.mlflow else None

    @property
    def mlflow_url(self) -> str | None:
        return self.mlflow.url if self.mlflow else None

    def start(self, runs: TrackingRuns | None) -> None:
        """Open the run in every tracking backend (continuing the interrupted one's `runs`, on a
        resume) and log the spec into it."""
        if not self.track:
            return
        from aa_ray.tracking.trackers import open_trackers  # an untracked run imports no backend

        self.tracker = open_trackers(self.spec, self.run_dir, runs, self.context)
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

    def evaluated(self, evaluation: dict[str, float], env_steps: int, policy_weights: Any) -> None:
        """Keep the evaluated policy's weights (`policy_weights`: the graph's ref of them, Ray's or
        inline) while it is the run's best, when its model is to be logged (`tracking.log_best_model`):
        fetched now, as a ref may not outlive a rebuilt actor graph."""
        if self.mlflow is None or not self.spec.tracking.log_best_model:
            return
        ranked = ranking(self.spec, evaluation)
        if ranked is not None and (self.best is None or ranked[1] > self.best.value):
            self.best = BestPolicy(ranked[0], ranked[1], env_steps, state_tensors(get_results(policy_weights)))

    def final_checkpoint(self, folder: Path) -> None:
        """The final checkpoint's state and spec as artifacts, the policy models the spec asks for,
        and every metric stored (before the final report: Tune may end a trial's process right after it)."""
        if self.tracker is not None:
            for name in (STATE_FILE, SPEC_FILE):
                self.tracker.log_artifact(folder / name, f"checkpoints/{folder.name}")
            if folder.name == FINAL_CHECKPOINT and self.mlflow is not None:
                self._log_models(folder)
        self.flush()

    def _log_models(self, final: Path) -> None:
        """The final policy (and the best one) saved as MLflow models in the run folder and handed to
        the outbox. A policy that cannot be saved is an event, never a failed run: training is done."""
        from aa_ray.tracking.models import BEST_MODEL, FINAL_MODEL, save_policy_model

        tracking = self.spec.tracking
        wanted: list[tuple[str, int, Callable[[], dict[str, Any]], str | None]] = []
        if tracking.log_model:
            def final_policy() -> dict[str, Any]:  # its weights alone: the stored spec is not read
                return checkpoint_weights(load_checkpoint(final))

            wanted.append((FINAL_MODEL, self.last_step, final_policy, tracking.register_model))
        if self.best is not None:
            best = self.best
            wanted.append((BEST_MODEL, best.env_steps, lambda: best.state, None))
        for name, env_steps, policy_state, register_as in wanted:
            folder = self.run_dir / MODELS_FOLDER / name
            shutil.rmtree(folder, ignore_errors=True)  # an earlier end's, when a finished run was resumed
            try:
                state = policy_state()
                saved = save_policy_model(self.spec, state, folder, name, env_steps)
                save_checkpoint(folder / MODEL_POLICY_FOLDER, self.spec, policy_only(state))
            except Exception as err:  # noqa: BLE001 - an export the policy does not support (a plugin's module)
                self.event("model_not_logged", self.last_step, model=name, reason=f"{type(err).__name__}: {err}"[:500])
                continue
            self.message(f"model {name}: {folder} (saved in {saved.seconds:.1f} s), in MLflow as runs:/"
                         f"{self.mlflow.run_id}/{name}" + (f", registered as {register_as}" if register_as else ""))
            upload = self.tracker.log_model(saved, register_as)
            if upload is not None:
                self.model_uploads.append(upload)

    def close(self, status: str, ray_timeline: list[dict[str, Any]] | None, reason: str | None = None) -> None:
        """The trace (also of a failed run: where it spent its time until then), the events file, and
        tracked runs ended with `status` (and `reason`, a `stop_reason` tag, where it says why)."""
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
            for upload in self.model_uploads:
                if not upload.stored:
                    self.event("model_not_logged", self.last_step, model=upload.saved.name,
                               folder=str(upload.saved.folder), reason="the MLflow store did not take it before the "
                               "run's end; the folder is a complete MLflow model (mlflow.pyfunc.load_model reads it)")
            if unsent:
                self.event("tracking_unsent", self.last_step, metrics=unsent, reason="the MLflow store did not answer "
                           "before the run's end; these metrics are not in the MLflow run")
