"""The driver: compiles a spec into actors and runs the synchronous training loop.

One iteration, in submission order (Ray runs each actor's calls in the order submitted, which
is what keeps sync mode reproducible for a fixed seed):

    runners.sample(train_every)          # collect with weights v(k-1)
    replay.sample -> learner.update      # learn from data up to iteration k-1, concurrently
    learner.policy_state -> runners      # weights v(k) reach runners before their next sample
    replay.add(new transitions)          # this iteration's data joins the buffer

Every call is coarse: one per actor per iteration; transitions and weights move between actors
as object refs and never pass through the driver.

RLPD (`algo.prior_data` set): the dataset is validated against the spec's env before Ray starts,
the replay actor loads it into its prior buffer, and every batch it samples is
`[prior rows | online rows]` at `algo.prior_data_ratio`. Learning still starts once
`warm_up_steps` online transitions are stored (an RLPD spec sets that small); the dataset's
observations seed the observation normalizer's statistics.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import ray

from aa_ray.data.dataset import DatasetError, read_dataset
from aa_ray.runtime import cluster
from aa_ray.runtime.checkpoint import REPLAY_FILE, save_checkpoint
from aa_ray.runtime.env_runner import EnvRunner, env_dims
from aa_ray.runtime.learner import Learner
from aa_ray.runtime.progress import ProgressDisplay
from aa_ray.runtime.replay import ReplayBuffer
from aa_ray.spec.experiment import ExperimentSpec
from aa_ray.spec.loader import spec_hash, spec_yaml
from aa_ray.tracking.mlflow_tracker import MlflowTracker


class TrainingError(RuntimeError):
    """A run that failed inside an actor; the message is the actor's own error."""


@dataclass
class Counters:
    env_steps: int = 0
    iterations: int = 0
    episodes: int = 0
    next_eval: int = 0
    next_checkpoint: int = 0
    evals: list[dict[str, float]] = field(default_factory=list)


def get_results(refs: Any) -> Any:
    """ray.get that surfaces the actor's exception message instead of a Ray traceback."""
    try:
        return ray.get(refs)
    except ray.exceptions.RayTaskError as err:
        cause = err.cause if getattr(err, "cause", None) is not None else err
        raise TrainingError(f"{type(cause).__name__}: {cause}") from None
    except ray.exceptions.RayActorError as err:
        raise TrainingError(f"an actor died: {err}") from None


