"""Timing the aa-ray training loop from outside: a listener on the Trainer's public `on_iteration`
event that stamps every iteration, plus starting the embedded Ray once per benchmark process (so
Ray's start-up is not timed).

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
from dataclasses import dataclass
from pathlib import Path

import ray
from ray._private import ray_constants

from aa_ray import metric_names as m
from aa_ray.runtime.remote import TrainingError
from aa_ray.runtime.trainer import IterationDone, Trainer
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
        log_to_driver=False,
    )


def actor_niceness() -> int:
    """The niceness Ray gives worker processes here (asked of a throwaway actor)."""

    @ray.remote(num_cpus=0)
    def nice() -> int:
        return os.nice(0)

    return ray.get(nice.remote())


class LoopClock:
    """Listens to `Trainer.on_iteration` (the Trainer's public event) and keeps, per iteration, when
    it ended, the env steps, the seconds inside `Learner.update`, in evaluation and in the tracker
    (MLflow), and this (driver) process's CPU time, all its threads."""

    def __init__(self) -> None:
        self.stamps: list[Stamp] = []

    def __call__(self, done: IterationDone) -> None:
        metrics = done.metrics
        self.stamps.append(Stamp(
            done.ended_at, done.env_steps, metrics.get(m.LEARNER_UPDATE_TIME_S, 0.0),
            metrics.get(f"time/{m.PHASE_EVAL}_s", 0.0), metrics.get(f"time/{m.PHASE_TRACKING}_s", 0.0),
            time.process_time(),
        ))

    def learning_rate(self, warm_up: int) -> dict[str, float]:
        rate = learning_phase(self.stamps, warm_up)
        window = self.stamps[first_learning(self.stamps, warm_up):]
        # the tracker's seconds reach the metrics one iteration late (logging comes after them), so
        # the window's sum is its iterations' logging, shifted by one
        rate["log_s"] = sum(stamp.tracking_s for stamp in window[1:])
        rate["driver_cpu_s"] = window[-1].cpu_s - window[0].cpu_s  # includes evaluation and background threads
        return rate


@dataclass(frozen=True)
class Stamp:
    ended_at: float  # perf_counter
    env_steps: int
    update_s: float
    eval_s: float
    tracking_s: float
    cpu_s: float


def first_learning(stamps: Sequence[Stamp], warm_up: int) -> int:
    for index, stamp in enumerate(stamps):
        if stamp.env_steps >= warm_up:
            return index
    raise ValueError(f"no iteration reached the warm-up ({warm_up} env steps) in {len(stamps)} iterations: "
                     "the Trainer's on_iteration event did not fire, or the budget is below the warm-up")


def learning_phase(stamps: Sequence[Stamp], warm_up: int) -> dict[str, float]:
    """env steps/s between the end of the first iteration with steps >= warm_up and the end of the
    last one, with the evaluations inside that window taken out. Also: the iterations in the window
    and the seconds they spent inside `Learner.update` (as the learner measured them)."""
    first = first_learning(stamps, warm_up)
    if first == len(stamps) - 1:
        raise ValueError("the learning phase is empty: raise the budget above the warm-up by an iteration or more")
    window = stamps[first + 1:]
    seconds = stamps[-1].ended_at - stamps[first].ended_at - sum(stamp.eval_s for stamp in window)
    steps = stamps[-1].env_steps - stamps[first].env_steps
    return {
        "steps": steps, "seconds": seconds, "steps_per_s": steps / seconds,
        "iterations": len(window), "update_s": sum(stamp.update_s for stamp in window),
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
        trainer = Trainer(spec, live=False, track=track)
        clock = LoopClock()
        trainer.on_iteration.append(clock)
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
        return {**clock.learning_rate(spec.algo.warm_up_steps), "run_wall_s": total}
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
