"""The driver's side of a sweep's, suite's or pipeline's Tune runs, which all three share: the
console (Tune's status table, one line per trial event, Ray's and Tune's switches for it), stop
signals (SIGTERM taken as Tune takes SIGINT: trials stopped, experiment state saved), what a stop
leaves behind (the trials Tune still has to run, their child runs KILLED) and the small state file
that tells `--resume latest` which invocation to continue."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

from ray import tune

from aa_ray import metric_names as m
from aa_ray.runtime import cluster
from aa_ray.runtime.run_record import STOP_REASON_TAG
from aa_ray.tracking.mlflow_tracker import retry_locked
from aa_ray.tune.parent import ParentRun, end_invocation
from aa_ray.tune.trials import TRIAL_LOG

STATUS_EVERY_S = 60  # the status table's refresh; trial events are printed as they happen
# Tune's and Ray's own switches for the console. Both read them in this process while the Tune
# session runs, so they are set for that session only (`tune_console`), never at import nor for
# the workers (which start with the environment Ray was given).
TUNE_CONSOLE = {
    # the CLIReporter's status table: the newer output prints a table per trial start and end
    "RAY_AIR_NEW_OUTPUT": "0",
    # no TensorBoard logger (TensorBoard is not a dependency), so no hint to run it either; the CSV
    # and JSON result loggers it would also add are passed in the RunConfig (`result_loggers`)
    "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1",
    # a failed trial's traceback stays in its error file; TrialEvents prints its message
    "TUNE_PRINT_ALL_TRIAL_ERRORS": "0",
}
# Ray prints the errors its raylet reports (a trial's worker died) with a coloured "(raylet)" prefix
PLAIN_RAY_PREFIX = {"RAY_COLOR_PREFIX": "0"}

RESUMABLE = ("running", "preempted", "interrupted")  # "running": its driver died without a word (SIGKILL)


@contextmanager
def tune_console() -> Iterator[None]:
    settings = TUNE_CONSOLE if sys.stdout.isatty() else {**TUNE_CONSOLE, **PLAIN_RAY_PREFIX}
    before = {key: os.environ.get(key) for key in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def format_value(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def short_params(params: dict[str, Any]) -> str:
    return ",".join(f"{key.rsplit('.', 1)[-1]}={format_value(value)}" for key, value in params.items())


def error_paragraph(error: BaseException | None, longest: int = 600) -> str:
    """A trial's error as one line: the trial's own exception (not Ray's wrapper with the remote
    traceback), its message's first paragraph."""
    from ray.exceptions import RayTaskError

    if error is None:
        return "its error is in the traceback file"
    cause = error.cause if isinstance(error, RayTaskError) and error.cause is not None else error
    line = " ".join(f"{type(cause).__name__}: {cause}".strip().split("\n\n")[0].split())
    return line if len(line) <= longest else line[:longest - 3] + "..."


