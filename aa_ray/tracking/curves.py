"""What both reports are made of: a run's learning curve read from MLflow (the newest attempt of a
resumed run), curves aggregated over seeds, and the self-contained HTML page."""

from __future__ import annotations

import base64
import html
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from mlflow.entities import Metric, Run
from mlflow.tracking import MlflowClient

from aa_ray import metric_names

GRID_POINTS = 200


class ReportError(ValueError):
    """No runs to report, or a metric none of them has; the message says which."""


@dataclass
class Curve:
    run_id: str
    steps: np.ndarray  # env steps of each evaluation
    seconds: np.ndarray  # wall-clock seconds since the run started
    values: np.ndarray


def newest_attempt(points: list[Metric], resumes: list[Metric]) -> list[Metric]:
    """A metric's points without what interrupted attempts logged past the checkpoint the run resumed
    from (their evaluations need not land on the steps the resumed attempt logs). A resume marker
    (`run/resumed_at`, logged at the checkpoint's step) drops the points logged before it at later
    steps; a step logged again keeps its newest value and drops the earlier-logged ones after it."""
    kept: list[Metric] = []
    in_time_order = sorted([(r.timestamp, 0, r) for r in resumes] + [(p.timestamp, 1, p) for p in points],
                           key=lambda event: event[:2])
    for _, is_point, item in in_time_order:
        while kept and (kept[-1].step >= item.step if is_point else kept[-1].step > item.step):
            kept.pop()
        if is_point:
            kept.append(item)
    return kept


def load_curve(client: MlflowClient, run: Run, metric: str) -> Curve | None:
    history = client.get_metric_history(run.info.run_id, metric)
    if not history:
        return None
    kept = newest_attempt(history, client.get_metric_history(run.info.run_id, metric_names.RUN_RESUMED_AT))
    start_ms = run.info.start_time
    return Curve(
        run.info.run_id,
        np.array([point.step for point in kept], float),
        np.array([(point.timestamp - start_ms) / 1000.0 for point in kept]),
        np.array([point.value for point in kept]),
    )


def aggregate(curves: list[Curve], axis: str) -> dict[str, list[float]]:
    """Median and min/max over seeds on a shared grid (each curve held at its last value past its end)."""
    xs = [getattr(c, axis) for c in curves]
    grid = np.linspace(0.0, max(x.max() for x in xs), GRID_POINTS)
    start = max(x.min() for x in xs)
    grid = grid[grid >= start]
    stacked = np.stack([np.interp(grid, getattr(c, axis), c.values) for c in curves])
    return {"x": grid.tolist(), "median": np.median(stacked, 0).tolist(),
            "low": stacked.min(0).tolist(), "high": stacked.max(0).tolist()}


def html_table(rows: list[dict]) -> str:
    if not rows:
        return "<p>none</p>"
    headers = list(rows[0])
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_fmt(row.get(h)))}</td>" for h in headers) + "</tr>" for row in rows
    )
    return f"<table><tr>{''.join(f'<th>{html.escape(h)}</th>' for h in headers)}</tr>{body}</table>"


def write_html(path: Path, title: str, png: bytes, tables: dict[str, list[dict]], data: dict, runs: list[Run]) -> None:
    sections = "".join(f"<h2>{html.escape(name)}</h2>{html_table(rows)}" for name, rows in tables.items())
    run_list = "".join(
        f"<li>{html.escape(run.info.run_name or '')} <code>{run.info.run_id}</code> ({run.info.status})</li>"
        for run in runs
    )
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}</style></head>
<body><h1>{html.escape(title)}</h1>
<img alt="learning curves" src="data:image/png;base64,{base64.b64encode(png).decode()}">
{sections}
<h2>Runs</h2><ul>{run_list}</ul>
<script type="application/json" id="curves">{html.escape(json.dumps(data))}</script>
</body></html>
"""
    path.write_text(page)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)
