"""`aa-ray suite`: a benchmark suite (algorithm specs x env ids x seeds, one budget, one evaluation
protocol) run as Ray Tune trials under one MLflow parent run.

Each cell, one (spec, env, seed), is one Tune trial and one MLflow child run; a failed run is
retried from its last checkpoint (`max_failures`). The suite's folder, `<output_dir>/suites/<name>/`,
remembers the parent run and which cells finished, so invoking the same suite again continues
that parent run: finished cells are not run again, a cell an interrupted invocation left mid-run
resumes from its newest checkpoint (into the same child run), and one that had not checkpointed
yet starts over (its partial child run is deleted). A cell is keyed by its resolved spec: editing
a spec or an override reruns exactly the cells it changes, and their old child runs are marked
superseded so reports leave them out.

SIGTERM or SIGINT stops the running cells as a sweep's trials are stopped (`session.TuneSession`):
their child runs and the parent end KILLED with the stop reason, `suite.json` says `preempted`, and
the next invocation (`--resume latest`, or none: a suite always continues) resumes them. The
console is a sweep's: Tune's status table and a line per trial event; each cell's output goes to
`trial.log` in its run folder.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from ray import tune

from aa_ray import metric_names as m
from aa_ray.errors import SpecError
from aa_ray.runtime.checkpoint import newest_checkpoint
from aa_ray.spec.experiment import ExperimentSpec
from aa_ray.spec.loader import spec_hash, validate_spec
from aa_ray.tracking.mlflow_tracker import retry_locked
from aa_ray.tracking.suite_report import ENV_TAG, LABEL_TAG, REFERENCES_TAG, SUPERSEDED_TAG
from aa_ray.tune.parent import ParentRun, absolute_paths, trial_tracking, tune_storage
from aa_ray.tune.session import (
    RESUMABLE,
    TrialEvents,
    TuneSession,
    mark_stopped_children,
    read_state,
    result_loggers,
    status_table,
    trials_left,
    write_state,
)
from aa_ray.tune.specs import Suite
from aa_ray.tune.trials import (
    REUSE_TRIAL_PROCESSES,
    TRIAL_LOG,
    output_to_log,
    train_trial,
    trial_bundles,
    trial_resources,
)

SUITE_FILE = "suite.json"  # the parent run this suite's invocations share, how the last one ended
RECORD_FILE = "cell.json"  # written when a cell's run has finished
CELL_TAG, KEY_TAG, SEED_TAG = "aa_ray.suite_cell", "aa_ray.suite_key", "aa_ray.suite_seed"


@dataclass
class CellPlan:
    """One cell, resolved: its spec and key, and its run folder."""

    name: str
    label: str
    env: str
    seed: int
    raw: dict[str, Any]
    spec: ExperimentSpec
    key: str
    folder: Path

    def record(self) -> dict[str, Any] | None:
        path = self.folder / RECORD_FILE
        if not path.is_file():
            return None
        record = json.loads(path.read_text())
        return record if record.get("key") == self.key else None

    def tags(self) -> dict[str, str]:
        return {LABEL_TAG: self.label, ENV_TAG: self.env, SEED_TAG: str(self.seed)}

    def identity(self) -> dict[str, str]:
        return {CELL_TAG: self.name, KEY_TAG: self.key}


def suite_root(suite: Suite) -> Path:
    first = next(iter(suite.cells.values()))
    return Path(validate_spec(absolute_paths(first["raw"])).runtime.output_dir) / "suites" / suite.spec.name


def plan_cells(suite: Suite, root: Path) -> list[CellPlan]:
    plans = []
    for name, cell in suite.cells.items():
        raw = absolute_paths(cell["raw"])
        spec = validate_spec(raw, source=f"{suite.path} cell {name}")
        key = spec_hash(spec)
        plans.append(CellPlan(name, cell["label"], cell["env"], cell["seed"], raw, spec, key, root / f"{name}-{key}"))
    return plans


def open_parent(suite: Suite, root: Path, spec: ExperimentSpec, fresh: bool = False,
                report: Any = print) -> ParentRun | None:
    """The suite's MLflow parent run: the one its folder remembers (unless `fresh`), else a new one.
    The suite file and its references are logged with it; None when the spec turns tracking off or
    does not track in MLflow."""
    state_path = root / SUITE_FILE
    state = {} if fresh else read_state(state_path)
    if not spec.tracking.enabled or "mlflow" not in spec.tracking.backends:
        return None
    name = suite.spec.name
    parent = ParentRun(spec.tracking.experiment, "suite", name, run_name=f"suite:{name}",
                       reopen=state.get("parent_run_id"))
    if parent.run_id != state.get("parent_run_id"):  # params are written once per parent run
        parent.log(params={"specs": json.dumps(suite.spec.model_dump(mode="json")["specs"]),
                           "envs": json.dumps(sorted(suite.spec.envs)), "seeds": json.dumps(suite.spec.seeds),
                           "env_steps": suite.spec.env_steps, "eval": json.dumps(suite.spec.eval)})
        write_state(state_path, suite=str(suite.path.resolve()), parent_run_id=parent.run_id)
    parent.log_artifact(suite.path)
    if suite.references_path() is not None:  # reports read the published returns from here
        parent.log_artifact(suite.references_path())
        parent.log(tags={REFERENCES_TAG: suite.references_path().name})
    report(f"mlflow parent run: {parent.run_id} (experiment {spec.tracking.experiment!r}): {parent.url}")
    return parent


def suite_trial(config: dict[str, Any], cells: dict[str, dict[str, Any]]) -> None:
    """One cell of the suite, trained by `train_trial`; `cells` is the same for every trial. The cell's
    record is written the moment its run finishes, so an invocation killed later still counts it."""
    cell = cells[config["cell"]]

    def write_record(metrics: dict[str, float]) -> None:
        record = {"key": cell["key"], "cell": config["cell"], "finished": datetime.now().isoformat(timespec="seconds"),
                  "env_steps": metrics.get(m.ENV_STEPS), m.EVAL_RETURN: metrics.get(m.EVAL_RETURN)}
        partial = Path(cell["run_dir"]) / (RECORD_FILE + ".partial")
        partial.write_text(json.dumps(record, indent=1))
        partial.rename(partial.with_name(RECORD_FILE))

    with output_to_log(Path(cell["run_dir"]) / TRIAL_LOG):
        train_trial(cell, on_finished=write_record)


def run_suite(suite: Suite, force: bool = False, track: bool = True, report: Any = print,
              only: list[str] | None = None, resume: bool = False) -> dict[str, Any]:
    """Run every cell that has not finished (all of them with `force`, under a new parent run),
    until the end or a stop signal; `only` keeps the cells of those spec labels or env ids.
    Returns each cell's status and final metrics, the suite's folder, its parent run and whether
    it was `preempted`. `resume` (`--resume latest`) only says what is continued: a suite's
    invocations always continue its parent run and unfinished cells."""
    from aa_ray.runtime import cluster

    spec = suite.spec
    root = suite_root(suite)
    if resume:
        ended = read_state(root / SUITE_FILE).get("status")
        report(f"resuming the suite in {root} (its last invocation: {ended})" if ended in RESUMABLE else
               f"no interrupted suite {spec.name} in {root}: running what has not finished")
    plans = plan_cells(suite, root)
    if only:
        unknown = set(only) - {plan.label for plan in plans} - {plan.env for plan in plans}
        if unknown:
            raise SpecError(f"{suite.path}: --only {', '.join(sorted(unknown))}: not a spec label or env id of the "
                            f"suite (labels {', '.join(spec.specs)}; envs {', '.join(spec.envs)}).")
    selected = [plan for plan in plans if not only or plan.label in only or plan.env in only]
    parent = open_parent(suite, root, plans[0].spec, fresh=force, report=report) if track else None
    root.mkdir(parents=True, exist_ok=True)
    todo = [plan for plan in selected if force or plan.record() is None]
    chosen = f" ({len(selected)} chosen)" if only else ""
    report(f"suite {spec.name}: {len(plans)} runs{chosen}, {len(selected) - len(todo)} finished earlier, "
           f"{len(todo)} to run ({root})")
    status, ending = "FAILED", "failed"  # how the parent run and suite.json end, unless told otherwise
    session = TuneSession("suite's running cells")
    outcomes: dict[str, dict[str, Any]] = {}
    stopped: set[str] = set()
    try:
        children = parent.children() if parent is not None else []
        if parent is not None:
            _mark_superseded(parent, plans, children)
        # each cell tracked as part of the suite: in W&B, the group named after the suite's folder
        group = (spec.name, root.name) if track and plans[0].spec.tracking.enabled else None
        cells = {plan.name: _trial_config(plan, parent, children, force, report, group) for plan in todo}
        if todo:
            largest = max((trial_bundles(plan.spec) for plan in todo),
                          key=lambda bundles: sum(bundle.get("CPU", 0.0) for bundle in bundles))
            py_modules = sorted({path for plan in todo for path in plan.spec.env.py_modules})
            session.start(sum(b.get("CPU", 0.0) for b in largest) * min(spec.max_concurrent_trials, len(todo)),
                          py_modules)
            write_state(root / SUITE_FILE, status="running")
            cluster.check_capacity(largest, what="the suite's largest run")
            outcomes, stopped = _run_cells(suite, todo, cells, root)
        if parent is not None and stopped:
            mark_stopped_children(parent, KEY_TAG, {plan.key for plan in todo if plan.name in stopped},
                                  session.signals.stop_reason())
        rows = [_row(plan, outcomes.get(plan.name), plan.name in stopped) for plan in plans]
        status = "KILLED" if stopped else "FAILED" if any(row["status"] == "failed" for row in rows) else "FINISHED"
        ending = "preempted" if stopped else status.lower()
        table = root / "cells.json"
        table.write_text(json.dumps(rows, indent=1, default=str))
        if parent is not None:
            parent.log_artifact(table)
        return {"cells": rows, "root": str(root), "parent_run_id": parent.run_id if parent else None,
                "preempted": bool(stopped)}
    except KeyboardInterrupt:  # a second signal: the cells resume from their newest checkpoints all the same
        status, ending = "KILLED", "interrupted"
        raise
    finally:
        write_state(root / SUITE_FILE, status=ending)
        session.end(parent, status, report)


def _trial_config(plan: CellPlan, parent: ParentRun | None, children: list[Any], force: bool,
                  report: Any, group: tuple[str, str] | None) -> dict[str, Any]:
    """The cell's trial config; `group`: the suite's name and its tracking group, None untracked."""
    resume_from = None if force else newest_checkpoint(plan.folder / "checkpoints")
    if resume_from is not None:
        report(f"{plan.name}: resuming from {resume_from.name}")
    elif parent is not None:  # it had not checkpointed: its partial child run would repeat steps
        for child in children:
            if all(child.data.tags.get(k) == v for k, v in plan.identity().items()):
                retry_locked(lambda run_id=child.info.run_id: parent.client.delete_run(run_id))
    tracking = None
    if group is not None:
        suite_name, group_name = group
        tracking = trial_tracking(parent, "suite", suite_name, group_name, f"{suite_name}:{plan.name}", plan.tags())
        tracking["identity"] = plan.identity()
    return {"spec": plan.raw, "run_dir": str(plan.folder), "tracking": tracking, "key": plan.key,
            "resume_from": str(resume_from) if resume_from else None}


def _mark_superseded(parent: ParentRun, plans: list[CellPlan], children: list[Any]) -> None:
    keys = {plan.name: plan.key for plan in plans}
    for child in children:
        cell, key = child.data.tags.get(CELL_TAG), child.data.tags.get(KEY_TAG)
        if cell is not None and keys.get(cell) != key and SUPERSEDED_TAG not in child.data.tags:
            retry_locked(lambda run_id=child.info.run_id: parent.client.set_tag(run_id, SUPERSEDED_TAG, "true"))


def _run_cells(suite: Suite, todo: list[CellPlan], cells: dict[str, dict[str, Any]],
               root: Path) -> tuple[dict[str, Any], set[str]]:
    """One Tuner over the cells still to run; each cell's outcome (its trial's last report), and
    the cells a stop signal left unfinished."""
    spec = suite.spec
    plans = {plan.name: plan for plan in todo}
    storage = tune_storage(spec.storage, root / "tune", suite.path)
    experiment = f"{spec.name}-{datetime.now():%Y%m%d-%H%M%S}"
    resources = lambda config: trial_resources(plans[config["cell"]].spec)  # noqa: E731
    # verbose 1: the status table only; TrialEvents says what happens to each cell
    events = TrialEvents(str(root), m.EVAL_RETURN, by="cell", folders={n: str(p.folder) for n, p in plans.items()})
    tuner = tune.Tuner(
        tune.with_resources(tune.with_parameters(suite_trial, cells=cells), resources),
        param_space={"cell": tune.grid_search(list(plans))},
        tune_config=tune.TuneConfig(max_concurrent_trials=spec.max_concurrent_trials,
                                    trial_dirname_creator=lambda trial: trial.config["cell"],
                                    reuse_actors=REUSE_TRIAL_PROCESSES),
        run_config=tune.RunConfig(
            name=experiment, storage_path=storage, failure_config=tune.FailureConfig(max_failures=spec.max_failures),
            verbose=1, progress_reporter=status_table({"cell": "cell"}, m.EVAL_RETURN),
            callbacks=[*result_loggers(), events],
        ),
    )
    before = {name: plan.record() for name, plan in plans.items()}  # --force reruns cells that have one
    results = tuner.fit()

    def finished(name: str) -> bool:
        """Its run wrote its record in this invocation: a cell that did so as a stop signal came is
        finished, whatever Tune had heard of it."""
        record = plans[name].record()
        return record is not None and record != before[name]

    left = trials_left(f"{storage.rstrip('/')}/{experiment}").values()
    stopped = {config.get("cell") for config in left if not finished(config.get("cell"))}
    outcomes = {}
    for result in results:
        name = (result.config or {}).get("cell")
        if name not in plans or name in stopped:
            continue
        error = None if result.error is None else str(result.error).strip().splitlines()[-1][:300]
        outcomes[name] = {"finished": result.error is None and finished(name), "error": error}
    return outcomes, stopped


def _row(plan: CellPlan, outcome: dict[str, Any] | None, stopped: bool = False) -> dict[str, Any]:
    record = plan.record()
    if stopped:
        status = "stopped"  # by a signal: the next invocation resumes it
    elif outcome is None:
        status = "finished earlier" if record else "not run"  # left out with --only
    else:
        status = "finished" if outcome["finished"] else "failed"
    return {"cell": plan.name, "label": plan.label, "env": plan.env, "seed": plan.seed, "key": plan.key,
            "status": status, "env_steps": (record or {}).get("env_steps"),
            m.EVAL_RETURN: (record or {}).get(m.EVAL_RETURN),
            "error": (outcome or {}).get("error"), "folder": str(plan.folder)}


def cells_table(outcome: dict[str, Any]) -> str:
    """The suite's cells as text lines: status, env steps, final eval return."""
    lines = []
    for row in outcome["cells"]:
        value = row[m.EVAL_RETURN]
        final = "-" if value is None else f"{value:.1f}"
        steps = "-" if row["env_steps"] is None else f"{int(row['env_steps']):,}"
        line = f"{row['cell']:<40} {row['status']:<17} env steps {steps:>10}  {m.EVAL_RETURN} {final}"
        lines.append(line + (f"  error: {row['error']}" if row["error"] else ""))
    return "\n".join(lines)
