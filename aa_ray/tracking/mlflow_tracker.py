"""MLflow tracking for one training run: params, tags, batched metrics and artifacts.

Talks to the store through `MlflowClient` with an explicit run id (no global active run). Once the
run is open, every write goes through an `Outbox` (`outbox.py`): a thread of its own sends metrics
in batches every few seconds, and keeps them, in order, while the store does not answer, so the
training loop never waits for MLflow and a tracking server down for minutes loses no metric. Runs
of a sweep or pipeline are nested under a parent run (`RunContext.parent_run_id`); several trials
then write to one store at once, so a write that finds a local SQLite store locked by another
process waits and retries instead of failing. A tracking server that does not answer when the run
starts is one message naming it (its credentials left out) and what to do.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar
from urllib.parse import urlencode

import mlflow
from mlflow.entities import Metric, Param, Run
from mlflow.environment_variables import MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from sqlalchemy.exc import SQLAlchemyError

from aa_ray.errors import UserError
from aa_ray.spec.experiment import ExperimentSpec
from aa_ray.spec.loader import flatten, spec_hash, spec_to_dict
from aa_ray.tracking.credentials import scrub_uris, scrubbed, without_credentials
from aa_ray.tracking.machine import machine_tags
from aa_ray.tracking.outbox import FINISH_WAIT_S, FLUSH_WAIT_S, MAX_BATCH, Notice, Outbox, store_answers
from aa_ray.tracking.tracker import RunContext

if TYPE_CHECKING:  # the model module brings torch and the envs: imported when a run logs a model
    from aa_ray.tracking.models import ModelUpload, SavedModel

_MAX_PARAMS = 100  # and of params per call
_LOCK_WAIT_S = 120.0  # give up on a locked SQLite store after this long
PARENT_TAG = "mlflow.parentRunId"  # the tag the MLflow UI nests runs by

T = TypeVar("T")

# MLflow's client prints "View run ... at: <the tracking URI as given>/#/..." when a run on a tracking
# server ends: credentials included. aa-ray prints its own link without them (`run_link`), so MLflow's
# is turned off in this process and those it starts (Tune trials, Ray workers), unless the user chose.
os.environ.setdefault(MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT.name, "true")

# what a store that cannot be opened or written raises: MLflow's own errors (an unsupported URI
# scheme, a read-only database), the file system's (a folder that cannot be made), SQLAlchemy's
_STORE_ERRORS = (MlflowException, OSError, SQLAlchemyError)


class TrackingError(UserError):
    """The MLflow store at the tracking URI cannot be used; every command reports it as one
    paragraph, like any other setting a run cannot start with."""


_NO_TRACKING = "run without tracking (--no-track, or tracking.enabled: false in the spec)"


def check_store_answers(uri: str) -> None:
    """A tracking server that does not answer now, or a SQLite store this process cannot write, is a
    TrackingError in one line, at once (MLflow's client would retry each call for minutes first); so
    is a URI of a scheme MLflow has no store for (it was found only once Ray had started)."""
    check_store_scheme(uri)
    problem = store_answers(uri)
    if problem is not None:
        raise TrackingError(
            f"MLflow tracking server {without_credentials(uri)} does not answer ({problem}): start it (e.g. "
            f"mlflow server --host 127.0.0.1 --port 5000), point MLFLOW_TRACKING_URI at one that runs, "
            f"or {_NO_TRACKING}."
        )
    check_sqlite_writable(uri)


def check_store_scheme(uri: str) -> None:
    """TrackingError unless MLflow has a tracking store for the URI's scheme (its own, or a plugin's)."""
    # MLflow's registry of store builders by scheme: the one it opens a run's store with. It is not
    # public API: should a later MLflow move it, the store's own error comes later, as it used to.
    try:
        from mlflow.tracking._tracking_service.utils import _tracking_store_registry
    except ImportError:
        return
    try:
        _tracking_store_registry.get_store_builder(uri)
    except MlflowException as err:  # kept as the cause, for a developer; its text repeats the URI as given
        schemes = ", ".join(scheme for scheme in sorted(getattr(_tracking_store_registry, "_registry", {})) if scheme)
        raise TrackingError(
            f"MLflow tracking URI {without_credentials(uri)!r}: MLflow has no tracking store for the scheme "
            f"{uri.partition(':')[0]!r} (it has {schemes}); set MLFLOW_TRACKING_URI to one of those, e.g. "
            f"sqlite:///mlflow.db, or {_NO_TRACKING}."
        ) from err


def sqlite_file(uri: str) -> Path | None:
    """The database file of a SQLite tracking URI (relative to this folder if the URI's path is);
    None for any other store, SQLite in memory, or a SQLite URI filename (`file:...?mode=ro`: its
    options, read-only ones included, are SQLite's to apply)."""
    prefix = "sqlite:///"
    if not uri.startswith(prefix):
        return None
    path = uri[len(prefix):].split("?", 1)[0]
    return None if path in ("", ":memory:") or path.startswith("file:") else Path(path).absolute()


def check_sqlite_writable(uri: str) -> None:
    """A SQLite store is written where it lies: the file itself, and its folder (SQLite keeps a
    journal beside it; MLflow makes a missing folder). Probed by opening the file for writing and
    making (and removing) a temporary file beside it, which changes nothing, as a read-only file,
    folder or file system refuses them now and not after MLflow's retries."""
    path = sqlite_file(uri)
    if path is None:
        return
    folder = next(p for p in (path.parent, *path.parents) if p.exists())
    problem = None
    if path.is_dir():
        problem = "it is a folder"
    elif path.exists():
        try:
            with open(path, "r+b"):
                pass
        except OSError as err:
            problem = f"the file is not writable: {err.strerror or err}"
    if problem is None:
        try:
            with tempfile.TemporaryFile(dir=folder):
                pass
        except OSError as err:
            problem = f"its folder {folder} takes no new files: {err.strerror or err}"
    if problem is not None:
        raise TrackingError(
            f"MLflow tracking store {path} (from the tracking URI {without_credentials(uri)}) cannot be written "
            f"({problem}): make the file and its folder writable for this user, point MLFLOW_TRACKING_URI at a "
            f"SQLite file in a folder you can write (e.g. sqlite:///mlflow.db here), or {_NO_TRACKING}."
        )


@contextmanager
def opening_store(uri: str) -> Iterator[None]:
    """Check that a tracking server answers, and turn a store that cannot be opened or written at
    start-up into one TrackingError naming the URI without its credentials (the store's own error
    stays attached as the cause, with its traceback)."""
    check_store_answers(uri)
    try:
        yield
    except _STORE_ERRORS as err:
        reason = scrub_uris(str(err).splitlines()[0]) if str(err) else type(err).__name__
        raise TrackingError(
            f"MLflow tracking URI {without_credentials(uri)!r}: cannot record the run there "
            f"({type(err).__name__}: {reason[:300]}). "
            "Set MLFLOW_TRACKING_URI to a store this process can write, e.g. sqlite:///mlflow.db in a writable "
            f"folder or http://<host>:5000 for a tracking server, or {_NO_TRACKING}."
        ) from err


def store_uri(context: RunContext | None = None) -> str:
    """The store a run records itself in: its context's, else MLflow's (MLFLOW_TRACKING_URI or the default)."""
    return (context.tracking_uri if context else None) or mlflow.get_tracking_uri()


def resolved_tracking_uri(uri: str | None = None) -> str:
    """The tracking URI with a relative SQLite path made absolute, so processes started elsewhere
    (Tune trials run in their own folders) write to the same store as the driver."""
    uri = uri or mlflow.get_tracking_uri()
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri[len(prefix):].startswith("/"):
        return prefix + str(Path(uri[len(prefix):]).resolve())
    return uri


def retry_locked(call: Callable[[], T]) -> T:
    """Run a store call; while a local SQLite store reports "database is locked" (another trial is
    writing), wait with jittered backoff and try again."""
    deadline, delay = time.monotonic() + _LOCK_WAIT_S, 0.05
    while True:
        try:
            return call()
        except Exception as err:  # MlflowException or SQLAlchemy's OperationalError, depending on the call
            if "database is locked" not in str(err) or time.monotonic() > deadline:
                raise
        time.sleep(delay * (1 + random.random()))
        delay = min(delay * 2, 2.0)


# MLflow 3's UI shows an experiment without this tag in its GenAI layout (runs under "Evaluation
# runs"); this value selects the model-training one (runs, charts, compare). A user's own choice stays.
EXPERIMENT_KIND_TAG, MODEL_TRAINING = "mlflow.experimentKind", "custom_model_development"


def ui_base(tracking_uri: str) -> str:
    """Where the MLflow UI for this store is: the tracking server itself (without the credentials in
    its URI: every link aa-ray prints or returns starts here), or what `mlflow ui` serves by default
    for a local store."""
    if tracking_uri.startswith(("http://", "https://")):
        return without_credentials(tracking_uri).rstrip("/")
    return "http://127.0.0.1:5000"


_TRAINING_VIEW = "workflowType=machine_learning"  # MLflow 3 opens its GenAI view otherwise


def experiment_link(tracking_uri: str, experiment_id: str) -> str:
    """The experiment's runs in the UI's model-training view."""
    return f"{ui_base(tracking_uri)}/#/experiments/{experiment_id}?{_TRAINING_VIEW}"


def run_link(tracking_uri: str, experiment_id: str, run_id: str) -> str:
    """The run's page in the UI's model-training view."""
    return f"{ui_base(tracking_uri)}/#/experiments/{experiment_id}/runs/{run_id}?{_TRAINING_VIEW}"


def compare_link(tracking_uri: str, experiment_id: str, run_ids: Sequence[str]) -> str:
    """The UI's Compare view of these runs: their params side by side, metric charts."""
    as_json = lambda values: json.dumps(list(values), separators=(",", ":"))  # noqa: E731
    query = urlencode({"runs": as_json(run_ids), "experiments": as_json([experiment_id])})
    return f"{ui_base(tracking_uri)}/#/compare-runs?{query}&{_TRAINING_VIEW}"


def start_run(client: MlflowClient, experiment: str, tags: dict[str, str]) -> str:
    """Create a run in `experiment` (made if missing, in MLflow's model-training view) and return its id."""
    found = retry_locked(lambda: client.get_experiment_by_name(experiment))
    if found is not None:
        experiment_id = found.experiment_id
        if EXPERIMENT_KIND_TAG not in found.tags:  # made by something else, or by an older aa-ray
            retry_locked(lambda: client.set_experiment_tag(experiment_id, EXPERIMENT_KIND_TAG, MODEL_TRAINING))
    else:
        try:
            experiment_id = retry_locked(
                lambda: client.create_experiment(experiment, tags={EXPERIMENT_KIND_TAG: MODEL_TRAINING})
            )
        except MlflowException:
            # another trial may have created it first; if not, the store refused the write
            found = retry_locked(lambda: client.get_experiment_by_name(experiment))
            if found is None:
                raise
            experiment_id = found.experiment_id
    return retry_locked(lambda: client.create_run(experiment_id, tags=tags)).info.run_id


def log_in_batches(
    client: MlflowClient, run_id: str, metrics: Sequence[Metric] = (), params: Sequence[Param] = ()
) -> None:
    """Log any number of metrics and params, in calls within MLflow's per-call limits."""
    for i in range(0, len(params), _MAX_PARAMS):
        retry_locked(lambda chunk=params[i : i + _MAX_PARAMS]: client.log_batch(run_id, params=list(chunk)))
    for i in range(0, len(metrics), MAX_BATCH):
        retry_locked(lambda chunk=metrics[i : i + MAX_BATCH]: client.log_batch(run_id, metrics=list(chunk)))


def search_all_runs(client: MlflowClient, experiment_ids: list[str], filter_string: str = "") -> list[Run]:
    """Every matching run, page by page (one search returns at most 1000 runs)."""
    runs: list[Run] = []
    token = None
    while True:
        page = retry_locked(lambda token=token: client.search_runs(
            experiment_ids, filter_string, max_results=MAX_BATCH, page_token=token
        ))
        runs += page
        token = page.token
        if not token:
            return runs


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
    """The `Tracker` of the `mlflow` backend (`tracker.py`): the run in the MLflow store, through the outbox."""

    backend = "mlflow"

    def __init__(self, spec: ExperimentSpec, run_id: str | None = None, context: RunContext | None = None):
        context = context or RunContext()
        uri = store_uri(context)
        with opening_store(uri):
            self.client = MlflowClient(tracking_uri=uri)
            self.run_id = self._open_run(spec, run_id or context.run_id, context)
            self.experiment_id = retry_locked(lambda: self.client.get_run(self.run_id)).info.experiment_id
        self.outbox = Outbox(uri, self._send_metrics, spec.tracking.flush_every_s)

    def _send_metrics(self, metrics: list[Metric]) -> None:
        retry_locked(lambda: self.client.log_batch(self.run_id, metrics=metrics))

    def _open_run(self, spec: ExperimentSpec, run_id: str | None, context: RunContext) -> str:
        if run_id is not None:  # resuming: keep writing into the same run
            retry_locked(lambda: self.client.update_run(run_id, status="RUNNING"))
            return run_id
        tags = {
            "algo": spec.algo.name,
            "env": spec.env.id,
            "spec_hash": spec_hash(spec),
            **machine_tags(),  # reports say on which CPU its wall-clock times were measured
            "mlflow.runName": context.run_name or f"{spec.name}-{spec_hash(spec)[:6]}",
            **context.tags,
        }
        if context.parent_run_id:
            tags[PARENT_TAG] = context.parent_run_id
        commit = git_commit()
        if commit:
            tags["git_commit"] = commit
        run_id = start_run(self.client, spec.tracking.experiment, scrubbed(tags))
        # a spec value may be a URI with credentials (an output folder on object storage, an env's endpoint)
        params = [Param(k, scrub_uris(str(v))[:6000]) for k, v in flatten(spec_to_dict(spec)).items()]
        log_in_batches(self.client, run_id, params=params)
        return run_id

    @property
    def uri(self) -> str:
        """The store's URI as given, credentials included: to connect with, never to show."""
        return str(self.client.tracking_uri)

    @property
    def url(self) -> str:
        """The run's page in the MLflow UI (no credentials in it)."""
        return run_link(self.uri, self.experiment_id, self.run_id)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Queue metrics for the outbox's next batch; returns at once, whether the store answers or not."""
        self.outbox.put_metrics(metrics, step, int(time.time() * 1000))

    def flush(self) -> bool:
        """Store every metric logged so far, waiting a bounded time, and not at all while the store is
        down (they stay queued and go once it answers). Whether all are stored."""
        return self.outbox.flush(FLUSH_WAIT_S)

    def log_artifacts(self, folder: Path, artifact_path: str) -> None:
        self.outbox.put_call(f"artifacts {folder}", lambda: retry_locked(
            lambda: self.client.log_artifacts(self.run_id, str(folder), artifact_path)))

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        self.outbox.put_call(f"artifact {path}", lambda: retry_locked(
            lambda: self.client.log_artifact(self.run_id, str(path), artifact_path)))

    def log_model(self, saved: SavedModel, register_as: str | None = None) -> ModelUpload:
        """A model folder saved on disk (`tracking.models`) stored as the run's logged model, through
        the outbox like any artifact; registering it is a write of its own, so a name the registry
        refuses costs the registration only. The upload says whether it was stored."""
        from aa_ray.tracking.models import ModelUpload

        upload = ModelUpload(self.client, self.run_id, self.experiment_id, saved)
        self.outbox.put_call(f"model {saved.name} ({saved.folder})", lambda: retry_locked(upload.send))
        if register_as is not None:
            self.outbox.put_call(f"registering model {saved.name} as {register_as}",
                                 lambda: retry_locked(lambda: upload.register(register_as)))
        return upload

    def notices(self) -> list[Notice]:
        """What happened to the store since the last call (it stopped answering, answers again,
        refused a write): the run records each as an event."""
        return self.outbox.take_notices()

    def set_tag(self, key: str, value: str) -> None:
        """A tag on the run (e.g. why it ended), sent in order with the metrics before it."""
        value = scrub_uris(value)[:5000]  # MLflow's own limit on a tag's value is 8,000 characters
        self.outbox.put_call(f"tag {key}", lambda: retry_locked(lambda: self.client.set_tag(self.run_id, key, value)))

    def finish(self, status: str = "FINISHED", say: Callable[[str], None] = print, wait_s: float | None = None) -> int:
        """End the run with `status` once everything before it is stored, waiting up to `wait_s`
        (default FINISH_WAIT_S) for a store that does not answer (`say`ing so). The number of
        metrics that could not be stored."""
        self.outbox.put_call(f"the run's end ({status})", lambda: retry_locked(
            lambda: self.client.set_terminated(self.run_id, status=status)))
        return self.outbox.close(FINISH_WAIT_S if wait_s is None else wait_s, say)
