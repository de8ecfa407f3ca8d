"""Timing the aa-ray training loop from outside: a Trainer subclass that stamps every iteration,
plus starting the embedded Ray once per benchmark process (so Ray's start-up is not timed).

Throughput is measured over the *learning phase*: from the end of the iteration at which the
env-step counter first reaches `warm_up_steps` to the end of the last iteration, minus the time
spent in evaluations (the Trainer always evaluates once at the end). Actor start-up, the
warm-up (random-action) phase, the final checkpoint and the teardown are outside the window.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any

import ray

from aa_ray.runtime.trainer import Trainer
from aa_ray.spec.experiment import ExperimentSpec


def start_ray(spec: ExperimentSpec) -> None:
    """What `aa_ray.runtime.cluster.connect` does for an embedded Ray, done ahead of the Trainer
    (which then reuses it: `connect` returns False when Ray is already initialised)."""
    if ray.is_initialized():
        return
    needed = sum(bundle.get("CPU", 0) for bundle in spec.bundles())
    ray.init(
        num_cpus=max(math.ceil(needed), os.cpu_count() or 1),
        include_dashboard=False,
        runtime_env={"env_vars": {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}},
        log_to_driver=False,
    )


class TimedTrainer(Trainer):
    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.stamps: list[tuple[float, int]] = []  # (perf_counter after the iteration, env steps)
        self.eval_spans: list[tuple[float, float]] = []

    def _log(self, metrics: dict[str, float], step: int) -> None:
        super()._log(metrics, step)  # MLflow (when tracking) is part of the iteration's time
        self.stamps.append((time.perf_counter(), step))

    def _evaluate(self) -> dict[str, float]:
        start = time.perf_counter()
        try:
            return super()._evaluate()
        finally:
            self.eval_spans.append((start, time.perf_counter()))

    def learning_rate(self) -> dict[str, float]:
        return learning_phase(self.stamps, self.spec.algo.warm_up_steps, self.eval_spans)


def learning_phase(stamps: list[tuple[float, int]], warm_up: int,
                   excluded: list[tuple[float, float]] = ()) -> dict[str, float]:
    """env steps/s between the first stamp with steps >= warm_up and the last stamp, with the
    `excluded` (start, end) spans inside that window taken out."""
    t0, s0 = next((t, s) for t, s in stamps if s >= warm_up)
    t1, s1 = stamps[-1]
    skipped = sum(min(e, t1) - max(b, t0) for b, e in excluded if e > t0 and b < t1)
    seconds = t1 - t0 - skipped
    return {"steps": s1 - s0, "seconds": seconds, "steps_per_s": (s1 - s0) / seconds}


def trainer_overrides(budget: int, warm_up: int, train_every: int | None, output_dir: Path) -> list[str]:
    """Pendulum spec, 256x256 nets, batch 256, UTD 1; one evaluation (at the end, excluded)."""
    overrides = [
        f"budget.env_steps={budget}",
        f"algo.warm_up_steps={warm_up}",
        "algo.batch_size=256",
        "algo.utd_ratio=1",
        "algo.buffer_size=100000",
        "algo.hidden_dims=[256, 256]",
        f"eval.every_env_steps={100 * budget}",
        "eval.episodes=1",
        f"checkpoint.every_env_steps={100 * budget}",
        "checkpoint.save_replay=false",
        f"runtime.output_dir={output_dir}",
    ]
    if train_every is not None:
        overrides.append(f"algo.train_every={train_every}")
    return overrides