class TrialEvents(tune.Callback):
    """One console line per trial event: started or resumed, checkpointed, finished, failed and
    retried, errored. It is pickled with the Tuner's state (a resumed sweep gets it back), so it
    holds plain values only.

    A sweep's trial is shown by its sampled params and has its run folder at `root/<trial id>`; a
    suite's cell or a pipeline's stage by the config value `by` names, with its run folder in
    `folders` under that value."""

    # a sweep interrupted before these attributes existed pickled its TrialEvents without them
    by: str | None = None
    folders: dict[str, str] = {}  # read only, never mutated

    def __init__(self, root: str, metric: str, by: str | None = None, folders: dict[str, str] | None = None):
        self.root, self.metric, self.by, self.folders = root, metric, by, folders or {}

    def _say(self, trial: Any, text: str) -> None:
        print(f"trial {trial.trial_id} {text}", flush=True)

    def _label(self, trial: Any) -> str:
        return short_params(trial.config.get("params", {})) if self.by is None else str(trial.config.get(self.by))

    def _log(self, trial: Any) -> Path:
        if self.by is None:
            return Path(self.root) / trial.trial_id / TRIAL_LOG
        return Path(self.folders.get(str(trial.config.get(self.by)), self.root)) / TRIAL_LOG

    def _progress(self, metrics: dict[str, Any] | None) -> str:
        metrics = metrics or {}
        steps = metrics.get(m.ENV_STEPS, metrics.get("transitions"))  # a rollout's transitions are its env steps
        text = "?" if steps is None else f"{int(steps):,}"
        value = metrics.get(self.metric)
        return f"{text} env steps" + ("" if value is None else f", {self.metric} {format_value(value)}")

    def on_trial_start(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        checkpoint = trial.latest_checkpoint_result
        if checkpoint is None:
            self._say(trial, f"started [{self._label(trial)}], its log: {self._log(trial)}")
        else:
            steps = checkpoint.metrics.get(m.ENV_STEPS)
            self._say(trial, f"[{self._label(trial)}] resuming from {int(steps or 0):,} env steps "
                             "(its last checkpoint)")

    def on_checkpoint(self, iteration: int, trials: list[Any], trial: Any, checkpoint: Any, **info: Any) -> None:
        # Tune calls this with the checkpoint's own report as the trial's last result, before it
        # files the checkpoint as the trial's latest
        self._say(trial, f"checkpointed at {self._progress(trial.last_result)}")

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._say(trial, f"finished at {self._progress(trial.last_result)}")

    def _error(self, trial: Any) -> str:
        """The trial's error and where to read more: Tune has just written it (the exception
        pickled, its traceback as text) in the driver's staging folder, and copies both to the
        experiment's storage later, so the message is read here and the traceback named there."""
        import cloudpickle

        pickled = trial.pickled_error_file
        error = cloudpickle.loads(Path(pickled).read_bytes()) if pickled and Path(pickled).exists() else None
        traceback = f"{trial.path}/{trial.run_metadata.error_filename}"
        return f"{error_paragraph(error)} (traceback: {traceback}; its log: {self._log(trial)})"

    def on_trial_recover(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._say(trial, f"failed (failure {trial.num_failures}), retried from its last checkpoint: "
                         f"{self._error(trial)}")

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._say(trial, f"errored at {self._progress(trial.last_result)}: {self._error(trial)}")


def status_table(parameter_columns: dict[str, str], metric: str) -> tune.CLIReporter:
    """Tune's status table: each trial's identifying config values, env steps and `metric`."""
    return tune.CLIReporter(parameter_columns=parameter_columns, max_column_length=40,  # a suite cell's name
                            metric_columns={m.ENV_STEPS: "env steps", metric: metric},
                            max_report_frequency=STATUS_EVERY_S)


def result_loggers() -> list[tune.Callback]:
    """The result files Tune writes per trial (the auto loggers are off: `TUNE_CONSOLE`)."""
    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback

    return [CSVLoggerCallback(), JsonLoggerCallback()]


class TuneStopSignals:
    """SIGTERM as Tune takes SIGINT. During `fit()` Tune answers a SIGINT by stopping its trials,
    saving the experiment state and returning, which is what a preemption notice needs; SIGTERM
    would meet the handler `ray.init` installs (sys.exit: trials killed, nothing saved). So SIGTERM
    is turned into a SIGINT. A second signal raises KeyboardInterrupt at once (Tune's handler puts
    the previous SIGINT handler back after its first signal). `received` stays set, so a driver
    that runs several `fit()`s (a pipeline's stages) starts no more after a signal, even one that
    came between two of them (Tune's handler of a finished `fit()` would swallow it)."""

    def __init__(self, what: str = "trials") -> None:
        self.what = what
        self.received: str | None = None

    @contextmanager
    def installed(self) -> Iterator[TuneStopSignals]:
        """Handle SIGTERM while the block runs (in the main thread only: nowhere else may a handler
        be set); the SIGTERM and SIGINT handlers from before afterwards (Tune leaves its SIGINT
        handler in place when no signal came)."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous_interrupt = signal.getsignal(signal.SIGINT)
        previous_terminate = signal.signal(signal.SIGTERM, self._handle)
        try:
            yield self
        finally:
            signal.signal(signal.SIGTERM, previous_terminate)
            signal.signal(signal.SIGINT, previous_interrupt)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received is not None:
            raise KeyboardInterrupt(f"a second stop signal ({signal.Signals(signum).name})")
        self.received = signal.Signals(signum).name
        # straight to stderr: a handler that prints could re-enter a stream's lock
        os.write(2, f"\n{self.received}: stopping the {self.what}, Tune saving its state; "
                    "send it again to stop at once\n".encode())
        interrupt = signal.getsignal(signal.SIGINT)  # Tune's inside fit(), Python's (KeyboardInterrupt) outside
        if not callable(interrupt):  # SIGINT ignored (a background job of a script) or left to the OS
            raise KeyboardInterrupt(self.received)
        interrupt(signal.SIGINT, frame)

    def stop_reason(self) -> str:
        return (f"stopped by {self.received}: unfinished trials stopped, Tune's state saved; "
                "continue with --resume latest")


class TuneSession:
    """An invocation's Ray and Tune session on the driver: Ray started (or joined) with the
    workers' output left in their logs, the console switches and the stop signals in place from
    then (Ray's processes do not inherit the switches; `ray.init` installs a SIGTERM handler ours
    replaces) until `end`. `start` may come late (a pipeline starts Ray at its first stage to run)
    or never (everything reused)."""

    def __init__(self, what: str) -> None:
        self.signals = TuneStopSignals(what)
        self.started_ray = False
        self.started = False
        self._stack = ExitStack()

    def start(self, cpus: float, py_modules: list[str]) -> None:
        self.started_ray = cluster.connect(None, cpus=cpus, py_modules=py_modules, log_to_driver=False)
        self.started = True
        self._stack.enter_context(tune_console())
        self._stack.enter_context(self.signals.installed())

    def end(self, parent: ParentRun | None, status: str, report: Any = print) -> None:
        """End the parent run (KILLED with the stop reason after a signal) and Ray, then put the
        console switches and signal handlers back."""
        reason = self.signals.stop_reason() if status == "KILLED" and self.signals.received else None
        try:
            end_invocation(parent, status, self.started_ray, report, reason=reason)
        finally:
            self._stack.close()


def trials_left(tune_path: str) -> dict[str, dict[str, Any]]:
    """The trials (id -> config) Tune's saved experiment state still has to run, as a stop signal
    leaves it (the trials `fit()` returns all read as ended then: Tune stops them after saving the
    state)."""
    from ray.tune.experiment import Trial

    saved = tune.ExperimentAnalysis(tune_path)
    return {trial.trial_id: trial.config for trial in saved.trials
            if trial.status not in (Trial.TERMINATED, Trial.ERROR)}


def mark_stopped_children(parent: ParentRun, tag: str, values: set[str], reason: str, wait_s: float = 15.0) -> None:
    """The child runs (those whose `tag` is one of `values`) of trials a stop signal cut short are
    KILLED with the stop reason, as a preempted `aa-ray run` is; they continue on resume. A stopped
    trial's own process closes its run on the way out (KILLED or FAILED, with what it saw: Tune
    ending it), possibly after `fit()` returned, so that is waited for (`wait_s` at most: a process
    killed outright never closes it) and its own reason kept after this one."""
    deadline = time.monotonic() + wait_s
    while True:
        stopped = [child for child in parent.children()
                   if child.data.tags.get(tag) in values and child.info.status != "FINISHED"]
        if all(child.info.status != "RUNNING" for child in stopped) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    for child in stopped:
        run_id, own = child.info.run_id, child.data.tags.get(STOP_REASON_TAG)
        text = reason if own is None or child.info.status == "RUNNING" else f"{reason} (the trial: {own})"
        retry_locked(lambda run_id=run_id, text=text: parent.client.set_tag(run_id, STOP_REASON_TAG, text))
        retry_locked(lambda run_id=run_id: parent.client.set_terminated(run_id, status="KILLED"))


def read_state(path: Path) -> dict[str, Any]:
    """An invocation's state file ({} when there is none, or it was cut off mid-write)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def write_state(path: Path, **fields: Any) -> None:
    """Update an invocation's state file (its parent run, how it ended), written whole or not at all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps({**read_state(path), **fields}, indent=1))
    partial.rename(path)
