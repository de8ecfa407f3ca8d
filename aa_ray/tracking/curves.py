"""What both reports are made of: a run's learning curve read from MLflow (the newest attempt of a
resumed run) against env steps and against the run's own wall-clock time, curves aggregated over
seeds, when a run reached a value, which runs shared a machine, and the self-contained HTML page.

A run's time is read from its metrics' timestamps (when each was logged), in minutes since the
MLflow run was created, less the time it was stopped: a resumed run's clock skips from the last
point its interrupted attempt logged (any `env/steps` or curve point; the driver logs `env/steps`
with every metrics batch, every few seconds) to its resume marker (`run/resumed_at`). The work an
interrupted attempt did past its checkpoint, redone after the resume, counts: the run spent it.
The trainer's own time metrics cannot give this clock: `time/<phase>_s` phases overlap (they say
how busy each part was, not the wall time) and `env/steps_per_s` is a windowed rate.

When a run reached a value X (`reached`, the "to reach X" columns): at the first evaluation taken
after its first gradient update (the first step its `learner/gradient_updates` is above 0) whose
value, with the next `HOLD_EVALS - 1` evaluations' (fewer at the end of the run), has a median at
or past X. An evaluation before learning scores the policy as initialised: on Ant its alive bonus
beats what 50k steps of training return, so counting it would say the run reached X before it
learned anything, and one lucky evaluation is not a score the run holds. A run that never logged
`learner/gradient_updates` (a contender from before it was logged) has all its evaluations counted,
and the report says so (`REACH_RULE`)."""

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
HOLD_EVALS = 3  # X is reached where the median of an evaluation and the next two is at or past it
REACH_RULE = (f"A run reaches X at its first evaluation after its first gradient update where the median of "
              f"that evaluation and the next {HOLD_EVALS - 1} (fewer at the run's end) is at or past X; "
              "evaluations of the untrained policy do not count.")
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
    # env steps of its first gradient update; inf: it never learned; None: the run did not log it
    learning_from: float | None = None

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
        learning_from(client.get_metric_history(run.info.run_id, metric_names.LEARNER_GRADIENT_UPDATES)),
    )


def learning_from(gradient_updates: Sequence[Metric]) -> float | None:
    """The env steps at which the run's learner count first rose above 0 (inf when it never did;
    None when the run logged no count)."""
    if not gradient_updates:
        return None
    learned = [point.step for point in gradient_updates if point.value > 0]
    return float(min(learned)) if learned else float("inf")


def reached(curve: Curve, target: float, axis: str = "minutes", mode: str = "max") -> float | None:
    """The `axis` value (minutes or steps) at which the curve reached `target` for good (see the
    module's doc: after learning started, held by the median of the next evaluations); None if never.
    `mode` max: at or above the target; min: at or below it."""
    xs, values = getattr(curve, axis), curve.values
    counted = np.ones(len(values), bool) if curve.learning_from is None else curve.steps >= curve.learning_from
    for index in np.flatnonzero(counted):
        held = float(np.median(values[index:index + HOLD_EVALS]))
        if held >= target if mode == "max" else held <= target:
            return float(xs[index])
    return None


def untrained_return(curves: Sequence[Curve]) -> float | None:
    """The median over the curves' evaluations taken before their first gradient update (the policy
    as initialised, which warm-up steps do not change); None when no run evaluated before learning."""
    before = [c.values[c.steps < c.learning_from] for c in curves if c.learning_from is not None]
    pooled = np.concatenate(before) if before else np.array([])
    return float(np.median(pooled)) if pooled.size else None


def reach_columns(curves: Sequence[Curve], target: float, mode: str = "max") -> dict[str, Any]:
    """A group's "to reach X" columns: median minutes and env steps over its runs (a run that never
    reached X counting as later than any that did), how many reached it, the untrained policy's
    return, and a note when X is no better than that return, or a run's learning start is unknown."""
    minutes = median_reached([reached(c, target, "minutes", mode) for c in curves])
    steps = [reached(c, target, "steps", mode) for c in curves]
    untrained = untrained_return(curves)
    notes = []
    if untrained is not None and (untrained >= target if mode == "max" else untrained <= target):
        notes.append(f"X is no better than the untrained policy's {untrained:.4g}: reaching it says little about "
                     "learning")
    if any(c.learning_from is None for c in curves):
        notes.append("a run logged no learner/gradient_updates: its evaluations before learning count too")
    return {"minutes_to_reach_X": NOT_REACHED if minutes is None else minutes,
            "env_steps_to_reach_X": NOT_REACHED if (s := median_reached(steps)) is None else s,
            "reached": f"{sum(s is not None for s in steps)}/{len(steps)}",
            "untrained_return": untrained, "note": "; ".join(notes)}


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
