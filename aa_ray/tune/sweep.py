"""`aa-ray sweep`: a Ray Tune search over dotted spec keys. Every trial is a full training run
(its own actor graph and placement group), reports each evaluation and checkpoint to Tune, is
retried from its last checkpoint when it fails (`max_failures`), and is a child MLflow run of the
sweep's parent run.

The console shows Tune's status table (a `CLIReporter`, every `STATUS_EVERY_S`) and one line per
trial event (`TrialEvents`); each trial's own output goes to `trial.log` in its run folder.

A sweep stopped by SIGTERM or SIGINT (a preemption notice, Ctrl-C) saves Tune's experiment state
and ends its parent run KILLED; `resume=True` (`aa-ray sweep FILE --resume latest`) restores the
newest interrupted sweep of that name with Tune's own `Tuner.restore`: unfinished trials continue
from their last reported checkpoint in their own MLflow runs, finished ones are not run again."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import Any

from ray import tune

from aa_ray import metric_names as m
from aa_ray.spec.loader import set_values, validate_spec
from aa_ray.tracking.mlflow_tracker import retry_locked
from aa_ray.tune.parent import ParentRun, absolute_paths, end_invocation, tune_storage
from aa_ray.tune.specs import Sweep
from aa_ray.tune.trials import TRIAL_LOG, TRIAL_TAG, output_to_log, train_trial, trial_bundles, trial_resources


def _format(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def short_params(params: dict[str, Any]) -> str:
    return ",".join(f"{key.rsplit('.', 1)[-1]}={_format(value)}" for key, value in params.items())


def sweep_trial(config: dict[str, Any], base: dict[str, Any], root: str, tracking: dict[str, Any] | None) -> None:
    """One sweep trial: the base spec with this trial's sampled values (`config["params"]`), trained
    by `train_trial`. The base and tracking are the same for every trial (`tune.with_parameters`)."""
    trial_id = tune.get_context().get_trial_id()
    params = config["params"]
    if tracking:
        tracking = {**tracking, "run_name": f"{tracking['run_name']}-{trial_id}[{short_params(params)}]",
                    "tags": {**tracking["tags"], "aa_ray.params": json.dumps(params)}}
    run_dir = Path(root) / trial_id
    with output_to_log(run_dir / TRIAL_LOG):
        train_trial({"spec": set_values(base, params), "run_dir": str(run_dir), "tracking": tracking})


STATUS_EVERY_S = 60  # the status table's refresh; trial events are printed as they happen
# Tune's and Ray's own switches for the sweep's console. Both read them in this process while the
# sweep runs, so they are set for the sweep's Ray session only (`sweep_console`), never at import nor
# for the workers (which start with the environment Ray was given).
SWEEP_CONSOLE = {
    # the CLIReporter's status table: the newer output prints a table per trial start and end
    "RAY_AIR_NEW_OUTPUT": "0",
    # no TensorBoard logger (TensorBoard is not a dependency), so no hint to run it either; the CSV
    # and JSON result loggers it would also add are passed in the RunConfig
    "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1",
    # a failed trial's traceback stays in its error file; TrialEvents prints its message
    "TUNE_PRINT_ALL_TRIAL_ERRORS": "0",
}
# Ray prints the errors its raylet reports (a trial's worker died) with a coloured "(raylet)" prefix
PLAIN_RAY_PREFIX = {"RAY_COLOR_PREFIX": "0"}


@contextmanager
def sweep_console() -> Iterator[None]:
    settings = SWEEP_CONSOLE if sys.stdout.isatty() else {**SWEEP_CONSOLE, **PLAIN_RAY_PREFIX}
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
    holds plain values only."""

    def __init__(self, root: str, metric: str):
        self.root, self.metric = root, metric

    def _say(self, trial: Any, text: str) -> None:
        print(f"trial {trial.trial_id} {text}", flush=True)

    def _log(self, trial: Any) -> Path:
        return Path(self.root) / trial.trial_id / TRIAL_LOG

    def _progress(self, metrics: dict[str, Any] | None) -> str:
        metrics = metrics or {}
        steps = metrics.get(m.ENV_STEPS)
        text = "?" if steps is None else f"{int(steps):,}"
        value = metrics.get(self.metric)
        return f"{text} env steps" + ("" if value is None else f", {self.metric} {_format(value)}")

    def on_trial_start(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        params = short_params(trial.config.get("params", {}))
        checkpoint = trial.latest_checkpoint_result
        if checkpoint is None:
            self._say(trial, f"started [{params}], its log: {self._log(trial)}")
        else:
            steps = checkpoint.metrics.get(m.ENV_STEPS)
            self._say(trial, f"[{params}] resuming from {int(steps or 0):,} env steps (its last checkpoint)")

    def on_checkpoint(self, iteration: int, trials: list[Any], trial: Any, checkpoint: Any, **info: Any) -> None:
        # Tune calls this with the checkpoint's own report as the trial's last result, before it
        # files the checkpoint as the trial's latest
        self._say(trial, f"checkpointed at {self._progress(trial.last_result)}")

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._say(trial, f"finished at {self._progress(trial.last_result)}")

    def _error(self, trial: Any) -> str:
        """The trial's error and where to read more: Tune has just written it (the exception
        pickled, its traceback as text) in the driver's staging folder, and copies both to the
        sweep's storage later, so the message is read here and the traceback named there."""
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


STATE_FILE = "sweep.json"  # in the sweep's folder: where Tune keeps its state, the parent run, how it ended
RESUMABLE = ("running", "preempted", "interrupted")  # "running": its driver died without a word (SIGKILL)


@dataclass
class InterruptedSweep:
    root: Path  # the sweep's folder of trial run folders
    tune_path: str  # Tune's experiment folder (or URI), what `Tuner.restore` takes
    parent_run_id: str | None


def interrupted_sweep(output_dir: str, name: str) -> InterruptedSweep | None:
    """The newest sweep of this name under `output_dir` that did not end and whose Tune state can
    be restored, else None."""
    for root in sorted(Path(output_dir).glob(f"sweep-{name}-*"), reverse=True):  # the stamp sorts by time
        try:
            state = json.loads((root / STATE_FILE).read_text())
        except (OSError, ValueError):  # a sweep from before this file existed, or one cut off mid-write
            continue
        if state.get("status") in RESUMABLE and tune.Tuner.can_restore(state["tune_path"]):
            return InterruptedSweep(root, state["tune_path"], state.get("parent_run_id"))
    return None


def _write_state(root: Path, tune_path: str, parent: ParentRun | None, status: str) -> None:
    root.mkdir(parents=True, exist_ok=True)
    state = {"tune_path": tune_path, "parent_run_id": parent.run_id if parent else None, "status": status}
    (root / STATE_FILE).write_text(json.dumps(state, indent=1))


class SweepStopSignals:
    """SIGTERM as Tune takes SIGINT. During `fit()` Tune answers a SIGINT by stopping its trials,
    saving the experiment state and returning, which is what a preemption notice needs; SIGTERM
    would meet the handler `ray.init` installs (sys.exit: trials killed, nothing saved). So SIGTERM
    is turned into a SIGINT. A second signal raises KeyboardInterrupt at once (Tune's handler puts
    the previous SIGINT handler back after its first signal)."""

    def __init__(self) -> None:
        self.received: str | None = None

    @contextmanager
    def installed(self) -> Iterator[SweepStopSignals]:
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
        os.write(2, f"\n{self.received}: stopping the sweep's trials and saving its state; "
                    "send it again to stop at once\n".encode())
        interrupt = signal.getsignal(signal.SIGINT)  # Tune's inside fit(), Python's (KeyboardInterrupt) outside
        if not callable(interrupt):  # SIGINT ignored (a background job of a script) or left to the OS
            raise KeyboardInterrupt(self.received)
        interrupt(signal.SIGINT, frame)


def run_sweep(sweep: Sweep, track: bool = True, report: Any = print, resume: bool = False) -> dict[str, Any]:
    """Run the sweep to the end, or until a stop signal; returns its trials (params, metric,
    status), the best one and whether it was `preempted`. `resume`: continue the newest interrupted
    sweep of this name instead of starting a new one, if there is one."""
    from aa_ray.runtime import cluster

    spec = sweep.spec
    base = absolute_paths(sweep.base_raw)
    base_spec = validate_spec(base)
    earlier = interrupted_sweep(base_spec.runtime.output_dir, spec.name) if resume else None
    if earlier is not None:
        root = earlier.root
        report(f"resuming the sweep in {root} (Tune state {earlier.tune_path})")
    else:
        if resume:
            report(f"no interrupted sweep {spec.name} under {base_spec.runtime.output_dir}: starting a new one")
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        root = Path(base_spec.runtime.output_dir) / f"sweep-{spec.name}-{stamp}"
    parent = None
    if track and base_spec.tracking.enabled:
        parent = ParentRun(base_spec.tracking.experiment, "sweep", spec.name, run_name=f"sweep:{spec.name}",
                           reopen=earlier.parent_run_id if earlier else None)
        if earlier is None or parent.run_id != earlier.parent_run_id:  # params are written once per parent run
            parent.log(params={"search_space": json.dumps(spec.model_dump(mode="json")["search_space"]),
                               "metric": spec.metric, "mode": spec.mode, "base": spec.base})
            parent.log_artifact(sweep.path)
        report(f"mlflow parent run: {parent.run_id} (experiment {base_spec.tracking.experiment!r}): {parent.url}")

    # the embedded Ray holds max_concurrent_trials of the largest trial (a running cluster is used as is)
    sizes = [trial_bundles(sweep.trial_spec(params)) for params in _probe_params(sweep)]
    largest = max(sizes, key=lambda bundles: sum(bundle.get("CPU", 0.0) for bundle in bundles))
    # the trials' output stays in their own logs (and Ray's): the console is Tune's table and TrialEvents
    started_ray = cluster.connect(None, cpus=sum(b.get("CPU", 0.0) for b in largest) * spec.max_concurrent_trials,
                                  py_modules=base_spec.env.py_modules, log_to_driver=False)
    # after Ray started its processes (they do not inherit it), until it is shut down (its error
    # messages come at any time)
    with sweep_console():
        status, ending = "FAILED", "failed"  # how the parent run and the sweep's state file end, unless told otherwise
        tune_path = ""  # set once Tune holds the sweep: before that, a failure leaves an earlier state file as it was
        # from here on SIGTERM is ours, not the handler ray.init installed
        with SweepStopSignals().installed():
            try:
                cluster.check_capacity(largest, what="the sweep's largest trial")  # else Tune would wait forever
                trainable = tune.with_parameters(
                    sweep_trial, base=base, root=str(root),
                    tracking=parent.child_tracking(spec.name, {}) if parent else None,
                )
                # each trial's placement group: a bundle for the trial itself, then its own spec's bundles
                resources = lambda config: trial_resources(validate_spec(set_values(base, config["params"])))  # noqa: E731
                if earlier is not None:
                    # unfinished and errored trials continue from their last reported checkpoint, finished ones stay
                    tuner = tune.Tuner.restore(earlier.tune_path, tune.with_resources(trainable, resources),
                                               resume_unfinished=True, resume_errored=True)
                    tune_path = earlier.tune_path
                else:
                    storage = tune_storage(spec.storage, root.parent / "tune", sweep.path)
                    tuner = _new_tuner(sweep, tune.with_resources(trainable, resources), root, storage)
                    tune_path = f"{storage.rstrip('/')}/{root.name}"  # a URI stays one
                _write_state(root, tune_path, parent, "running")
                results = tuner.fit()
                trials_left = _trials_left(tune_path)
                preempted = bool(trials_left)
                if parent is not None and preempted:
                    _mark_stopped_children(parent, trials_left)
                trials = [_row(result, spec.metric) for result in results]
                finished = [t for t in trials if t["metric"] is not None and t["error"] is None]
                best = None
                if finished:
                    pick = max if spec.mode == "max" else min
                    best = pick(finished, key=lambda t: t["metric"])
                status = "KILLED" if preempted else "FINISHED" if finished else "FAILED"
                ending = "preempted" if preempted else status.lower()
                if parent is not None:
                    table = root / "trials.json"
                    root.mkdir(parents=True, exist_ok=True)
                    table.write_text(json.dumps(trials, indent=1, default=str))
                    parent.log_artifact(table)
                    if best is not None:
                        best_tags = {"aa_ray.best_trial": best["trial_id"],
                                     "aa_ray.best_params": json.dumps(best["params"])}
                        parent.log(metrics={f"best/{spec.metric}": best["metric"]}, tags=best_tags)
                return {"trials": trials, "best": best, "root": str(root),
                        "parent_run_id": parent.run_id if parent else None, "preempted": preempted}
            except KeyboardInterrupt:  # a second signal, or one before fit(): Tune's last saved state still restores
                status, ending = "KILLED", "interrupted"
                raise
            finally:
                if tune_path:
                    _write_state(root, tune_path, parent, ending)
                end_invocation(parent, status, started_ray, report)


def _trials_left(tune_path: str) -> set[str]:
    """The trials Tune's saved experiment state still has to run, as a stop signal leaves it (the
    trials `fit()` returns all read as ended then: Tune stops them after saving the state)."""
    from ray.tune.experiment import Trial

    saved = tune.ExperimentAnalysis(tune_path)
    return {trial.trial_id for trial in saved.trials if trial.status not in (Trial.TERMINATED, Trial.ERROR)}


def _mark_stopped_children(parent: ParentRun, trial_ids: set[str]) -> None:
    """The child runs of trials a stop signal cut short are KILLED, as a preempted `aa-ray run` is
    (a stopped trial's own process may have ended its run FAILED on the way out); they continue on
    resume."""
    for child in parent.children():
        if child.data.tags.get(TRIAL_TAG) in trial_ids and child.info.status != "FINISHED":
            retry_locked(lambda child=child: parent.client.set_terminated(child.info.run_id, status="KILLED"))


def _new_tuner(sweep: Sweep, trainable: Any, root: Path, storage: str) -> tune.Tuner:
    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback

    spec = sweep.spec
    status_table = tune.CLIReporter(
        parameter_columns={f"params/{key}": key.rsplit(".", 1)[-1] for key in spec.search_space},
        metric_columns={m.ENV_STEPS: "env steps", spec.metric: spec.metric},
        max_report_frequency=STATUS_EVERY_S,  # the sweep's metric and mode come from its TuneConfig
    )
    return tune.Tuner(
        trainable,
        param_space={"params": {key: domain.to_tune() for key, domain in spec.search_space.items()}},
        tune_config=tune.TuneConfig(
            metric=spec.metric, mode=spec.mode, num_samples=spec.num_samples,
            max_concurrent_trials=spec.max_concurrent_trials, scheduler=_scheduler(sweep),
            search_alg=_searcher(sweep), trial_dirname_creator=lambda trial: trial.trial_id,
        ),
        run_config=tune.RunConfig(
            name=root.name, storage_path=storage,
            failure_config=tune.FailureConfig(max_failures=spec.max_failures),
            # verbose 1: the status table only; TrialEvents says what happens to each trial
            verbose=1, progress_reporter=status_table,
            callbacks=[CSVLoggerCallback(), JsonLoggerCallback(), TrialEvents(str(root), spec.metric)],
        ),
    )


def _probe_params(sweep: Sweep) -> list[dict[str, Any]]:
    """Parameter sets that cover every value that can change a trial's size."""
    probes = [{}]
    for key, domain in sweep.spec.search_space.items():
        probes += [{key: value} for value in domain.probe_values()]
    return probes


def _scheduler(sweep: Sweep) -> Any:
    spec = sweep.spec
    if spec.scheduler != "asha":
        return None
    from ray.tune.schedulers import ASHAScheduler

    budget = validate_spec(sweep.base_raw).budget.env_steps
    return ASHAScheduler(time_attr=m.ENV_STEPS, max_t=budget, grace_period=spec.asha.grace_period,
                         reduction_factor=spec.asha.reduction_factor)


def _searcher(sweep: Sweep) -> Any:
    if sweep.spec.searcher != "optuna":
        return None
    from ray.tune.search.optuna import OptunaSearch

    return OptunaSearch(seed=validate_spec(sweep.base_raw).seed)


def _row(result: Any, metric: str) -> dict[str, Any]:
    metrics = result.metrics or {}
    config = result.config or {}
    return {
        "trial_id": metrics.get("trial_id") or Path(result.path).name,
        "params": config.get("params", {}),
        "metric": metrics.get(metric),
        "env_steps": metrics.get(m.ENV_STEPS),
        "resumed": bool(metrics.get("resumed", 0.0)),
        "finished": bool(metrics.get(m.RUN_FINISHED, 0.0)),  # else a scheduler (ASHA) stopped it early
        "error": None if result.error is None else str(result.error).splitlines()[0][:300],
    }


def trials_table(outcome: dict[str, Any], metric: str) -> str:
    """The sweep's trials as a text table (params, metric, env steps, status), best marked."""
    from rich.console import Console
    from rich.table import Table

    trials = outcome["trials"]
    keys = sorted({key for trial in trials for key in trial["params"]})
    table = Table(title=f"sweep trials (metric {metric}, last report)")
    for column in ["trial", *keys, metric, "env steps", "status"]:
        table.add_column(column)
    best = outcome["best"]["trial_id"] if outcome["best"] else None
    for trial in trials:
        if trial["error"]:
            status = "error: " + trial["error"]
        else:
            status = ("done" if trial["finished"] else "stopped early") + (" (resumed)" if trial["resumed"] else "")
        value = "-" if trial["metric"] is None else f"{trial['metric']:.4g}"
        table.add_row(
            trial["trial_id"] + (" (best)" if trial["trial_id"] == best else ""),
            *[_format(trial["params"].get(key, "")) for key in keys],
            value, str(int(trial["env_steps"] or 0)), status,
        )
    console = Console(width=160, record=True)
    with console.capture() as capture:
        console.print(table)
        if outcome["best"]:
            console.print(f"best: {outcome['best']['trial_id']} {outcome['best']['params']} "
                          f"{metric} {outcome['best']['metric']:.4g}")
    return capture.get()
