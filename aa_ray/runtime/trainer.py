"""The driver: compiles a spec into an actor graph and runs a training loop on it.

    Trainer.run
      env dims, prior data, resume checks   # before Ray starts: bad input fails in seconds
      ActorGraph                            # the actors in their placement group (runtime/graph.py)
      loop.step() until the cadence stops   # sync, async, on-policy (runtime/loops.py)
        count, check health, log            # runtime/counters.py, runtime/health.py
        evaluate, checkpoint, report        # when due (runtime/cadence.py)
      final checkpoint, result

Faults: a runner that dies or raises is replaced in its bundle (up to `runtime.max_runner_restarts`);
the event is printed, logged as `runtime/runner_restarts` and written to the run's events.jsonl.
A learner or the replay actor that dies (killed, out of memory, its node gone) takes the whole actor
graph back to the last checkpoint: every actor is replaced in the same bundles, the checkpoint's
learner, replay, runner and driver state is loaded, and the run goes on in the same MLflow run (up
to `runtime.max_learner_restarts`; logged as `runtime/graph_restarts` and an event). A learner that
raises ends the run with an error naming the last checkpoint to resume from.

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

from collections import deque
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aa_ray import metric_names as m
from aa_ray.algos.contract import TrainingSetup
from aa_ray.data.dataset import checked_prior_data
from aa_ray.envs import env_dims
from aa_ray.envs.symmetry import sym_aug_mirror
from aa_ray.nets.policy import ObsDims
from aa_ray.records import NormMoments
from aa_ray.runtime import cluster
from aa_ray.runtime.cadence import BUDGET, STOPPED_BY_CALLBACK, Cadence, check_stop_metric
from aa_ray.runtime.checkpoint import (
    SPEC_FILE,
    STATE_FILE,
    load_checkpoint,
    read_replay,
    save_checkpoint,
    verify_resume,
)
from aa_ray.runtime.counters import RECENT_EPISODES, Counters, Window
from aa_ray.runtime.env_state import pack, unpack
from aa_ray.runtime.families import family_of
from aa_ray.runtime.graph import ActorGraph
from aa_ray.runtime.health import HealthChecks
from aa_ray.runtime.learner import planned_fleet_steps
from aa_ray.runtime.loops import Iteration, make_loop
from aa_ray.runtime.metrics import RunMetrics, run_tag
from aa_ray.runtime.phases import Phases
from aa_ray.runtime.progress import ProgressDisplay, task_metric
from aa_ray.runtime.remote import ActorLost, LearnerFailed, TrainingError
from aa_ray.runtime.run_files import EVENTS_FILE, write_event, write_video
from aa_ray.spec.experiment import ExperimentSpec
from aa_ray.spec.loader import spec_hash, spec_yaml

if TYPE_CHECKING:
    from aa_ray.tracking.mlflow_tracker import MlflowTracker, RunContext

# Called after each evaluation and checkpoint with the iteration's metrics and the checkpoint folder
# written at that point (None if none was); a Tune trial reports both to Tune with it, the Python
# API hands them to its callbacks. A true return value stops the run (after its final checkpoint).
Reporter = Callable[[dict[str, float], Path | None], bool | None]


class Trainer:
    def __init__(
        self,
        spec: ExperimentSpec,
        run_dir: Path | None = None,
        resume: dict[str, Any] | None = None,
        track: bool | None = None,
        live: bool | None = None,
        context: RunContext | None = None,
        reporter: Reporter | None = None,
    ):
        self.spec = spec
        self.resume = resume
        self.context = context
        self.reporter = reporter
        if resume is not None and run_dir is None:
            run_dir = Path(resume["folder"]).parent.parent
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        self.run_dir = run_dir or Path(spec.runtime.output_dir) / f"{spec.name}-{spec_hash(spec)[:8]}-{stamp}"
        self.track = spec.tracking.enabled if track is None else track
        self.live = live
        self.counters = Counters()
        self.cadence = Cadence(spec, reports=reporter is not None)
        self.window = Window()
        self.health = HealthChecks(spec)
        self.graph: ActorGraph | None = None  # made by run()
        self.tracker: MlflowTracker | None = None
        self.progress: ProgressDisplay | None = None
        self.last_checkpoint: Path | None = None
        self.last_metrics: dict[str, float] = {}
        self.graph_restarts = 0  # the actor graph rebuilt after a learner or the replay actor died
        self.metrics = RunMetrics(run_tag(spec))  # Ray metrics from the driver (Grafana)
        self.video_unavailable = False  # set once rendering failed (eval.video)
        self.phases = Phases(trace=spec.runtime.trace)  # where the time goes (time/* metrics, trace.json)

    # what tests and tools watch while a run goes on
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
    def run(self) -> dict[str, Any]:
        obs, act_dim = env_dims(self.spec)  # a spec whose env cannot be made stops here
        check_stop_metric(self.spec)  # so does a budget.stop_at metric its evaluations never produce
        sym_aug_mirror(self.spec, obs, act_dim)  # so does a mirror that does not fit the env's kwargs
        prior_path = checked_prior_data(self.spec, obs, act_dim)  # so does a dataset that does not fit it
        replay_table = self._check_resume(obs, act_dim) if self.resume is not None else None
        # inline actors live in this process: no Ray to start or join
        started_ray = self.spec.runtime.backend == "ray" and cluster.connect(self.spec)
        status = "FAILED"
        try:
            self.graph = ActorGraph(self.spec, obs, act_dim, prior_path)
            self.graph.start()
            if self.resume is not None:
                self._restore(self.resume, replay_table)
            else:
                self.graph.queue_prior_stats()
            self.graph.publish_weights()
            self._start_tracking()
            if self.resume is not None:  # so reports leave out what the interrupted attempt logged past it
                self._log({m.RUN_RESUMED_AT: float(self.counters.env_steps)}, self.counters.env_steps)
            with ProgressDisplay(self.spec.name, self.spec.budget.env_steps, live=self.live,
                                 task_metric=task_metric(self.spec)) as self.progress:
                stop_reason = self._train()
                final = self._final_checkpoint(stop_reason)
            result = self._finish(stop_reason, final)
            status = "FINISHED"
            return result
        except KeyboardInterrupt:
            status = "KILLED"
            raise
        finally:
            self._close(status, started_ray)

    def _train(self) -> str:
        """Iterate until the cadence stops the run; a learner or the replay actor that dies takes
        the actor graph back to the last checkpoint, and the loop starts again from there."""
        while self.counters.env_steps < self.spec.budget.env_steps:
            try:
                loop = make_loop(self.spec, self.graph, self.counters.env_steps)
                while (stop_reason := self._end_of_iteration(loop.step())) is None:
                    pass
                return stop_reason
            except ActorLost as lost:
                self._recover(str(lost))
            except LearnerFailed as err:
                raise TrainingError(f"{err}; {self._resume_hint()}") from None
        return BUDGET  # resumed from a checkpoint at the budget

    def _end_of_iteration(self, it: Iteration) -> str | None:
        """Count the iteration and log it; evaluate, checkpoint and report when due. The stop
        reason once the run is over."""
        self._report_runner_restarts()
        self.counters.count(it)
        self.window.count(it)
        self.phases.count(it.chunks, it.learner)
        metrics = {**(it.learner.metrics if it.learner else {}), **it.loop_metrics}
        if it.learner is not None and (q_exploding := self.health.check(metrics, self._resume_hint())):
            self._event("q_exploding", **q_exploding)
        metrics |= self._run_metrics()
        env_steps = self.counters.env_steps
        due = self.cadence.due(env_steps)
        evaluation = self._evaluate() if due.evaluate else None
        outcome = self.cadence.outcome(env_steps, due, evaluation)
        metrics |= (evaluation or {}) | self.phases.take()
        self._log(metrics, env_steps)
        self.progress.update(env_steps, metrics)
        self.last_metrics = metrics
        checkpoint = self.save_checkpoint(f"step_{env_steps:09d}") if outcome.checkpoint else None
        if checkpoint is not None:
            self.progress.message(f"checkpoint: {checkpoint}")
        if outcome.report and self.reporter(metrics, checkpoint):
            return STOPPED_BY_CALLBACK
        return outcome.stop_reason

    def _run_metrics(self) -> dict[str, float]:
        """The counters, the replay's fill and the window's averages."""
        metrics: dict[str, float] = {m.ENV_STEPS: self.counters.env_steps, m.ENV_EPISODES: self.counters.episodes}
        if self.graph.replay is not None:
            size = self.graph.replay_size
            metrics |= {m.REPLAY_SIZE: size, m.REPLAY_FILL: size / self.spec.algo.buffer_size}
        if self.graph.prior_info is not None:
            metrics[m.REPLAY_PRIOR_SIZE] = self.graph.prior_info["rows"]
        metrics |= self.window.metrics()
        if m.RUNTIME_POLICY_LAG_MEAN in metrics:
            self.metrics.set("aa_ray_policy_lag", metrics[m.RUNTIME_POLICY_LAG_MEAN])
        if m.TRAIN_EPISODE_RETURN in metrics:
            self.metrics.set("aa_ray_episode_return", metrics[m.TRAIN_EPISODE_RETURN])
        return metrics

    def _evaluate(self) -> dict[str, float]:
        with self.phases.timed(m.PHASE_EVAL):
            evaluation = self.graph.evaluate(self.spec.eval.episodes)
        self._report_runner_restarts()  # the evaluating runner died: its replacement evaluated
        if self.spec.eval.video and not self.video_unavailable:
            self._record_video()
        evaluation[m.EVAL_AT_ENV_STEPS] = float(self.counters.env_steps)
        self.counters.evals.append(evaluation)
        self.metrics.set("aa_ray_eval_return", evaluation[m.EVAL_RETURN])
        return evaluation

    def _record_video(self) -> None:
        video, problem = self.graph.record_video(self.spec.eval.video_max_frames)
        if video is None:  # no GL backend here: say so once, keep training
            self.video_unavailable = True
            self._event("video_unavailable", reason=problem)
            return
        path = write_video(self.run_dir, self.counters.env_steps, video)
        if self.tracker is not None:
            self.tracker.log_artifact(path, "videos")

    def _final_checkpoint(self, stop_reason: str) -> Path:
        final = self.save_checkpoint("final")
        last_eval = self.counters.evals[-1] if self.counters.evals else {}
        self.progress.message(
            f"done ({stop_reason}) at {self.counters.env_steps:,} env steps; last eval "
            + ", ".join(f"{key} {value:.4g}" for key, value in last_eval.items()) + f"\ncheckpoint: {final}"
        )
        return final

    def _finish(self, stop_reason: str, final: Path) -> dict[str, Any]:
        if self.tracker is not None:
            for name in (STATE_FILE, SPEC_FILE):
                self.tracker.log_artifact(final / name, f"checkpoints/{final.name}")
            self.tracker.flush()  # before the final report: Tune may end a trial's process right after it
        if self.reporter is not None:
            self.reporter({**self.last_metrics, m.RUN_FINISHED: 1.0}, final)
        prior = self.graph.prior_info
        return {
            "env_steps": self.counters.env_steps,
            "evals": self.counters.evals,
            "stop_reason": stop_reason,
            "checkpoint": str(final),
            "run_dir": str(self.run_dir),
            "mlflow_run_id": self.tracker.run_id if self.tracker else None,
            "mlflow_url": self.tracker.url if self.tracker else None,
            "replay_size": self.graph.replay_size,
            "prior_size": prior["rows"] if prior else 0,
            "runner_restarts": self.graph.runner_restarts,
            "graph_restarts": self.graph_restarts,
        }

    # ---- before Ray starts -----------------------------------------------------------------------
    def _check_resume(self, obs: ObsDims, act_dim: int) -> Any:
        """Check the checkpoint's learner state and replay file against the spec before any actor
        starts (CheckpointError naming the file otherwise); returns the replay table, if it has one."""
        setup = TrainingSetup.on_cpu(planned_steps=planned_fleet_steps(self.spec))
        mirror = sym_aug_mirror(self.spec, obs, act_dim)
        algorithm = family_of(self.spec).build(self.spec.algo, obs, act_dim, setup, mirror)
        return verify_resume(self.resume, self.spec, algorithm, obs.full, act_dim)

    def _start_tracking(self) -> None:
        if not self.track:
            return
        from aa_ray.tracking.mlflow_tracker import MlflowTracker  # an untracked run needs no MLflow

        run_id = self.resume.get("mlflow_run_id") if self.resume else None
        self.tracker = MlflowTracker(self.spec, run_id=run_id, context=self.context)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / SPEC_FILE).write_text(spec_yaml(self.spec))
        self.tracker.log_artifact(self.run_dir / SPEC_FILE, "spec")

    def _close(self, status: str, started_ray: bool) -> None:
        if self.spec.runtime.trace:  # also of a failed run: where it spent its time until then
            self._write_trace()
        if self.tracker is not None:
            if (self.run_dir / EVENTS_FILE).is_file():
                self.tracker.log_artifact(self.run_dir / EVENTS_FILE)
            self.tracker.finish(status)
        if self.graph is not None:
            self.graph.close()
        cluster.disconnect(started_ray)

    def _write_trace(self) -> None:
        path = self.phases.write_trace(self.run_dir, cluster.timeline(self.spec))
        if self.progress is not None:
            self.progress.message(f"trace: {path} (open it in https://ui.perfetto.dev)")
        if self.tracker is not None:
            self.tracker.log_artifact(path)

    # ---- checkpoints -----------------------------------------------------------------------------
    def save_checkpoint(self, name: str) -> Path:
        """Everything a bit-exact resume needs (sync mode): learner, replay, runners and the driver's
        own pending state, written atomically (see `checkpoint.save_checkpoint`)."""
        with self.phases.timed(m.PHASE_CHECKPOINT):
            return self._save_checkpoint(name)

    def _save_checkpoint(self, name: str) -> Path:
        c, w = self.counters, self.window
        actors = self.graph.snapshot(with_replay_table=self.spec.checkpoint.save_replay)
        state = {
            "counters": {"env_steps": c.env_steps, "iterations": c.iterations, "episodes": c.episodes,
                         "next_eval": self.cadence.next_eval},
            "learner": actors["learner"],
            "replay": actors["replay"],
            "runners": actors["runners"],
            # normalizer moments collected but not merged yet, and the episodes train/* averages over
            "driver": pack({
                "pending_stats": [moments.to_dict() for moments in self.graph.pending_stats],
                "returns": list(w.returns), "infos": {key: list(values) for key, values in w.infos.items()},
            }),
            "mlflow_run_id": self.tracker.run_id if self.tracker else None,
        }
        folder = self.run_dir / "checkpoints" / name
        self.last_checkpoint = save_checkpoint(folder, self.spec, state, actors["replay_table"])
        if self.tracker is not None:  # a crash after this loses no metric logged before the checkpoint
            self.tracker.flush()
        return folder

    def _restore(self, payload: dict[str, Any], replay_table: Any) -> None:
        """Load a checkpoint into the actors and the driver (its counters, cadence, pending state)."""
        c = payload["counters"]
        self.counters = Counters(env_steps=c["env_steps"], iterations=c["iterations"], episodes=c["episodes"])
        self.cadence = Cadence(self.spec, self.reporter is not None, env_steps=c["env_steps"], next_eval=c["next_eval"])
        self.window = Window()
        self.graph.restore(payload, replay_table)
        if "driver" in payload:  # format 2
            driver = unpack(payload["driver"])
            self.graph.pending_stats = [NormMoments.from_dict(saved) for saved in driver["pending_stats"]]
            self.window.returns.extend(driver["returns"])
            # (a checkpoint from before task metrics kept one of them under its own name: its train/* average
            # starts over)
            for key, values in driver.get("infos", {}).items():
                self.window.infos[key] = deque(values, maxlen=RECENT_EPISODES)

    def _resume_hint(self) -> str:
        if self.last_checkpoint is not None:
            return f"resume from the last checkpoint with: aa-ray run SPEC --resume {self.last_checkpoint}"
        return "no checkpoint was written before it (checkpoint.every_env_steps sets how often one is)"

    # ---- faults and events -----------------------------------------------------------------------
    def _report_runner_restarts(self) -> None:
        for restart in self.graph.take_restarts():
            self._event("runner_restart", runner=restart.runner, reason=restart.reason, restarts=restart.restarts)
            self._log({m.RUNTIME_RUNNER_RESTARTS: float(restart.restarts)}, self.counters.env_steps)

    def _recover(self, reason: str) -> None:
        """A learner or the replay actor died: rebuild the whole actor graph and continue from the
        last checkpoint (from the start if there is none yet), in the same MLflow run. The env steps
        since that checkpoint are collected again; the metrics of those steps are logged twice."""
        self._report_runner_restarts()  # replaced earlier in the iteration that lost the actor
        self.graph_restarts += 1
        limit = self.spec.runtime.max_learner_restarts
        lost = self.graph.dead_actors() or ["an actor"]
        if self.graph_restarts > limit:
            raise TrainingError(
                f"{', '.join(lost)} died ({reason}) after runtime.max_learner_restarts={limit} restarts of the "
                f"actor graph in this run; {self._resume_hint()}"
            )
        lost_at, evals = self.counters.env_steps, self.counters.evals
        self.graph.rebuild()
        if self.last_checkpoint is not None:
            payload = load_checkpoint(self.last_checkpoint)
            graph = self.graph
            table = read_replay(payload, graph.obs.full, graph.act_dim) if self.spec.algo.replay_actor else None
            self._restore(payload, table)
        else:  # from the start
            self.counters, self.window = Counters(), Window()
            self.cadence = Cadence(self.spec, reports=self.reporter is not None)
            self.graph.queue_prior_stats()
        self.counters.evals = [e for e in evals if e[m.EVAL_AT_ENV_STEPS] <= self.counters.env_steps]
        self.graph.publish_weights()
        self._event(
            "actor_graph_restart", lost=lost, reason=reason, lost_at_env_steps=lost_at,
            resumed_from=str(self.last_checkpoint or "the start"), replay_size=self.graph.replay_size,
            restarts=self.graph_restarts,
        )
        self._log({m.RUNTIME_GRAPH_RESTARTS: float(self.graph_restarts)}, self.counters.env_steps)

    def _event(self, kind: str, **details: Any) -> None:
        """Print an event and append it to the run's events.jsonl (an MLflow artifact at the end)."""
        line = write_event(self.run_dir, kind, self.counters.env_steps, **details)
        if self.progress is not None:
            self.progress.message(line)

    def _log(self, metrics: dict[str, float], step: int) -> None:
        if self.tracker is not None:
            with self.phases.timed(m.PHASE_TRACKING):
                self.tracker.log_metrics(metrics, step)
