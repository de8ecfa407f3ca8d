"""The driver: compiles a spec into an actor graph and runs a training loop on it.

    Trainer.run
      env dims, prior data, resume checks   # before Ray starts: bad input fails in seconds
      ActorGraph                            # the actors in their placement group (runtime/graph.py)
      loop.step() until the cadence stops   # sync, async, on-policy (runtime/loops.py)
        count, check health, log            # runtime/driver_state.py, runtime/health.py
        evaluate, checkpoint, report        # when due (runtime/cadence.py)
      final checkpoint, result

The trainer decides; its rooms do: `DriverState` (counters, cadence, recent episodes: what the driver
carries between iterations), `RunRecord` (MLflow, events, progress, video, trace: what the run
leaves for people), `RunCheckpoints` (writing and loading the run's checkpoints) and `Recovery`
(runner restarts told, the graph rebuilt after a learner or the replay actor died).

Faults: a runner that dies or raises is replaced in its bundle (up to `runtime.max_runner_restarts`);
the event is printed, logged as `runtime/runner_restarts` and written to the run's events.jsonl.
A learner or the replay actor that dies (killed, out of memory, its node gone) takes the whole actor
graph back to the last checkpoint: every actor is replaced in the same bundles, the checkpoint's
learner, replay, runner and driver state is loaded, and the run goes on in the same MLflow run (up
to `runtime.max_learner_restarts`; logged as `runtime/graph_restarts` and an event). A learner that
raises ends the run with an error naming the last checkpoint to resume from. A lost node (its raylet
ended) is the two at once for the actors it held: once Ray has declared it dead and re-placed its
bundles on the surviving nodes, its runners are replaced there, and a learner or the replay lost
with it takes the graph back to the last checkpoint; a `node_lost` event names the node and those
actors. A lost node so costs at most the env steps since the last checkpoint.

Checkpoints hold everything the next iteration depends on (`save_checkpoint`), so in sync mode a
run resumed from one continues exactly as the uninterrupted run would have.

Inside a Tune trial (`aa_ray.tune`) the actors go into the trial's own placement group, and a
`reporter` hands each evaluation and checkpoint to Tune.

`runtime.backend: inline` runs the same actor graph in this process (`aa_ray.runtime.inline`):
Ray is neither started nor imported, and MLflow is imported only when the run is tracked.

RLPD (`algo.prior_data` set): the dataset is validated against the spec's env before Ray starts;
learning still starts once `warm_up_steps` online transitions are stored (`loops.learning_started`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aa_ray import metric_names as m
from aa_ray.algos.contract import TrainingSetup
from aa_ray.data.mlflow_inputs import log_prior_data
from aa_ray.data.sources import checked_prior_data
from aa_ray.envs import env_dims
from aa_ray.envs.symmetry import sym_aug_mirror
from aa_ray.records import Checkpoint, ObsDims, RunOutcome
from aa_ray.runtime import cluster
from aa_ray.runtime.cadence import BUDGET, PREEMPTED, STOPPED_BY_CALLBACK
from aa_ray.runtime.checkpoint import verify_resume
from aa_ray.runtime.counters import Counters
from aa_ray.runtime.device_loop import DeviceLoop
from aa_ray.runtime.driver_state import DriverState
from aa_ray.runtime.families import family_of
from aa_ray.runtime.graph import ActorGraph
from aa_ray.runtime.health import HealthChecks
from aa_ray.runtime.learner import planned_fleet_steps
from aa_ray.runtime.loops import Iteration, make_loop
from aa_ray.runtime.metrics import RunMetrics, run_tag
from aa_ray.runtime.phases import Phases
from aa_ray.runtime.recovery import Recovery
from aa_ray.runtime.remote import ActorLost, LearnerFailed, TrainingError
from aa_ray.runtime.run_checkpoints import RunCheckpoints, run_folder_of
from aa_ray.runtime.run_record import RunRecord, resumed_runs
from aa_ray.runtime.stop_signals import StopSignals
from aa_ray.spec.experiment import ExperimentSpec
from aa_ray.spec.loader import spec_hash
from aa_ray.spec.local_checks import check_stop_metric

if TYPE_CHECKING:
    from aa_ray.tracking.tracker import RunContext

# Called after each evaluation and checkpoint with the iteration's metrics and the checkpoint folder
# written at that point (None if none was); a Tune trial reports both to Tune with it, the Python
# API hands them to its callbacks. A true return value stops the run (after its final checkpoint).
Reporter = Callable[[dict[str, float], Path | None], bool | None]


@dataclass(frozen=True)
class IterationDone:
    """One iteration over (logged, evaluated and checkpointed when due), as `Trainer.on_iteration`'s
    listeners hear it; benchmarks time the training loop with it. A listener runs on the driver
    between two iterations, so whatever it does is part of the run's time."""

    env_steps: int  # the run's env steps after this iteration
    learned: bool  # a learner update came back with it (the first such iteration: learning started)
    ended_at: float  # time.perf_counter() at its end
    metrics: Mapping[str, float]  # what was logged for it; time/<phase>_s holds the driver's phases
    checkpoint: Path | None  # the checkpoint written at its end, if one was


