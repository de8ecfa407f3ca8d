"""Timing the aa-ray training loop from outside: a Trainer subclass that stamps every iteration,
plus starting the embedded Ray once per benchmark process (so Ray's start-up is not timed).

Throughput is measured over the *learning phase*: from the end of the iteration at which the
env-step counter first reaches `warm_up_steps` to the end of the last iteration, minus the time
spent in evaluations (the Trainer always evaluates once at the end). Actor start-up, the
warm-up (random-action) phase, the final checkpoint and the teardown are outside the window.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import ray
from ray._private import ray_constants

from aa_ray.runtime.remote import TrainingError
from aa_ray.runtime.trainer import Trainer
from aa_ray.spec.experiment import ExperimentSpec


def start_ray(spec: ExperimentSpec, worker_niceness: int | None = None) -> None:
    """What `aa_ray.runtime.cluster.connect` does for an embedded Ray, done ahead of the Trainer
    (which then reuses it: `connect` returns False when Ray is already initialised).

    Ray starts its worker processes (so aa-ray's actors) at nice 15 by default; the benchmark's
    in-process contenders run at this process's niceness (normally 0). `worker_niceness` sets
    RAY_worker_niceness for a sensitivity check; None keeps Ray's default, as `aa-ray run` has it."""
    if ray.is_initialized():
        return
    if worker_niceness is not None:
        os.environ[ray_constants.RAY_WORKER_NICENESS] = str(worker_niceness)  # "RAY_worker_niceness"
    needed = sum(bundle.get("CPU", 0) for bundle in spec.bundles())
    ray.init(
        # "local": always a fresh instance of our own. With address=None, ray.init joins the
        # cluster named in /tmp/ray/ray_current_cluster when a `ray start` one is up on the machine.
        address="local",
        num_cpus=max(math.ceil(needed), os.cpu_count() or 1),
        include_dashboard=False,
        runtime_env={"env_vars": {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}},
        log_to_driver=False,
    )


def actor_niceness() -> int:
    """The niceness Ray gives worker processes here (asked of a throwaway actor)."""

    @ray.remote(num_cpus=0)
    def nice() -> int:
        return os.nice(0)

    return ray.get(nice.remote())


class TimedTrainer(Trainer):
    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        # (perf_counter after the iteration, env steps, seconds inside Learner.update that iteration)
        self.stamps: list[tuple[float, int, float]] = []
        self.eval_spans: list[tuple[float, float]] = []
        self.log_spans: list[tuple[float, float]] = []  # time inside the tracker (MLflow) calls
        self.cpu: list[float] = []  # this (driver) process's CPU time, all its threads, at each stamp

    def _log(self, metrics: dict[str, float], step: int) -> None:
        start = time.perf_counter()
        super()._log(metrics, step)  # MLflow (when tracking) is part of the iteration's time
        end = time.perf_counter()
        self.log_spans.append((start, end))
        self.stamps.append((end, step, metrics.get("learner/update_time_s", 0.0)))
        self.cpu.append(time.process_time())

    def _evaluate(self) -> dict[str, float]:
        start = time.perf_counter()
        try:
            return super()._evaluate()
        finally:
            self.eval_spans.append((start, time.perf_counter()))

    def learning_rate(self) -> dict[str, float]:
        rate = learning_phase(self.stamps, self.spec.algo.warm_up_steps, self.eval_spans)
        first = next(i for i, (_, s, _) in enumerate(self.stamps) if s >= self.spec.algo.warm_up_steps)
        t0 = self.stamps[first][0]
        rate["log_s"] = sum(e - b for b, e in self.log_spans if b >= t0)  # the driver's logging, in the window
        rate["driver_cpu_s"] = self.cpu[-1] - self.cpu[first]  # includes evaluation and background threads
        return rate


def learning_phase(stamps: Sequence[tuple[float, int, float]], warm_up: int,
                   excluded: Sequence[tuple[float, float]] = ()) -> dict[str, float]:
    """env steps/s between the first stamp with steps >= warm_up and the last stamp, with the
    `excluded` (start, end) spans inside that window taken out. Also: the iterations in the
    window and the seconds they spent inside `Learner.update` (as the learner measured them)."""
    first = next(i for i, (_, s, _) in enumerate(stamps) if s >= warm_up)
    t0, s0, _ = stamps[first]
    t1, s1, _ = stamps[-1]
    skipped = sum(min(e, t1) - max(b, t0) for b, e in excluded if e > t0 and b < t1)
    seconds = t1 - t0 - skipped
    return {
        "steps": s1 - s0, "seconds": seconds, "steps_per_s": (s1 - s0) / seconds,
        "iterations": len(stamps) - 1 - first, "update_s": sum(u for _, _, u in stamps[first + 1 :]),
    }


def trainer_overrides(budget: int, warm_up: int, train_every: int | None, output_dir: Path) -> list[str]:
    """Pendulum spec, 256x256 nets, batch 256, UTD 1; one evaluation (at the end, excluded)."""
    overrides = [
        f"budget.env_steps={budget}",
        f"algo.warm_up_steps={warm_up}",
        "algo.batch_size=256",
        "algo.utd_ratio=1",
        "algo.buffer_size=100000",
        "algo.actor_hidden_dims=[256, 256]", "algo.critic_hidden_dims=[256, 256]",
        f"eval.every_env_steps={100 * budget}",
        "eval.episodes=1",
        f"checkpoint.every_env_steps={100 * budget}",
        "checkpoint.save_replay=false",
        f"runtime.output_dir={output_dir}",
    ]
    if train_every is not None:
        overrides.append(f"algo.train_every={train_every}")
    return overrides


def run_timed(spec: ExperimentSpec, track: bool, quiet: bool = True, retries: int = 2) -> dict[str, float]:
    """One Trainer.run(); returns the learning-phase breakdown and the whole run()'s wall time.
    `quiet` hides the progress lines (they go to stderr). If the run fails because the local Ray
    went away (something on the machine ran `ray stop`, which stops every Ray instance there),
    Ray is restarted and the run repeated, up to `retries` times."""
    for attempt in range(retries + 1):
        trainer = TimedTrainer(spec, live=False, track=track)
        start = time.perf_counter()
        try:
            with contextlib.redirect_stderr(io.StringIO()) if quiet else contextlib.nullcontext():
                trainer.run()
        except TrainingError as err:
            if attempt == retries:
                raise
            print(f"  ! run failed ({str(err).splitlines()[0][:120]}); restarting Ray, repeating the run", flush=True)
            restart_ray(spec)
            continue
        total = time.perf_counter() - start
        return {**trainer.learning_rate(), "run_wall_s": total}
    raise AssertionError("unreachable")


def restart_ray(spec: ExperimentSpec, attempts: int = 3) -> None:
    for attempt in range(attempts):
        time.sleep(5.0)
        ray.shutdown()
        try:
            start_ray(spec)
            return
        except Exception as err:  # Ray raises several kinds here; retry all
            if attempt == attempts - 1:
                raise
            print(f"  ! Ray did not start ({type(err).__name__}); trying again", flush=True)
