"""`aa-ray report`: compare runs from the MLflow store. Learning curves (an eval metric against env
steps and against each run's own wall-clock minutes, see `curves.py`) with the seeds of each
configuration aggregated (median line, min-max band), as a PNG and a self-contained HTML page, and
a summary table (final value, env steps and minutes to a threshold, throughput, runs that shared
the machine), with the CPU the runs ran on. A run reaches the threshold once it holds it after it
started learning (`curves.reached`); the table gives the untrained policy's return beside it.

Runs are grouped by their params with the seed left out, so runs that differ only in seed are
one curve; a group is labelled by the params that differ between groups.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from aa_ray import metric_names
from aa_ray.tracking import curves as learning_curves
from aa_ray.tracking.credentials import without_credentials
from aa_ray.tracking.curves import Curve, ReportError  # ReportError: what the CLI catches, from here
from aa_ray.tracking.mlflow_tracker import PARENT_TAG, resolved_tracking_uri, search_all_runs
from aa_ray.tracking.suite_report import make_suite_report

IGNORED_PARAMS = ("seed", "runtime.output_dir", "name")  # differ between seeds, not configurations


@dataclass
class Group:
    label: str
    runs: list[Run] = field(default_factory=list)
    curves: list[Curve] = field(default_factory=list)


def select_runs(client: MlflowClient, experiment: str | None, parent: str | None, run_ids: list[str]) -> list[Run]:
    if run_ids:
        return [client.get_run(run_id) for run_id in run_ids]
    if parent:
        experiment_id = client.get_run(parent).info.experiment_id
        return search_all_runs(client, [experiment_id], f"tags.`{PARENT_TAG}` = '{parent}'")
    name = experiment or "aa-ray"
    found = client.get_experiment_by_name(name)
    if found is None:
        raise ReportError(f"MLflow has no experiment {name!r} at {without_credentials(client.tracking_uri)} "
                          "(set MLFLOW_TRACKING_URI to the store your runs are in, or pass --experiment)")
    runs = search_all_runs(client, [found.experiment_id])
    return [run for run in runs if "aa_ray.kind" not in run.data.tags]  # training runs, not sweep parents


def group_runs(runs: list[Run]) -> list[Group]:
    def config(run: Run) -> dict[str, str]:
        return {k: v for k, v in run.data.params.items() if k not in IGNORED_PARAMS}

    keys = sorted({k for run in runs for k in config(run)})
    differing = [k for k in keys if len({config(run).get(k) for run in runs}) > 1]
    groups: dict[str, Group] = {}
    for run in runs:
        params = config(run)
        label = ", ".join(f"{k}={params.get(k)}" for k in differing) or run.data.params.get("algo.name", "runs")
        groups.setdefault(json.dumps(params, sort_keys=True), Group(label)).runs.append(run)
    return list(groups.values())


def summary_rows(client: MlflowClient, groups: list[Group], threshold: float | None, mode: str,
                 at_once: dict[str, int]) -> list[dict]:
    rows = []
    for group in groups:
        finals = [c.values[-1] for c in group.curves]
        row: dict[str, Any] = {
            "group": group.label, "runs": len(group.runs), "final_median": float(np.median(finals)),
            "final_min": float(np.min(finals)), "final_max": float(np.max(finals)),
        }
        if threshold is not None:
            reach = learning_curves.reach_columns(group.curves, threshold, mode)
            row |= {"steps_to_threshold": reach["env_steps_to_reach_X"],
                    "minutes_to_threshold": reach["minutes_to_reach_X"], "reached": reach["reached"],
                    "untrained_return": reach["untrained_return"], "note": reach["note"]}
        rates = []
        for run in group.runs:
            history = client.get_metric_history(run.info.run_id, metric_names.ENV_STEPS_PER_S)
            if history:
                rates.append(float(np.mean([m.value for m in history])))
        row["env_steps_per_s"] = float(np.median(rates)) if rates else None
        row["runs_at_once"] = max(at_once[c.run_id] for c in group.curves)
        rows.append(row)
    return rows


def plot(data: dict[str, dict], metric: str, path: Path) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    for label, curves in data.items():
        for ax, axis in zip(axes, ("env_steps", "minutes"), strict=True):
            c = curves[axis]
            (line,) = ax.plot(c["x"], c["median"], label=label)
            ax.fill_between(c["x"], c["low"], c["high"], color=line.get_color(), alpha=0.2)
    for ax, xlabel in zip(axes, ("env steps", "minutes since the run started (stops left out)"), strict=True):
        ax.set_xlabel(xlabel)
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    figure.suptitle(f"{metric}: median over seeds, band = min-max")
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110)
    plt.close(figure)
    path.write_bytes(buffer.getvalue())
    return buffer.getvalue()


def make_report(
    out: Path, metric: str = metric_names.EVAL_RETURN, experiment: str | None = None, parent: str | None = None,
    run_ids: list[str] | None = None, threshold: float | None = None, mode: str = "max",
    tracking_uri: str | None = None,
) -> dict[str, Any]:
    """Write report.png, report.html and summary.json into `out`; with `parent`, also log them as
    artifacts of that (sweep or pipeline) run. Returns the paths and the summary rows."""
    client = MlflowClient(tracking_uri=tracking_uri or resolved_tracking_uri())
    if parent and client.get_run(parent).data.tags.get("aa_ray.kind") == "suite":
        return make_suite_report(client, out, parent, metric, threshold)
    runs = select_runs(client, experiment, parent, run_ids or [])
    if not runs:
        raise ReportError("no runs matched (check --experiment, --parent or --runs)")
    groups = group_runs(runs)
    for group in groups:
        loaded = (learning_curves.load_curve(client, run, metric) for run in group.runs)
        group.curves = [c for c in loaded if c is not None]
    groups = [g for g in groups if g.curves]
    if not groups:
        raise ReportError(f"none of the {len(runs)} runs logged {metric!r}")
    data = {g.label: {"runs": [c.run_id for c in g.curves], "env_steps": learning_curves.aggregate(g.curves, "steps"),
                      "minutes": learning_curves.aggregate(g.curves, "minutes")} for g in groups}
    at_once = learning_curves.runs_at_once(runs, [c for g in groups for c in g.curves])
    rows = summary_rows(client, groups, threshold, mode, at_once)
    machine = learning_curves.machine_note([run for g in groups for run in g.runs], at_once)
    out.mkdir(parents=True, exist_ok=True)
    png = plot(data, metric, out / "report.png")
    title = f"aa-ray report: {metric} ({datetime.now():%Y-%m-%d %H:%M})"
    notes = [machine, learning_curves.REACH_RULE] if threshold is not None else [machine]
    learning_curves.write_html(out / "report.html", title, [png], {"Summary": rows}, data, runs, notes)
    (out / "summary.json").write_text(json.dumps({"metric": metric, "rows": rows, "curves": data,
                                                  "machine": machine}, indent=1))
    if parent:
        for name in ("report.png", "report.html", "summary.json"):
            client.log_artifact(parent, str(out / name), "report")
    return {"png": out / "report.png", "html": out / "report.html", "rows": rows, "groups": len(groups),
            "machine": machine}