class Trainer:
    def __init__(
        self,
        spec: ExperimentSpec,
        run_dir: Path | None = None,
        resume: Checkpoint | None = None,
        track: bool | None = None,
        live: bool | None = None,
        context: RunContext | None = None,
        reporter: Reporter | None = None,
        resume_without_replay: bool = False,
    ):
        self.spec = spec
        self.resume = resume
        # the user chose to resume with an empty buffer: the checkpoint's replay file is not read
        self.resume_without_replay = resume_without_replay
        self.resumed_elsewhere = False  # from a checkpoint outside a run folder: into a new one
        self.reporter = reporter
        if resume is not None and run_dir is None:
            # a checkpoint outside a run folder (copied elsewhere) starts a new folder, so that nothing
            # next to it (a ./checkpoints/final, say) is written over
            run_dir = run_folder_of(resume.folder)
            self.resumed_elsewhere = run_dir is None
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        self.run_dir = run_dir or Path(spec.runtime.output_dir) / f"{spec.name}-{spec_hash(spec)[:8]}-{stamp}"
        self.phases = Phases(trace=spec.runtime.trace)  # where the time goes (time/* metrics, trace.json)
        self.state = DriverState.fresh(spec, reports=reporter is not None)
        self.record = RunRecord(spec, self.run_dir, self.phases, spec.tracking.enabled if track is None else track,
                                live, context)
        self.stop_signals = StopSignals(spec.runtime.stop_grace_s)
        self.checkpoints = RunCheckpoints(spec, self.run_dir, self.phases, writing=self.stop_signals.writing)
        self.health = HealthChecks(spec)
        self.metrics = RunMetrics(run_tag(spec))  # Ray metrics from the driver (Grafana)
        self.graph: ActorGraph | None = None  # made by run(), with its recovery
        self.recovery: Recovery | None = None
        self.last_metrics: dict[str, float] = {}
        self.video_unavailable = False  # set once rendering failed (eval.video)
        self.on_iteration: list[Callable[[IterationDone], None]] = []  # told at the end of every iteration

    @property
    def reports(self) -> bool:
        """A Tune trial's or the API's run: a `reporter` hears each evaluation and checkpoint."""
        return self.reporter is not None

    # what tests and tools watch while a run goes on
    @property
    def counters(self) -> Counters:
        return self.state.counters

    @property
    def last_checkpoint(self) -> Path | None:
        return self.checkpoints.last

    @property
    def graph_restarts(self) -> int:
        return self.recovery.graph_restarts if self.recovery else 0

    @property
    def learners(self) -> list[Any]:
        return self.graph.learners if self.graph else []

    @property
    def runners(self) -> list[Any]:
        return self.graph.runners if self.graph else []

    @property
    def runner_restarts(self) -> int:
        return self.graph.runner_restarts if self.graph else 0

    @property
    def replay_size(self) -> int:
        return self.graph.replay_size if self.graph else 0

    # ---- the run -------------------------------------------------------------------------------
    def run(self) -> RunOutcome:
        obs, act_dim = env_dims(self.spec)  # a spec whose env cannot be made stops here
        check_stop_metric(self.spec)  # so does a budget.stop_at metric its evaluations never produce
        sym_aug_mirror(self.spec, obs, act_dim)  # so does a mirror that does not fit the env's kwargs
        prior_path = checked_prior_data(self.spec, obs, act_dim)  # so does a dataset that does not fit it
        replay_table = self._check_resume(obs, act_dim) if self.resume is not None else None
        self.checkpoints.check_writable()  # so does an output folder it could not write to
        # inline actors live in this process: no Ray to start or join
        started_ray = self.spec.runtime.backend == "ray" and cluster.connect(self.spec)
        status, reason = "FAILED", None
        # installed after Ray's own SIGTERM handler (ray.init's), which exits at once
        with self.stop_signals.installed():
            try:
                self.graph = ActorGraph(self.spec, obs, act_dim, prior_path)
                self.recovery = Recovery(self.spec, self.graph, self.checkpoints, self.record)
                self.graph.start()
                if self.resume is not None:
                    self.state = self.checkpoints.restore(self.resume, replay_table, self.graph, self.reports)
                else:
                    self.graph.queue_prior_stats()
                self.graph.publish_weights()
                self.record.start(resumed_runs(self.resume))
                if prior_path is not None:  # the run page's Datasets panel names what it trained from
                    log_prior_data(self.record, prior_path)
                if self.resume is not None:  # so reports leave out what the interrupted attempt logged past it
                    self.record.log({m.RUN_RESUMED_AT: float(self.counters.env_steps)}, self.counters.env_steps)
                if self.resumed_elsewhere:
                    self.record.event("resumed_in_new_run_folder", self.counters.env_steps,
                                      checkpoint=str(self.resume.folder), reason="not inside a run folder")
                if self.resume is not None and self.resume_without_replay and self.spec.algo.replay_actor:
                    # the resumed run no longer repeats the stopped one: its record says why
                    self.record.event("resumed_without_replay", self.counters.env_steps,
                                      checkpoint=str(self.resume.folder),
                                      replay_rows_left_out=self.resume.replay_rows or 0)
                with self.record.showing_progress():
                    stop_reason = self._train()
                    final = self.last_checkpoint if stop_reason == PREEMPTED else self._final_checkpoint(stop_reason)
                result = self._finish(stop_reason, final)
                if stop_reason == PREEMPTED:
                    status, reason = "KILLED", (f"stopped by {self.stop_signals.received} at "
                                                f"{self.counters.env_steps} env steps; checkpoint {final}")
                else:
                    status = "FINISHED"
                return result
            except (KeyboardInterrupt, SystemExit) as err:  # SystemExit: Tune stopping a trial (sweep stopped, ASHA)
                status = "KILLED"
                reason = f"interrupted ({err!r}); last checkpoint {self.last_checkpoint}"
                raise
            finally:
                self.record.close(status, cluster.timeline(self.spec) if self.spec.runtime.trace else None, reason)
                if self.graph is not None:
                    self.graph.close()
                cluster.disconnect(started_ray)

    def _train(self) -> str:
        """Iterate until the cadence stops the run; a learner or the replay actor that dies takes
        the actor graph back to the last checkpoint, and the loop starts again from there."""
        while self.counters.env_steps < self.spec.budget.env_steps:
            try:
                make = DeviceLoop if self.spec.runtime.mode == "device" else make_loop
                loop = make(self.spec, self.graph, self.counters.env_steps)
                while (stop_reason := self._end_of_iteration(loop.step())) is None:
                    pass
                return stop_reason
            except ActorLost as lost:
                self.state = self.recovery.rebuild_graph(str(lost), self.state, self.reports)
            except LearnerFailed as err:
                raise TrainingError(f"{err}; {self.checkpoints.resume_hint()}") from None
        return BUDGET  # resumed from a checkpoint at the budget

    def _end_of_iteration(self, it: Iteration) -> str | None:
        """Count the iteration and log it; evaluate, checkpoint and report when due. The stop
        reason once the run is over."""
        self.recovery.report_runner_restarts(self.counters.env_steps)
        self.counters.count(it)
        self.state.window.count(it)
        self.phases.count(it.chunks, it.learner)
        metrics = {**(it.learner.metrics if it.learner else {}), **it.loop_metrics}
        hint = self.checkpoints.resume_hint()
        if it.learner is not None and (q_exploding := self.health.check(metrics, hint)):
            self.record.event("q_exploding", self.counters.env_steps, **q_exploding)
        metrics |= self._run_metrics()
        env_steps = self.counters.env_steps
        due = self.state.cadence.due(env_steps)
        evaluation = self._evaluate() if due.evaluate else None
        outcome = self.state.cadence.outcome(env_steps, due, evaluation)
        metrics |= (evaluation or {}) | self.phases.take()
        self.record.show(env_steps, metrics)
        self.last_metrics = metrics
        checkpoint = self.save_checkpoint(f"step_{env_steps:09d}") if outcome.checkpoint else None
        if checkpoint is not None:
            self.record.message(f"checkpoint: {checkpoint}")
        done = IterationDone(env_steps, it.learner is not None, time.perf_counter(), metrics, checkpoint)
        for listener in self.on_iteration:
            listener(done)
        if outcome.report and self.reporter(metrics, checkpoint):
            return STOPPED_BY_CALLBACK
        if self.stop_signals.received and outcome.stop_reason is None:
            return self._stop_on_signal(checkpoint)
        return outcome.stop_reason

    def _stop_on_signal(self, checkpoint: Path | None) -> str:
        """A stop signal arrived before this iteration ended, which went as any other (so a resume
        from its checkpoint continues exactly as the uninterrupted run): its checkpoint, and stop."""
        env_steps = self.counters.env_steps
        checkpoint = checkpoint or self.save_checkpoint(f"step_{env_steps:09d}")
        self.record.event("preempted", env_steps, signal=self.stop_signals.received, checkpoint=str(checkpoint),
                          seconds_to_spare=round(self.stop_signals.seconds_left(), 1))
        return PREEMPTED

    def _run_metrics(self) -> dict[str, float]:
        """The counters, the replay's fill and the window's averages."""
        metrics: dict[str, float] = {m.ENV_STEPS: self.counters.env_steps, m.ENV_EPISODES: self.counters.episodes}
        if self.graph.replays:
            size = self.graph.replay_size
            metrics |= {m.REPLAY_SIZE: size, m.REPLAY_FILL: size / self.spec.algo.buffer_size}
        if self.graph.prior_info is not None:
            metrics[m.REPLAY_PRIOR_SIZE] = self.graph.prior_info.rows
        metrics |= self.state.window.metrics()
        if m.RUNTIME_POLICY_LAG_MEAN in metrics:
            self.metrics.set("aa_ray_policy_lag", metrics[m.RUNTIME_POLICY_LAG_MEAN])
        if m.TRAIN_EPISODE_RETURN in metrics:
            self.metrics.set("aa_ray_episode_return", metrics[m.TRAIN_EPISODE_RETURN])
        return metrics

    def _evaluate(self) -> dict[str, float]:
        with self.phases.timed(m.PHASE_EVAL):
            evaluation = self.graph.evaluate(self.spec.eval.episodes)
        # the evaluating runner died: its replacement evaluated
        self.recovery.report_runner_restarts(self.counters.env_steps)
        if self.spec.eval.video and not self.video_unavailable:
            self._record_video()
        evaluation[m.EVAL_AT_ENV_STEPS] = float(self.counters.env_steps)
        self.record.evaluated(evaluation, self.counters.env_steps, self.graph.weights[0])
        self.counters.evals.append(evaluation)
        self.metrics.set("aa_ray_eval_return", evaluation[m.EVAL_RETURN])
        return evaluation

    def _record_video(self) -> None:
        video, problem = self.graph.record_video(self.spec.eval.video_max_frames)
        if video is None:  # no GL backend here: say so once, keep training
            self.video_unavailable = True
            self.record.event("video_unavailable", self.counters.env_steps, reason=problem)
            return
        self.record.video(self.counters.env_steps, video)

    def save_checkpoint(self, name: str) -> Path:
        """The run's checkpoint `name` (see `RunCheckpoints.save`); every metric logged before it is
        stored, so a crash after it loses none."""
        folder = self.checkpoints.save(name, self.graph, self.state, self.record.tracking_runs)
        self.record.flush()
        return folder

    def _final_checkpoint(self, stop_reason: str) -> Path:
        final = self.save_checkpoint("final")
        last_eval = self.counters.evals[-1] if self.counters.evals else {}
        self.record.message(
            f"done ({stop_reason}) at {self.counters.env_steps:,} env steps; last eval "
            + ", ".join(f"{key} {value:.4g}" for key, value in last_eval.items()) + f"\ncheckpoint: {final}"
        )
        return final

    def _finish(self, stop_reason: str, final: Path) -> RunOutcome:
        self.record.final_checkpoint(final)
        if self.reporter is not None and stop_reason != PREEMPTED:
            self.reporter({**self.last_metrics, m.RUN_FINISHED: 1.0}, final)
        prior = self.graph.prior_info
        return RunOutcome(
            env_steps=self.counters.env_steps, evals=self.counters.evals, stop_reason=stop_reason,
            checkpoint=final, run_dir=self.run_dir, mlflow_run_id=self.record.mlflow_run_id,
            mlflow_url=self.record.mlflow_url, tracking_runs=dict(self.record.tracking_runs),
            replay_size=self.graph.replay_size, prior_size=prior.rows if prior else 0,
            runner_restarts=self.graph.runner_restarts, graph_restarts=self.graph_restarts,
        )

    # ---- before Ray starts -----------------------------------------------------------------------
    def _check_resume(self, obs: ObsDims, act_dim: int) -> Any:
        """Check the checkpoint's learner state and replay file against the spec before any actor
        starts (CheckpointError naming the file otherwise); returns the replay table, if it has one."""
        setup = TrainingSetup.on_cpu(planned_steps=planned_fleet_steps(self.spec))
        mirror = sym_aug_mirror(self.spec, obs, act_dim)
        algorithm = family_of(self.spec).build(self.spec.algo, obs, act_dim, setup, mirror)
        return verify_resume(self.resume, self.spec, algorithm, obs.full, act_dim, self.resume_without_replay)
