"""What both reports are made of: a run's learning curve read from MLflow (the newest attempt of a
resumed run) against env steps and against the run's own wall-clock time, curves aggregated over
seeds, time to reach a value, which runs shared a machine, and the self-contained HTML page.

A run's time is read from its metrics' timestamps (when each was logged), in minutes since the
MLflow run was created, less the time it was stopped: a resumed run's clock skips from the last
point its interrupted attempt logged (any `env/steps` or curve point; the driver logs `env/steps`
with every metrics batch, every few seconds) to its resume marker (`run/resumed_at`). The work an
interrupted attempt did past its checkpoint, redone after the resume, counts: the run spent it.
The trainer's own time metrics cannot give this clock: `time/<phase>_s` phases overlap (they say
how busy each part was, not the wall time) and `env/steps_per_s` is a windowed rate."""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from mlflow.entities import Metric, Run
from mlflow.tracking import MlflowClient

from aa_ray import metric_names
from aa_ray.tracking.machine import CPU_COUNT_TAG, CPU_TAG, HOST_TAG

GRID_POINTS = 200
NOT_REACHED = "not reached"
Interval = tuple[float, float]  # wall-clock milliseconds, start and end


class ReportError(ValueError):
    """No runs to report, or a metric none of them has; the message says which."""


@dataclass
class Curve:
    run_id: str
    steps: np.ndarray  # env steps of each evaluation
    seconds: np.ndarray  # the run's own wall-clock seconds since it started, without the time it was stopped
    values: np.ndarray
    running: list[Interval] = field(default_factory=list)  # when it ran (the stops left out)

    @property
    def minutes(self) -> np.ndarray:
        return self.seconds / 60.0


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


def stopped_gaps(logged_ms: Sequence[float], resumes_ms: Sequence[float], start_ms: float) -> list[Interval]:
    """When a resumed run was stopped: from the last point logged before each resume marker (the
    previous marker, or the run's start, when nothing was logged since) to the marker."""
    logged = np.sort(np.asarray(logged_ms, float))
    gaps, since = [], float(start_ms)
    for resume in sorted(resumes_ms):
        before = logged[(logged < resume) & (logged >= since)]
        gaps.append((float(before[-1]) if before.size else since, float(resume)))
        since = float(resume)
    return gaps


def running_seconds(timestamps_ms: Sequence[float], start_ms: float, gaps: Sequence[Interval]) -> np.ndarray:
    """Seconds from the run's start to each timestamp, less the parts of the gaps before it."""
    t = np.asarray(timestamps_ms, float)
    stopped = sum((np.clip(t - begin, 0.0, end - begin) for begin, end in gaps), np.zeros_like(t))
    return (t - start_ms - stopped) / 1000.0


def running_intervals(start_ms: float, end_ms: float, gaps: Sequence[Interval]) -> list[Interval]:
    """The run's time from start to end split at its stops."""
    edges = [float(start_ms), *(edge for gap in sorted(gaps) for edge in gap), float(end_ms)]
    return [(a, b) for a, b in zip(edges[::2], edges[1::2], strict=True) if b > a]


def load_curve(client: MlflowClient, run: Run, metric: str) -> Curve | None:
    history = client.get_metric_history(run.info.run_id, metric)
    if not history:
        return None
    resumes = client.get_metric_history(run.info.run_id, metric_names.RUN_RESUMED_AT)
    kept = newest_attempt(history, resumes)
    # every logged point shows the run was running then: the curve's own and the driver's env/steps
    logged = [p.timestamp for p in history] + [
        p.timestamp for p in client.get_metric_history(run.info.run_id, metric_names.ENV_STEPS)]
    start_ms = run.info.start_time
    gaps = stopped_gaps(logged, [r.timestamp for r in resumes], start_ms)
    end_ms = max([run.info.end_time or 0, *logged])  # a run killed outright has no end time
    return Curve(
        run.info.run_id,
        np.array([point.step for point in kept], float),
        running_seconds([point.timestamp for point in kept], start_ms, gaps),
        np.array([point.value for point in kept]),
        running_intervals(start_ms, end_ms, gaps),
    )


def first_reached(xs: np.ndarray, values: np.ndarray, target: float, mode: str = "max") -> float | None:
    """The x of the first point at or past `target` (above it for `max`, below for `min`); None if none is."""
    reached = values >= target if mode == "max" else values <= target
    return float(xs[np.argmax(reached)]) if reached.any() else None


def median_reached(firsts: Sequence[float | None]) -> float | None:
    """The median over seeds of when each first reached a value, a seed that never did counting as
    later than any that did: None (not reached) when fewer than half reached it."""
    if not firsts:
        return None
    median = float(np.median([np.inf if x is None else x for x in firsts]))
    return median if np.isfinite(median) else None


def running_at(moment: float, intervals: Sequence[Interval]) -> bool:
    return any(begin <= moment < end for begin, end in intervals)


def most_at_once(own: Sequence[Interval], everyone: Sequence[Sequence[Interval]]) -> int:
    """The most runs of `everyone` (this one among them) running at one moment of this run's time."""
    # the count only rises where an interval starts: the most is at one of those starts
    moments = [begin for intervals in everyone for begin, _ in intervals if running_at(begin, own)]
    return max((sum(running_at(moment, other) for other in everyone) for moment in moments), default=1)


def runs_at_once(runs: Sequence[Run], curves: Sequence[Curve]) -> dict[str, int]:
    """Per run id: the most runs of these, on its host, that ran at the same moment as it."""
    host_of = {run.info.run_id: run.data.tags.get(HOST_TAG, "") for run in runs}
    by_host: dict[str, list[list[Interval]]] = {}
    for curve in curves:
        by_host.setdefault(host_of.get(curve.run_id, ""), []).append(curve.running)
    return {c.run_id: most_at_once(c.running, by_host[host_of.get(c.run_id, "")]) for c in curves}


def machine_note(runs: Sequence[Run], at_once: dict[str, int]) -> str:
    """One line: the CPUs the runs ran on (their tags) and the most that shared a machine at once."""
    cpus: dict[str, int] = {}
    for run in runs:
        tags = run.data.tags
        name = f"{tags[CPU_TAG]} ({tags.get(CPU_COUNT_TAG, '?')} CPUs)" if CPU_TAG in tags else "not recorded"
        cpus[name] = cpus.get(name, 0) + 1
    where = "; ".join(f"{name}: {count} run{'s' * (count != 1)}" for name, count in sorted(cpus.items()))
    return (f"CPU: {where}. Runs at once on one machine: up to {max(at_once.values(), default=1)} "
            "(from the runs' own start, stop and resume times). Time is each run's own wall-clock "
            "since its MLflow run was created, the time it was stopped left out.")


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


def write_html(path: Path, title: str, pngs: Sequence[bytes], tables: dict[str, list[dict]], data: dict,
               runs: list[Run], notes: Sequence[str] = ()) -> None:
    figures = "".join(f'<img alt="learning curves" src="data:image/png;base64,{base64.b64encode(png).decode()}">'
                      for png in pngs)
    paragraphs = "".join(f"<p>{html.escape(note)}</p>" for note in notes)
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
{paragraphs}
{figures}
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
