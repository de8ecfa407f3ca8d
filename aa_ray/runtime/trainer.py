"""The driver: compiles a spec into actors and runs the training loop.

Sync mode, one iteration in submission order (Ray runs each actor's calls in the order submitted,
which is what keeps sync mode reproducible for a fixed seed):

    runners.sample(train_every)          # collect with weights v(k-1)
    replay.sample -> learners.update     # learn from data up to iteration k-1, concurrently
    learner.policy_state -> runners      # weights v(k) reach runners before their next sample
    replay.add(new transitions)          # this iteration's data joins the buffer

Async mode (`runtime.mode: async`): nothing waits for a whole iteration. Each runner always has a
chunk of `train_every` steps in progress and starts the next one as soon as one returns, with the
newest weights the learner has published; the learners always have the next update queued behind
the current one (its batch is sampled while they train). Two throttles keep the run what the spec
says: the learners take an update only when the runners have collected the env steps it stands
for (the UTD ratio holds on average), and the runners stop collecting when they are two learner
updates ahead. A learner update also waits while any runner acts with weights older than
`runtime.max_policy_lag` versions, which bounds the policy lag logged as `runtime/policy_lag_max`.

On-policy algorithms (PPO) have no replay actor and no overlap: every runner collects a rollout
of `train_every` steps per env with the current weights, the learners update on all of them, and
the new weights reach the runners before their next rollout.

Inside a Tune trial (`aa_ray.tune`) the actors go into the trial's own placement group, and a
`reporter` hands each evaluation and checkpoint to Tune.

Every call is coarse: one per actor per iteration; transitions and weights move between actors
as object refs and never pass through the driver.

Faults: a runner that dies or raises is replaced in its placement-group bundle (up to
`runtime.max_runner_restarts`), the event is printed, logged as `runtime/runner_restarts` and
written to the run's `events.jsonl`; the chunk it was collecting is lost, the replay buffer is not.
A learner or the replay actor that dies (killed, out of memory, its node gone) takes the whole actor
graph back to the last checkpoint: every actor is replaced in the same bundles, the checkpoint's
learner, replay, runner and driver state is loaded, and the run goes on in the same MLflow run (up
to `runtime.max_learner_restarts`; logged as `runtime/graph_restarts` and an event). A learner that
raises an exception ends the run with an error naming the last checkpoint to resume from.

Checkpoints hold everything the next iteration depends on (see `save_checkpoint`), so in sync mode
a run resumed from one continues exactly as the uninterrupted run would have.

RLPD (`algo.prior_data` set): the dataset is validated against the spec's env before Ray starts,
the replay actor loads it into its prior buffer, and every batch it samples is
`[prior rows | online rows]` at `algo.prior_data_ratio`. Learning still starts once
`warm_up_steps` online transitions are stored (an RLPD spec sets that small); the dataset's
observations seed the observation normalizer's statistics.
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch

from aa_ray.algos import build_algorithm
from aa_ray.data.dataset import DatasetError, read_dataset
from aa_ray.runtime import cluster
from aa_ray.runtime.checkpoint import (
    REPLAY_FILE,
    load_checkpoint,
    read_replay,
    save_checkpoint,
    verify_resume,
)
from aa_ray.runtime.env_runner import EnvRunner, env_dims
from aa_ray.runtime.env_state import pack, unpack
from aa_ray.runtime.learner import Learner
from aa_ray.runtime.metrics import RunMetrics, run_tag
from aa_ray.runtime.progress import ProgressDisplay
from aa_ray.runtime.replay import ReplayBuffer
from aa_ray.spec.experiment import ExperimentSpec
from aa_ray.spec.loader import spec_hash, spec_yaml
from aa_ray.tracking.mlflow_tracker import MlflowTracker, RunContext

EVENTS_FILE = "events.jsonl"  # restarts and other runtime events, one JSON object per line


class TrainingError(RuntimeError):
    """A run that failed inside an actor; the message is the actor's own error."""


class ActorLost(TrainingError):
    """An actor died (killed, out of memory, its node lost) rather than raising an exception."""


@dataclass
class Counters:
    env_steps: int = 0
    iterations: int = 0
    episodes: int = 0
    next_eval: int = 0
    next_checkpoint: int = 0
    evals: list[dict[str, float]] = field(default_factory=list)


@dataclass
class Window:
    """What the driver averages between metric logs: throughput, recent episodes, policy lag."""

    start: float = field(default_factory=time.perf_counter)
    env_steps: int = 0
    updates: int = 0
    returns: deque = field(default_factory=lambda: deque(maxlen=20))
    distances: deque = field(default_factory=lambda: deque(maxlen=20))
    lags: list[int] = field(default_factory=list)


