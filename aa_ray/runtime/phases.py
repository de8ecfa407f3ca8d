"""Where a run's time goes: seconds per phase of each logged iteration, as `time/<phase>_s` metrics,
and with `runtime.trace` a Chrome-trace file of the run (open it in https://ui.perfetto.dev).

Phases are timed where they run. The actors time their own calls and send the numbers back with
their results: an env runner its collection and its last weight load (`publish`), the replay actor
its sampling, a learner its update and how long the sampled batch took to reach it (`transfer`:
sampled on the replay's clock, received on the learner's, so across nodes it includes clock skew).
The driver times evaluation, checkpoints and MLflow logging itself. The phases overlap (runners
collect while learners update), so they do not add up to the wall time: each says how busy its
part of the graph was.

A trace holds the driver's phases as spans and Ray's own timeline of every actor call (when the
run is on Ray; an inline run has the driver's spans only)."""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from aa_ray import metric_names as m
from aa_ray.records import ChunkStats, LearnerReport

TRACE_FILE = "trace.json"


class Phases:
    def __init__(self, trace: bool):
        self.seconds: dict[str, float] = defaultdict(float)
        self.spans: list[dict[str, Any]] | None = [] if trace else None

    @contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        """Time a phase the driver runs itself."""
        wall, start = time.time(), time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - start
            self.seconds[phase] += elapsed
            if self.spans is not None:
                self.spans.append({"name": phase, "cat": "driver", "ph": "X", "ts": wall * 1e6, "dur": elapsed * 1e6,
                                   "pid": "aa-ray driver", "tid": "phases"})

    def count(self, chunks: list[ChunkStats], learner: LearnerReport | None) -> None:
        """The actors' timings of one iteration: runners in parallel (the slowest counts), the
        learner's update with the replay sample it trained on."""
        if chunks:
            self.seconds[m.PHASE_COLLECT] += max(stats.collect_s for stats in chunks)
            self.seconds[m.PHASE_PUBLISH] += max(stats.weights_s for stats in chunks)
        if learner is not None:
            self.seconds[m.PHASE_LEARNER_UPDATE] += learner.metrics.get(m.LEARNER_UPDATE_TIME_S, 0.0)
            for phase, seconds in learner.phases.items():
                self.seconds[phase] += seconds

    def take(self) -> dict[str, float]:
        """The seconds per phase since the last call, as metrics."""
        metrics = {f"time/{phase}_s": seconds for phase, seconds in self.seconds.items()}
        self.seconds.clear()
        return metrics

    def write_trace(self, folder: Path, ray_events: list[dict[str, Any]]) -> Path:
        """The driver's spans and Ray's timeline as one Chrome-trace JSON file."""
        path = folder / TRACE_FILE
        folder.mkdir(parents=True, exist_ok=True)
        events = [*ray_events, *(self.spans or [])]
        path.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
        return path
