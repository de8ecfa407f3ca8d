"""`aa-ray sweep`: a Ray Tune search over dotted spec keys. Every trial is a full training run
(its own actor graph and placement group), reports each evaluation and checkpoint to Tune, is
retried from its last checkpoint when it fails (`max_failures`), and is a child MLflow run of the
sweep's parent run (with `tracking.backends` naming mlflow), a run of the W&B group named after the
sweep's folder (wandb), and event files in its run folder inside that folder (tensorboard).

The console shows Tune's status table (a `CLIReporter`, every `STATUS_EVERY_S`) and one line per
trial event (`TrialEvents`); each trial's own output goes to `trial.log` in its run folder.

A sweep stopped by SIGTERM or SIGINT (a preemption notice, Ctrl-C) saves Tune's experiment state
and ends its parent run KILLED; `resume=True` (`aa-ray sweep FILE --resume latest`) restores the
newest interrupted sweep of that name with Tune's own `Tuner.restore`: unfinished trials continue
from their last reported checkpoint in their own MLflow runs, finished ones are not run again."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from ray import tune

from aa_ray import metric_names as m
from aa_ray.spec.loader import set_values, validate_spec
from aa_ray.tune.parent import ParentRun, absolute_paths, trial_tracking, tune_storage
from aa_ray.tune.session import (
    RESUMABLE,
    TrialEvents,
    TuneSession,
    format_value,
    mark_stopped_children,
    read_state,
    result_loggers,
    short_params,
    status_table,
    trials_left,
    write_state,
)
from aa_ray.tune.specs import Sweep
from aa_ray.tune.trials import (
    REUSE_TRIAL_PROCESSES,
    TRIAL_LOG,
    TRIAL_TAG,
    output_to_log,
    train_trial,
    trial_bundles,
    trial_resources,
)


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


STATE_FILE = "sweep.json"  # in the sweep's folder: where Tune keeps its state, the parent run, how it ended


@dataclass
class InterruptedSweep:
    root: Path  # the sweep's folder of trial run folders
    tune_path: str  # Tune's experiment folder (or URI), what `Tuner.restore` takes
    parent_run_id: str | None


def interrupted_sweep(output_dir: str, name: str) -> InterruptedSweep | None:
    """The newest sweep of this name under `output_dir` that did not end and whose Tune state can
    be restored, else None."""
    for root in sorted(Path(output_dir).glob(f"sweep-{name}-*"), reverse=True):  # the stamp sorts by time
        state = read_state(root / STATE_FILE)  # {}: a sweep from before this file existed, or cut off mid-write
        if state.get("status") in RESUMABLE and tune.Tuner.can_restore(state["tune_path"]):
            return InterruptedSweep(root, state["tune_path"], state.get("parent_run_id"))
    return None


def _write_state(root: Path, tune_path: str, parent: ParentRun | None, status: str) -> None:
    write_state(root / STATE_FILE, tune_path=tune_path, parent_run_id=parent.run_id if parent else None, status=status)


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
    tracked = track and base_spec.tracking.enabled
    if tracked and "mlflow" in base_spec.tracking.backends:
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
    session = TuneSession("sweep's trials")
    session.start(sum(b.get("CPU", 0.0) for b in largest) * spec.max_concurrent_trials, base_spec.env.py_modules)
    status, ending = "FAILED", "failed"  # how the parent run and the sweep's state file end, unless told otherwise
    tune_path = ""  # set once Tune holds the sweep: before that, a failure leaves an earlier state file as it was
    try:
        cluster.check_capacity(largest, what="the sweep's largest trial")  # else Tune would wait forever
        trainable = tune.with_parameters(
            sweep_trial, base=base, root=str(root),
            tracking=trial_tracking(parent, "sweep", spec.name, root.name, spec.name, {}) if tracked else None,
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
        left = trials_left(tune_path)
        preempted = bool(left)
        if parent is not None and preempted:
            mark_stopped_children(parent, TRIAL_TAG, set(left), session.signals.stop_reason())
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
                best_tags = {"aa_ray.best_trial": best["trial_id"], "aa_ray.best_params": json.dumps(best["params"])}
                parent.log(metrics={f"best/{spec.metric}": best["metric"]}, tags=best_tags)
        return {"trials": trials, "best": best, "root": str(root),
                "parent_run_id": parent.run_id if parent else None, "preempted": preempted}
    except KeyboardInterrupt:  # a second signal, or one before fit(): Tune's last saved state still restores
        status, ending = "KILLED", "interrupted"
        raise
    finally:
        if tune_path:
            _write_state(root, tune_path, parent, ending)
        session.end(parent, status, report)


def _new_tuner(sweep: Sweep, trainable: Any, root: Path, storage: str) -> tune.Tuner:
    spec = sweep.spec
    # the sweep's metric and mode come from its TuneConfig
    table = status_table({f"params/{key}": key.rsplit(".", 1)[-1] for key in spec.search_space}, spec.metric)
    return tune.Tuner(
        trainable,
        param_space={"params": {key: domain.to_tune() for key, domain in spec.search_space.items()}},
        tune_config=tune.TuneConfig(
            metric=spec.metric, mode=spec.mode, num_samples=spec.num_samples,
            max_concurrent_trials=spec.max_concurrent_trials, scheduler=_scheduler(sweep),
            search_alg=_searcher(sweep), trial_dirname_creator=lambda trial: trial.trial_id,
            reuse_actors=REUSE_TRIAL_PROCESSES,
        ),
        run_config=tune.RunConfig(
            name=root.name, storage_path=storage,
            failure_config=tune.FailureConfig(max_failures=spec.max_failures),
            # verbose 1: the status table only; TrialEvents says what happens to each trial
            verbose=1, progress_reporter=table, callbacks=[*result_loggers(), TrialEvents(str(root), spec.metric)],
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
            *[format_value(trial["params"].get(key, "")) for key in keys],
            value, str(int(trial["env_steps"] or 0)), status,
        )
    console = Console(width=160, record=True)
    with console.capture() as capture:
        console.print(table)
        if outcome["best"]:
            console.print(f"best: {outcome['best']['trial_id']} {outcome['best']['params']} "
                          f"{metric} {outcome['best']['metric']:.4g}")
    return capture.get()