def describe_failure(err: Exception) -> str:
    """One line for an actor's failure: its own exception, or why the actor is gone."""
    if isinstance(err, ray.exceptions.RayTaskError):
        cause = err.cause if getattr(err, "cause", None) is not None else err
        return f"{type(cause).__name__}: {cause}"
    if isinstance(err, ray.exceptions.RayActorError):
        return "the actor died" + (f" ({err.error_msg.splitlines()[0]})" if getattr(err, "error_msg", "") else "")
    return f"{type(err).__name__}: {err}"


def get_results(refs: Any) -> Any:
    """ray.get that surfaces the actor's exception message instead of a Ray traceback. For a list,
    the first failure is raised as soon as it happens, not after the refs before it finish (a dead
    learner must not leave the driver waiting on its peers' collective timeout)."""
    try:
        if isinstance(refs, list) and len(refs) > 1:
            pending = list(refs)
            while pending:
                ready, pending = ray.wait(pending, num_returns=1)
                ray.get(ready)
        return ray.get(refs)
    except ray.exceptions.RayActorError as err:  # also a task whose input came from a dead actor
        raise ActorLost(describe_failure(err)) from None
    except ray.exceptions.RayTaskError as err:
        raise TrainingError(describe_failure(err)) from None


# Called after each evaluation and checkpoint with the iteration's metrics and the checkpoint folder
# written at that point (None if none was); a Tune trial reports both to Tune with it.
Reporter = Callable[[dict[str, float], Path | None], None]


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
        self.last_metrics: dict[str, float] = {}
        if resume is not None and run_dir is None:
            run_dir = Path(resume["folder"]).parent.parent
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        self.run_dir = run_dir or Path(spec.runtime.output_dir) / f"{spec.name}-{spec_hash(spec)[:8]}-{stamp}"
        self.track = spec.tracking.enabled if track is None else track
        self.live = live
        self.counters = Counters(next_eval=spec.eval.every_env_steps, next_checkpoint=self._every_ckpt())
        self.window = Window()
        self.tracker: MlflowTracker | None = None
        self.progress: ProgressDisplay | None = None
        self.last_checkpoint: Path | None = None
        self.prior_info: dict[str, Any] | None = None  # what the replay actor loaded from algo.prior_data
        self.pending_stats: list[dict] = []  # runners' normalizer moments the learners have not merged yet
        self.weights: tuple[Any, Any] | None = None  # refs of the newest published (policy state, version)
        self.runner_restarts = 0
        self.graph_restarts = 0  # the actor graph rebuilt after a learner or the replay actor died
        self.graph_args: tuple[int, int, Path | None] = (0, 0, None)  # obs_dim, act_dim, prior data; set by run()
        self.replay_size = 0
        self.metrics = RunMetrics(run_tag(spec))  # Ray metrics from the driver (Grafana)
        self.video_unavailable = False  # set once rendering failed (eval.video)
        self.q_warned = False  # the q_exploding event is written once

    def check_prior_data(self, obs_dim: int, act_dim: int) -> Path | None:
        """Validate `algo.prior_data` against the spec's env (file footers only); DatasetError
        naming the file and the mismatch otherwise. Relative paths are taken from the cwd."""
        if self.spec.prior_data is None:
            return None
        path = Path(self.spec.prior_data).expanduser().resolve()
        try:
            read_dataset(path, expect_env_id=self.spec.env.id, expect_obs_dim=obs_dim, expect_act_dim=act_dim)
        except DatasetError as err:
            raise DatasetError(f"algo.prior_data: {err}") from None
        return path

    def _every_ckpt(self) -> int:
        return self.spec.checkpoint.every_env_steps or self.spec.budget.env_steps + 1

    # ---- building the actor graph -------------------------------------------------------------
    def _build(self, obs_dim: int, act_dim: int, prior_path: Path | None) -> None:
        """Start the actors in their placement-group bundles (the group is made on the first call)."""
        spec = self.spec
        if not hasattr(self, "group"):
            self.group, self.bundle_offset, self.owns_group = cluster.placement(spec)
        learner_cls = ray.remote(Learner)
        self.learners = [
            learner_cls.options(
                num_cpus=spec.learners.cpus_per_learner,
                num_gpus=spec.learners.gpus_per_learner,
                scheduling_strategy=self._bundle(rank),
            ).remote(spec, obs_dim, act_dim, rank)
            for rank in range(spec.learners.num_learners)
        ]
        self.runners = [self._make_runner(i) for i in range(spec.runners.num_runners)]
        self.replay = None  # on-policy algorithms learn from fresh rollouts only
        if not spec.on_policy:
            self.replay = ray.remote(ReplayBuffer).options(
                num_cpus=spec.runtime.replay_cpus,
                scheduling_strategy=self._bundle(spec.learners.num_learners + spec.runners.num_runners),
            ).remote(spec.algo.buffer_size, obs_dim, act_dim, seed=spec.seed, run=run_tag(spec))
        if len(self.learners) > 1:  # rank 0 names the rendezvous; all join one process group
            address = get_results(self.learners[0].rendezvous_address.remote())
            get_results([learner.join.remote(address) for learner in self.learners])
        if prior_path is not None:
            ratio, gamma = spec.algo.prior_data_ratio, spec.algo.gamma
            self.prior_info = get_results(self.replay.load_prior.remote(str(prior_path), ratio, gamma, spec.env.id))

    def _bundle(self, index: int) -> Any:
        """Where the actor of `spec.bundles()[index]` goes (a Tune trial's own bundle 0 is the trial's)."""
        return cluster.in_bundle(self.group, self.bundle_offset + index)

    def _make_runner(self, index: int, incarnation: int = 0) -> Any:
        return (
            ray.remote(EnvRunner)
            .options(
                num_cpus=self.spec.runners.cpus_per_runner,
                scheduling_strategy=self._bundle(self.spec.learners.num_learners + index),
            )
            .remote(self.spec, index, incarnation)
        )

    def _restore(self, payload: dict[str, Any], replay_table: Any) -> None:
        c = payload["counters"]
        self.counters = Counters(
            env_steps=c["env_steps"], iterations=c["iterations"], episodes=c["episodes"],
            next_eval=c["next_eval"], next_checkpoint=c["env_steps"] + self._every_ckpt(),
        )
        calls = [learner.load_state_dict.remote(payload["learner"]) for learner in self.learners]
        if self.replay is not None and replay_table is not None:
            source = str(Path(payload["folder"]) / REPLAY_FILE)
            calls.append(self.replay.load_table.remote(replay_table, payload["replay"], source))
            self.replay_size = replay_table.num_rows
        runner_states = payload.get("runners") or [{"numpy_rng": r["numpy"], "torch_rng": r["torch"]}
                                                   for r in payload.get("runner_rng", [])]  # format 1
        for runner, state in zip(self.runners, runner_states, strict=False):
            calls.append(runner.load_state.remote(state))
        if "driver" in payload:
            driver = unpack(payload["driver"])
            self.pending_stats = driver["pending_stats"]
            self.window.returns.extend(driver["returns"])
            self.window.distances.extend(driver["distances"])
        get_results(calls)

    def _request_weights(self) -> tuple[Any, Any]:
        return self.learners[0].policy_state.options(num_returns=2).remote()

    def _publish_weights(self) -> None:
        self.weights = self._request_weights()
        for runner in self.runners:
            runner.set_weights.remote(*self.weights)

    def _submit_update(self) -> list[Any]:
        """Queue one learner iteration on every learner: a global batch stack of train_every x utd
        batches from the replay actor, one shard per learner, and the normalizer moments to merge."""
        algo, num_learners = self.spec.algo, len(self.learners)
        num_batches = algo.train_every * algo.utd_ratio
        if num_learners == 1:
            shards = [self.replay.sample.remote(num_batches, algo.batch_size)]
        else:
            shards = self.replay.sample_shards.options(num_returns=num_learners).remote(
                num_batches, algo.batch_size, num_learners
            )
        updates = [
            learner.update.remote(shard, self.pending_stats)
            for learner, shard in zip(self.learners, shards, strict=True)
        ]
        self.pending_stats = []
        return updates

    def _learner_metrics(self, update_refs: list[Any]) -> dict[str, float]:
        """Rank 0's metrics; a failed learner, or one whose updates keep coming out non-finite, ends
        the run, pointing at the checkpoint to resume from. Exploding values are flagged."""
        try:
            metrics = get_results(update_refs)[0]
        except ActorLost:
            raise  # the run recovers from the last checkpoint (`_recover`)
        except TrainingError as err:
            raise TrainingError(f"a learner failed, so the run stopped ({err}); {self._resume_hint()}") from None
        limit = self.spec.runtime.max_consecutive_skips
        if metrics.get("learner/consecutive_skips", 0) >= limit:
            raise TrainingError(
                f"the last {int(metrics['learner/consecutive_skips'])} gradient steps had non-finite losses or "
                f"gradients (runtime.max_consecutive_skips={limit}), so the run stopped; check the env's rewards "
                f"and observations and the learning rates; {self._resume_hint()}"
            )
        largest = max(abs(metrics.get("critic/q_max", 0.0)), abs(metrics.get("critic/value_mean", 0.0)))
        metrics["learner/q_exploding"] = float(largest > self.spec.runtime.q_warning_bound)
        if metrics["learner/q_exploding"] and not self.q_warned:
            self.q_warned = True
            self._event("q_exploding", value=largest, bound=self.spec.runtime.q_warning_bound)
        return metrics

    def _resume_hint(self) -> str:
        if self.last_checkpoint is not None:
            return f"resume from the last checkpoint with: aa-ray run SPEC --resume {self.last_checkpoint}"
        return "no checkpoint was written before it (checkpoint.every_env_steps sets how often one is)"

    # ---- faults --------------------------------------------------------------------------------
    def _runner_stats(self, index: int, stats_ref: Any) -> dict[str, Any] | None:
        """A runner's chunk statistics, or None after replacing a runner that died or raised."""
        try:
            return ray.get(stats_ref)
        except (ray.exceptions.RayTaskError, ray.exceptions.RayActorError) as err:
            self._restart_runner(index, describe_failure(err))
            return None

    def _restart_runner(self, index: int, reason: str) -> None:
        self.runner_restarts += 1
        limit = self.spec.runtime.max_runner_restarts
        if self.runner_restarts > limit:
            raise TrainingError(
                f"env runner {index} failed ({reason}) after runtime.max_runner_restarts={limit} restarts "
                "in this run; fix the env (or raise the limit) and resume from the last checkpoint"
            )
        ray.kill(self.runners[index])  # one whose env raised is still alive and holds its bundle
        # a new incarnation gets fresh seeds, so it does not replay the episodes its predecessor saw
        self.runners[index] = self._make_runner(index, incarnation=self.runner_restarts)
        if self.weights is not None:
            self.runners[index].set_weights.remote(*self.weights)
        self._event("runner_restart", runner=index, reason=reason, restarts=self.runner_restarts)
        self._log({"runtime/runner_restarts": float(self.runner_restarts)}, self.counters.env_steps)

    def _recover(self, reason: str) -> None:
        """A learner or the replay actor died: rebuild the whole actor graph and continue from the
        last checkpoint (from the start if there is none yet), in the same MLflow run. The env steps
        since that checkpoint are collected again; the metrics of those steps are logged twice."""
        self.graph_restarts += 1
        limit = self.spec.runtime.max_learner_restarts
        lost = self._dead_actors() or ["an actor"]
        if self.graph_restarts > limit:
            raise TrainingError(
                f"{', '.join(lost)} died ({reason}) after runtime.max_learner_restarts={limit} restarts of the "
                f"actor graph in this run; {self._resume_hint()}"
            )
        lost_at, evals = self.counters.env_steps, self.counters.evals
        self._kill_actors()
        self._build(*self.graph_args)
        self.window, self.pending_stats = Window(), []
        if self.last_checkpoint is not None:
            payload = load_checkpoint(self.last_checkpoint)
            obs_dim, act_dim, _ = self.graph_args
            self._restore(payload, None if self.spec.on_policy else read_replay(payload, obs_dim, act_dim))
        else:
            self.counters = Counters(next_eval=self.spec.eval.every_env_steps, next_checkpoint=self._every_ckpt())
            self.replay_size = 0
            if self.prior_info is not None:
                self.pending_stats.append({"obs": self.prior_info["obs"], "return": (0, 0.0, 1.0, 0.0)})
        self.counters.evals = [e for e in evals if e["eval/at_env_steps"] <= self.counters.env_steps]
        self._publish_weights()
        self._event(
            "actor_graph_restart", lost=lost, reason=reason, lost_at_env_steps=lost_at,
            resumed_from=str(self.last_checkpoint or "the start"), replay_size=self.replay_size,
            restarts=self.graph_restarts,
        )
        self._log({"runtime/graph_restarts": float(self.graph_restarts)}, self.counters.env_steps)

    def _dead_actors(self) -> list[str]:
        """Names of the actors that are gone (a busy one, e.g. a learner waiting on a dead peer's
        collective, does not answer within the timeout and is not counted)."""
        named = [(f"learner {rank}", learner) for rank, learner in enumerate(self.learners)]
        named += [("replay", self.replay)] if self.replay is not None else []
        named += [(f"env runner {index}", runner) for index, runner in enumerate(self.runners)]
        pings = {actor.__ray_ready__.remote(): name for name, actor in named}
        answered, _ = ray.wait(list(pings), num_returns=len(pings), timeout=10)
        dead = []
        for ref in answered:
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError:
                dead.append(pings[ref])
        return sorted(dead, key=[name for name, _ in named].index)

    def _event(self, kind: str, **details: Any) -> None:
        """Print an event and append it to the run's events.jsonl (an MLflow artifact at the end)."""
        event = {"time": datetime.now().isoformat(timespec="seconds"), "env_steps": self.counters.env_steps,
                 "event": kind, **details}
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with open(self.run_dir / EVENTS_FILE, "a") as events:
            events.write(json.dumps(event) + "\n")
        if self.progress is not None:
            self.progress.message(f"event: {kind} " + ", ".join(f"{k}={v}" for k, v in details.items()))

    # ---- the run -------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        obs_dim, act_dim = env_dims(self.spec)  # a spec whose env cannot be made stops here
        prior_path = self.check_prior_data(obs_dim, act_dim)  # so does a dataset that does not fit it
        replay_table = self._check_resume(obs_dim, act_dim) if self.resume is not None else None
        self.graph_args = (obs_dim, act_dim, prior_path)
        started_ray = cluster.connect(self.spec)
        status = "FAILED"
        try:
            self._build(*self.graph_args)
            if self.resume is not None:
                self._restore(self.resume, replay_table)
            self._publish_weights()
            if self.track:
                run_id = self.resume.get("mlflow_run_id") if self.resume else None
                self.tracker = MlflowTracker(self.spec, run_id=run_id, context=self.context)
                self.run_dir.mkdir(parents=True, exist_ok=True)
                (self.run_dir / "spec.yaml").write_text(spec_yaml(self.spec))
                self.tracker.log_artifact(self.run_dir / "spec.yaml", "spec")
            result = self._train()
            status = "FINISHED"
            return result
        except KeyboardInterrupt:
            status = "KILLED"
            raise
        finally:
            if self.tracker is not None:
                if (self.run_dir / EVENTS_FILE).is_file():
                    self.tracker.log_artifact(self.run_dir / EVENTS_FILE)
                self.tracker.finish(status)
            if hasattr(self, "group"):
                self._kill_actors()
                if self.owns_group:
                    ray.util.remove_placement_group(self.group)
            if started_ray:
                ray.shutdown()

    def _check_resume(self, obs_dim: int, act_dim: int) -> Any:
        """Check the checkpoint's learner state and replay file against the spec before any actor
        starts (CheckpointError naming the file otherwise); returns the replay table, if it has one."""
        planned_steps = self.spec.budget.env_steps // self.spec.transitions_per_fleet_step
        algorithm = build_algorithm(self.spec.algo, obs_dim, act_dim, torch.device("cpu"), planned_steps)
        return verify_resume(self.resume, self.spec, algorithm, obs_dim, act_dim)

    def _kill_actors(self) -> None:
        for actor in [*self.learners, self.replay, *self.runners]:
            if actor is not None:
                ray.kill(actor)

    def _train(self) -> dict[str, Any]:
        if self.prior_info is not None and self.resume is None:  # a resumed normalizer already holds them
            self.pending_stats.append({"obs": self.prior_info["obs"], "return": (0, 0.0, 1.0, 0.0)})
        with ProgressDisplay(self.spec.name, self.spec.budget.env_steps, live=self.live) as progress:
            self.progress = progress
            if self.spec.on_policy:
                loop = self._loop_on_policy
            else:
                loop = self._loop_async if self.spec.runtime.mode == "async" else self._loop_sync
            while True:
                try:
                    stop_reason = loop() if self.counters.env_steps < self.spec.budget.env_steps else "budget"
                    break
                except ActorLost as lost:
                    self._recover(str(lost))
            final = self.save_checkpoint("final")
            c = self.counters
            progress.message(
                f"done ({stop_reason}) at {c.env_steps:,} env steps; last eval "
                + ", ".join(f"{k} {v:.4g}" for k, v in (c.evals[-1] if c.evals else {}).items())
                + f"\ncheckpoint: {final}"
            )
        if self.tracker is not None:
            self._log_checkpoint(final)
            self.tracker.flush()  # before the final report: Tune may end a trial's process right after it
        if self.reporter is not None:
            self.reporter({**self.last_metrics, "run/finished": 1.0}, final)
        return {
            "env_steps": c.env_steps,
            "evals": c.evals,
            "stop_reason": stop_reason,
            "checkpoint": str(final),
            "run_dir": str(self.run_dir),
            "mlflow_run_id": self.tracker.run_id if self.tracker else None,
            "replay_size": self.replay_size,
            "prior_size": self.prior_info["rows"] if self.prior_info else 0,
            "runner_restarts": self.runner_restarts,
            "graph_restarts": self.graph_restarts,
        }

    def _learning_started(self) -> bool:
        # a run resumed from a checkpoint without its replay refills the buffer before sampling it
        algo = self.spec.algo
        refilled = self.replay_size >= min(algo.batch_size, max(algo.warm_up_steps, 1))
        return self.counters.env_steps >= algo.warm_up_steps and refilled

    def _loop_sync(self) -> str:
        spec, algo, c = self.spec, self.spec.algo, self.counters
        learning = self._learning_started()
        while True:
            random_actions = c.env_steps < algo.warm_up_steps
            sampled = [r.sample.options(num_returns=2).remote(algo.train_every, random_actions) for r in self.runners]
            update_refs = []
            if learning:
                update_refs = self._submit_update()
                self._publish_weights()
            collected = []
            for index, (transitions, stats_ref) in enumerate(sampled):
                stats = self._runner_stats(index, stats_ref)
                if stats is not None:
                    collected.append((transitions, stats))
            size_ref = self.replay.add.remote(*[transitions for transitions, _ in collected])
            metrics = self._learner_metrics(update_refs) if update_refs else {}
            self.replay_size = get_results(size_ref)
            c.iterations += 1
            self._account([stats for _, stats in collected])
            if update_refs:
                self.window.updates += algo.train_every * algo.utd_ratio
            learning = learning or self._learning_started()
            stop_reason = self._end_of_iteration(metrics)
            if stop_reason is not None:
                return stop_reason
            if c.env_steps >= spec.budget.env_steps:
                return "budget"

    def _loop_async(self) -> str:
        spec, algo, c = self.spec, self.spec.algo, self.counters
        iteration_steps = algo.train_every * spec.transitions_per_fleet_step  # env steps one update stands for
        chunk_steps = algo.train_every * spec.runners.envs_per_runner
        # learner updates queued at once; a chunk starting now may see all of them land, so the
        # queue is never deeper than the lag bound
        depth = min(2, spec.runtime.max_policy_lag)
        published = int(get_results(self.weights[1]))
        runner_version = [published] * len(self.runners)
        chunks: dict[Any, tuple[int, Any, int]] = {}  # stats ref -> (runner, transitions ref, weights version)
        updates: deque[tuple[list[Any], tuple[Any, Any]]] = deque()  # (update refs, weights refs)
        idle = set(range(len(self.runners)))
        submitted = completed = 0
        learn_start: int | None = None  # env steps when learning started (warm-up, or a refill on resume)

        def may_collect() -> bool:
            if learn_start is None:
                return True
            # never more than two updates' worth of env steps ahead of the learner
            ahead = c.env_steps + len(chunks) * chunk_steps - learn_start
            return ahead < (completed + 2) * iteration_steps

        def may_update() -> bool:
            if learn_start is None or len(updates) >= depth:
                return False
            if submitted * iteration_steps > c.env_steps - learn_start:  # UTD: wait for the data
                return False
            next_version = published + len(updates) + 1
            oldest = min((version for _, _, version in chunks.values()), default=published)
            return next_version - oldest <= spec.runtime.max_policy_lag

        while c.env_steps < spec.budget.env_steps:
            for index in sorted(idle):
                if not may_collect():
                    break
                if runner_version[index] != published:
                    self.runners[index].set_weights.remote(*self.weights)
                    runner_version[index] = published
                random_actions = c.env_steps + len(chunks) * chunk_steps < algo.warm_up_steps
                transitions, stats_ref = self.runners[index].sample.options(num_returns=2).remote(
                    algo.train_every, random_actions
                )
                chunks[stats_ref] = (index, transitions, published)
                idle.discard(index)
            if learn_start is None and self._learning_started():
                learn_start = c.env_steps
            while may_update():
                updates.append((self._submit_update(), self._request_weights()))
                submitted += 1
            waiting = list(chunks) + ([updates[0][0][0]] if updates else [])
            [ready], _ = ray.wait(waiting, num_returns=1)

            if ready in chunks:
                index, transitions, version = chunks.pop(ready)
                idle.add(index)
                stats = self._runner_stats(index, ready)
                if stats is None:
                    runner_version[index] = -1  # the replacement gets weights with its first chunk
                    continue
                self.replay_size = get_results(self.replay.add.remote(transitions))
                self.window.lags.append(published - version)
                self._account([stats])
                if submitted == 0 or c.env_steps >= spec.budget.env_steps:  # warm-up, or the last chunk
                    stop_reason = self._end_of_iteration({})
                    if stop_reason is not None:
                        return stop_reason
                continue

            update_refs, self.weights = updates.popleft()
            metrics = self._learner_metrics(update_refs)
            completed += 1
            published += 1
            c.iterations += 1
            self.window.updates += algo.train_every * algo.utd_ratio
            learned_fleet_steps = max(c.env_steps - learn_start, 1) / spec.transitions_per_fleet_step
            critic_updates = completed * algo.train_every * algo.utd_ratio
            metrics["runtime/updates_per_fleet_step"] = critic_updates / learned_fleet_steps
            metrics["runtime/policy_version"] = float(published)
            stop_reason = self._end_of_iteration(metrics)
            if stop_reason is not None:
                return stop_reason
        return "budget"

    def _loop_on_policy(self) -> str:
        """Collect a rollout on every runner with the current weights, update on all of it, publish.
        An iteration in which a runner failed is not learned from (its envs' share is missing)."""
        spec, algo, c = self.spec, self.spec.algo, self.counters
        while True:
            sampled = [r.sample_rollout.options(num_returns=2).remote(algo.train_every) for r in self.runners]
            rollouts, collected = [], []
            for index, (rollout, stats_ref) in enumerate(sampled):
                stats = self._runner_stats(index, stats_ref)
                if stats is not None:
                    rollouts.append(rollout)
                    collected.append(stats)
            self._account(collected)
            c.iterations += 1
            metrics: dict[str, float] = {}
            if len(rollouts) == len(self.runners):
                stats = self.pending_stats
                update_refs = [learner.update_rollouts.remote(stats, *rollouts) for learner in self.learners]
                self.pending_stats = []
                metrics = self._learner_metrics(update_refs)
                self.window.updates += algo.ppo_epochs * algo.num_minibatches
                self._publish_weights()
            stop_reason = self._end_of_iteration(metrics)
            if stop_reason is not None:
                return stop_reason
            if c.env_steps >= spec.budget.env_steps:
                return "budget"

    def _account(self, chunk_stats: list[dict[str, Any]]) -> None:
        """Count the env steps and episodes of finished chunks; queue their normalizer moments."""
        c, w = self.counters, self.window
        for stats in chunk_stats:
            c.env_steps += stats["env_steps"]
            w.env_steps += stats["env_steps"]
            self.pending_stats.append(stats["norm_stats"])
            for episode in stats["episodes"]:
                c.episodes += 1
                w.returns.append(episode["return"])
                if "final_distance" in episode:
                    w.distances.append(episode["final_distance"])

    def _end_of_iteration(self, metrics: dict[str, float]) -> str | None:
        """Log, evaluate and checkpoint when due; the stop reason once the run is over."""
        spec, c, w = self.spec, self.counters, self.window
        metrics |= {"env/steps": c.env_steps, "env/episodes": c.episodes}
        if self.replay is not None:
            metrics |= {"replay/size": self.replay_size, "replay/fill": self.replay_size / spec.algo.buffer_size}
        if self.prior_info is not None:
            metrics["replay/prior_size"] = self.prior_info["rows"]
        elapsed = time.perf_counter() - w.start
        if elapsed > 2.0:
            metrics["env/steps_per_s"] = w.env_steps / elapsed
            metrics["learner/updates_per_s"] = w.updates / elapsed
            if w.lags:
                metrics["runtime/policy_lag_mean"] = float(np.mean(w.lags))
                metrics["runtime/policy_lag_max"] = float(max(w.lags))
                self.metrics.set("aa_ray_policy_lag", metrics["runtime/policy_lag_mean"])
            w.start, w.env_steps, w.updates, w.lags = time.perf_counter(), 0, 0, []
        if w.returns:
            metrics["train/episode_return"] = float(np.mean(w.returns))
            self.metrics.set("aa_ray_episode_return", metrics["train/episode_return"])
        if w.distances:
            metrics["train/final_distance"] = float(np.mean(w.distances))

        stop_reason = "budget" if c.env_steps >= spec.budget.env_steps else None
        # a Tune trial also evaluates when it checkpoints, so its first report already has eval metrics
        checkpoint_due = c.env_steps >= c.next_checkpoint
        reporting_checkpoint = checkpoint_due and stop_reason is None and self.reporter is not None
        evaluated = c.env_steps >= c.next_eval or stop_reason is not None or reporting_checkpoint
        if evaluated:
            evaluation = self._evaluate()
            metrics.update(evaluation)
            self.metrics.set("aa_ray_eval_return", evaluation["eval/return"])
            c.next_eval = (c.env_steps // spec.eval.every_env_steps + 1) * spec.eval.every_env_steps
            if self._target_reached(evaluation):
                stop_reason = "target reached"
        self._log(metrics, c.env_steps)
        self.progress.update(c.env_steps, metrics)
        self.last_metrics = metrics
        checkpoint = None
        if checkpoint_due and stop_reason is None:
            checkpoint = self.save_checkpoint(f"step_{c.env_steps:09d}")
            c.next_checkpoint += self._every_ckpt()
            self.progress.message(f"checkpoint: {self.last_checkpoint}")
        if self.reporter is not None and stop_reason is None and (evaluated or checkpoint is not None):
            self.reporter(metrics, checkpoint)  # the final report comes with the final checkpoint
        return stop_reason

    def _evaluate(self) -> dict[str, float]:
        evaluator = self.runners[0]
        evaluator.set_weights.remote(*self.weights)  # async: it may still act with older weights
        try:
            evaluation = get_results(evaluator.evaluate.remote(self.spec.eval.episodes))
        except ActorLost as lost:  # the evaluating runner died: replace it and evaluate again
            self._restart_runner(0, str(lost))
            evaluator = self.runners[0]
            evaluation = get_results(evaluator.evaluate.remote(self.spec.eval.episodes))
        if self.spec.eval.video and not self.video_unavailable:
            self._record_video(evaluator)
        evaluation["eval/at_env_steps"] = float(self.counters.env_steps)
        self.counters.evals.append(evaluation)
        return evaluation

    def _record_video(self, evaluator: Any) -> None:
        video, problem = get_results(evaluator.record_video.remote(self.spec.eval.video_max_frames))
        if video is None:  # no GL backend here: say so once, keep training
            self.video_unavailable = True
            self._event("video_unavailable", reason=problem)
            return
        path = self.run_dir / "videos" / f"eval_{self.counters.env_steps:09d}.gif"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(video)
        if self.tracker is not None:
            self.tracker.log_artifact(path, "videos")

    def _target_reached(self, evaluation: dict[str, float]) -> bool:
        budget = self.spec.budget
        if budget.stop_at_eval_distance is not None and "eval/distance" in evaluation:
            return evaluation["eval/distance"] < budget.stop_at_eval_distance
        if budget.stop_at_eval_return is not None:
            return evaluation["eval/return"] >= budget.stop_at_eval_return
        return False

    def _log(self, metrics: dict[str, float], step: int) -> None:
        if self.tracker is not None:
            self.tracker.log_metrics(metrics, step)

    def _log_checkpoint(self, folder: Path) -> None:
        for name in ("state.pt", "spec.yaml"):
            self.tracker.log_artifact(folder / name, f"checkpoints/{folder.name}")

    def save_checkpoint(self, name: str) -> Path:
        """Everything a bit-exact resume needs (sync mode): learner, replay, runners and the driver's
        own pending state, written atomically (see `checkpoint.save_checkpoint`)."""
        c, w = self.counters, self.window
        learner_ref = self.learners[0].state_dict.remote()
        replay_refs = []
        if self.replay is not None:
            replay_refs = [self.replay.state.remote()]
            if self.spec.checkpoint.save_replay:
                replay_refs.append(self.replay.to_table.remote())
        runner_refs = [runner.state.remote() for runner in self.runners]
        replay_state, replay_table = (get_results(replay_refs) + [None, None])[:2]
        state = {
            "counters": {
                "env_steps": c.env_steps, "iterations": c.iterations, "episodes": c.episodes,
                "next_eval": c.next_eval,
            },
            "learner": get_results(learner_ref),
            "replay": replay_state or {},
            "runners": get_results(runner_refs),
            # normalizer moments collected but not merged yet, and the episodes train/* averages over
            "driver": pack({"pending_stats": self.pending_stats, "returns": list(w.returns),
                            "distances": list(w.distances)}),
            "mlflow_run_id": self.tracker.run_id if self.tracker else None,
        }
        folder = self.run_dir / "checkpoints" / name
        self.last_checkpoint = save_checkpoint(folder, self.spec, state, replay_table)
        if self.tracker is not None:  # a crash after this loses no metric logged before the checkpoint
            self.tracker.flush()
        return folder