class Trainer:
    def __init__(
        self,
        spec: ExperimentSpec,
        run_dir: Path | None = None,
        resume: dict[str, Any] | None = None,
        track: bool | None = None,
        live: bool | None = None,
    ):
        self.spec = spec
        self.resume = resume
        if resume is not None:
            run_dir = Path(resume["folder"]).parent.parent
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        self.run_dir = run_dir or Path(spec.runtime.output_dir) / f"{spec.name}-{spec_hash(spec)[:8]}-{stamp}"
        self.track = spec.tracking.enabled if track is None else track
        self.live = live
        self.counters = Counters(next_eval=spec.eval.every_env_steps, next_checkpoint=self._every_ckpt())
        self.tracker: MlflowTracker | None = None
        self.last_checkpoint: Path | None = None
        self.prior_info: dict[str, Any] | None = None  # what the replay actor loaded from algo.prior_data

    def check_prior_data(self, obs_dim: int, act_dim: int) -> Path | None:
        """Validate `algo.prior_data` against the spec's env (file footers only); DatasetError
        naming the file and the mismatch otherwise. Relative paths are taken from the cwd."""
        if self.spec.algo.prior_data is None:
            return None
        path = Path(self.spec.algo.prior_data).expanduser().resolve()
        try:
            read_dataset(path, expect_env_id=self.spec.env.id, expect_obs_dim=obs_dim, expect_act_dim=act_dim)
        except DatasetError as err:
            raise DatasetError(f"algo.prior_data: {err}") from None
        return path

    def _every_ckpt(self) -> int:
        return self.spec.checkpoint.every_env_steps or self.spec.budget.env_steps + 1

    # ---- building the actor graph -------------------------------------------------------------
    def _build(self, obs_dim: int, act_dim: int, prior_path: Path | None) -> None:
        spec = self.spec
        self.group = cluster.reserve(spec)
        num_learners, num_runners = spec.learners.num_learners, spec.runners.num_runners
        learner_cls = ray.remote(Learner)
        self.learner = learner_cls.options(
            num_cpus=spec.learners.cpus_per_learner,
            num_gpus=spec.learners.gpus_per_learner,
            scheduling_strategy=cluster.in_bundle(self.group, 0),
        ).remote(spec, obs_dim, act_dim)
        runner_cls = ray.remote(EnvRunner)
        self.runners = [
            runner_cls.options(
                num_cpus=spec.runners.cpus_per_runner,
                scheduling_strategy=cluster.in_bundle(self.group, num_learners + i),
            ).remote(spec, i)
            for i in range(num_runners)
        ]
        self.replay = ray.remote(ReplayBuffer).options(
            num_cpus=spec.runtime.replay_cpus,
            scheduling_strategy=cluster.in_bundle(self.group, num_learners + num_runners),
        ).remote(spec.algo.buffer_size, obs_dim, act_dim, seed=spec.seed)
        if prior_path is not None:
            ratio, gamma = spec.algo.prior_data_ratio, spec.algo.gamma
            self.prior_info = get_results(self.replay.load_prior.remote(str(prior_path), ratio, gamma, spec.env.id))

    def _restore(self, payload: dict[str, Any]) -> None:
        c = payload["counters"]
        self.counters = Counters(
            env_steps=c["env_steps"], iterations=c["iterations"], episodes=c["episodes"],
            next_eval=c["next_eval"], next_checkpoint=c["env_steps"] + self._every_ckpt(),
        )
        calls = [self.learner.load_state_dict.remote(payload["learner"])]
        replay_file = Path(payload["folder"]) / REPLAY_FILE
        if replay_file.is_file():
            calls.append(self.replay.load.remote(str(replay_file), payload["replay"]))
        for runner, state in zip(self.runners, payload["runner_rng"], strict=False):
            calls.append(runner.load_rng_state.remote(state))
        get_results(calls)

    def _publish_weights(self) -> None:
        state_ref, version_ref = self.learner.policy_state.options(num_returns=2).remote()
        for runner in self.runners:
            runner.set_weights.remote(state_ref, version_ref)

    # ---- the loop ----------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        obs_dim, act_dim = env_dims(self.spec)  # a spec whose env cannot be made stops here
        prior_path = self.check_prior_data(obs_dim, act_dim)  # so does a dataset that does not fit it
        started_ray = cluster.connect(self.spec)
        status = "FAILED"
        try:
            self._build(obs_dim, act_dim, prior_path)
            if self.resume is not None:
                self._restore(self.resume)
            self._publish_weights()
            if self.track:
                run_id = self.resume.get("mlflow_run_id") if self.resume else None
                self.tracker = MlflowTracker(self.spec, run_id=run_id)
                self.run_dir.mkdir(parents=True, exist_ok=True)
                (self.run_dir / "spec.yaml").write_text(spec_yaml(self.spec))
                self.tracker.log_artifact(self.run_dir / "spec.yaml", "spec")
            result = self._loop()
            status = "FINISHED"
            return result
        except KeyboardInterrupt:
            status = "KILLED"
            raise
        finally:
            if self.tracker is not None:
                self.tracker.finish(status)
            if hasattr(self, "group"):
                for actor in [self.learner, self.replay, *self.runners]:
                    ray.kill(actor)
                ray.util.remove_placement_group(self.group)
            if started_ray:
                ray.shutdown()

    def _loop(self) -> dict[str, Any]:
        spec, algo, c = self.spec, self.spec.algo, self.counters
        pending_stats: list[dict] = []
        if self.prior_info is not None and self.resume is None:  # a resumed normalizer already holds them
            pending_stats.append({"obs": self.prior_info["obs"], "return": (0, 0.0, 1.0, 0.0)})
        recent_returns: deque[float] = deque(maxlen=20)
        recent_distances: deque[float] = deque(maxlen=20)
        window_start, window_steps, window_updates = time.perf_counter(), 0, 0
        replay_size = 0
        learning = c.env_steps >= algo.warm_up_steps and c.env_steps > 0  # never sample an empty buffer
        stop_reason = "budget"
        with ProgressDisplay(spec.name, spec.budget.env_steps, live=self.live) as progress:
            while c.env_steps < spec.budget.env_steps:
                random_actions = c.env_steps < algo.warm_up_steps
                sampled = [
                    r.sample.options(num_returns=2).remote(algo.train_every, random_actions) for r in self.runners
                ]
                update_ref = None
                if learning:
                    num_updates = algo.train_every * algo.utd_ratio
                    batches_ref = self.replay.sample.remote(num_updates, algo.batch_size)
                    update_ref = self.learner.update.remote(batches_ref, pending_stats)
                    pending_stats = []
                    self._publish_weights()
                size_ref = self.replay.add.remote(*[transitions for transitions, _ in sampled])

                stats = get_results([s for _, s in sampled])
                metrics: dict[str, float] = get_results(update_ref) if update_ref is not None else {}
                replay_size = get_results(size_ref)
                c.iterations += 1
                for s in stats:
                    c.env_steps += s["env_steps"]
                    window_steps += s["env_steps"]
                    pending_stats.append(s["norm_stats"])
                    for episode in s["episodes"]:
                        c.episodes += 1
                        recent_returns.append(episode["return"])
                        if "final_distance" in episode:
                            recent_distances.append(episode["final_distance"])
                if update_ref is not None:
                    window_updates += algo.train_every * algo.utd_ratio
                learning = learning or (c.env_steps >= algo.warm_up_steps and c.env_steps > 0)

                elapsed = time.perf_counter() - window_start
                metrics.update({
                    "env/steps": c.env_steps,
                    "env/episodes": c.episodes,
                    "replay/size": replay_size,
                    "replay/fill": replay_size / algo.buffer_size,
                })
                if self.prior_info is not None:
                    metrics["replay/prior_size"] = self.prior_info["rows"]
                if elapsed > 2.0:
                    metrics["env/steps_per_s"] = window_steps / elapsed
                    metrics["learner/updates_per_s"] = window_updates / elapsed
                    window_start, window_steps, window_updates = time.perf_counter(), 0, 0
                if recent_returns:
                    metrics["train/episode_return"] = float(np.mean(recent_returns))
                if recent_distances:
                    metrics["train/final_distance"] = float(np.mean(recent_distances))

                done = c.env_steps >= spec.budget.env_steps
                if c.env_steps >= c.next_eval or done:
                    evaluation = self._evaluate()
                    metrics.update(evaluation)
                    c.next_eval = (c.env_steps // spec.eval.every_env_steps + 1) * spec.eval.every_env_steps
                    if self._target_reached(evaluation):
                        stop_reason = "target reached"
                        done = True
                self._log(metrics, c.env_steps)
                progress.update(c.env_steps, metrics)
                if c.env_steps >= c.next_checkpoint and not done:
                    self.save_checkpoint(f"step_{c.env_steps:09d}")
                    c.next_checkpoint += self._every_ckpt()
                    progress.message(f"checkpoint: {self.last_checkpoint}")
                if done:
                    break

            final = self.save_checkpoint("final")
            progress.message(
                f"done ({stop_reason}) at {c.env_steps:,} env steps; last eval "
                + ", ".join(f"{k} {v:.4g}" for k, v in (c.evals[-1] if c.evals else {}).items())
                + f"\ncheckpoint: {final}"
            )
        if self.tracker is not None:
            self._log_checkpoint(final)
        return {
            "env_steps": c.env_steps,
            "evals": c.evals,
            "stop_reason": stop_reason,
            "checkpoint": str(final),
            "run_dir": str(self.run_dir),
            "mlflow_run_id": self.tracker.run_id if self.tracker else None,
            "replay_size": replay_size,
            "prior_size": self.prior_info["rows"] if self.prior_info else 0,
        }

    def _evaluate(self) -> dict[str, float]:
        evaluation = get_results(self.runners[0].evaluate.remote(self.spec.eval.episodes))
        evaluation["eval/at_env_steps"] = float(self.counters.env_steps)
        self.counters.evals.append(evaluation)
        return evaluation

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
        folder = self.run_dir / "checkpoints" / name
        folder.mkdir(parents=True, exist_ok=True)
        c = self.counters
        learner_state, replay_state, runner_rng = self._collect_state()
        if self.spec.checkpoint.save_replay:
            get_results(self.replay.save.remote(str(folder / REPLAY_FILE)))
        state = {
            "counters": {
                "env_steps": c.env_steps, "iterations": c.iterations, "episodes": c.episodes,
                "next_eval": c.next_eval,
            },
            "learner": learner_state,
            "replay": replay_state,
            "runner_rng": runner_rng,
            "mlflow_run_id": self.tracker.run_id if self.tracker else None,
        }
        self.last_checkpoint = save_checkpoint(folder, self.spec, state)
        return folder

    def _collect_state(self) -> tuple[dict, dict, list]:
        learner_ref, replay_ref = self.learner.state_dict.remote(), self.replay.state.remote()
        rng_refs = [r.rng_state.remote() for r in self.runners]
        return get_results(learner_ref), get_results(replay_ref), get_results(rng_refs)
