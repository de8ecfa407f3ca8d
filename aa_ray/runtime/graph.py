"""The actor graph: one run's learners, env runners and replay actor, in its placement group.

Each actor is a thin shell around a plain class that tests use in-process (`Learner`, a runner
of the spec's kind (`runners.py`), `ReplayBuffer`), made by the spec's backend (`actor_backend`,
chosen here only):
`runtime.backend: ray` makes `ray.remote(PlainClass)` actors in the run's placement group
(`cluster.RayActors`), `inline` makes in-process shells with the same call interface
(`aa_ray.runtime.inline`), so this module and the loops drive both alike. The group's bundles are
`spec.bundles()` in order: L learners (the replay actor shares learner 0's), then R runners.

Data never passes through the driver: transitions go runner -> replay and replay -> learners,
weights learner 0 -> runners, all as object refs. Every call is coarse (one per actor per
iteration), and the driver's to the runners go through the `Fleet` (`aa_ray.runtime.fleet`): from
`runtime.fleet_actor_from` runners on an actor of its own, so the driver makes one call per
iteration whatever the fleet's size. Ray runs each actor's calls in the order they were
submitted, which is what keeps sync mode reproducible for a fixed seed.

With several learners, learner 0 opens the torch process group's rendezvous on its own node's
address and every learner joins it; each is then given its own shard of every global batch.

Faults: a runner that died or raised is replaced in its own bundle by a new incarnation (fresh
seeds, so it does not replay its predecessor's episodes); a dead learner or replay actor means
rebuilding the whole graph (`rebuild`), after which the trainer loads the last checkpoint into it.
A lost node (its raylet ended: a spot preemption, a crash) is both at once for the actors it held.
Before replacing any, the graph waits for Ray's verdict on a gone actor (`RayActors.lost_nodes`:
at first Ray only cannot reach it, until the GCS declares its node dead) and then for the
placement group to have re-placed the lost node's bundles on the surviving nodes
(`await_placement`), so the replacements start there, every runner the node held at once; the loss
is queued for the driver to tell (`take_node_losses`). Runners replaced because their node was lost
do not count toward `runtime.max_runner_restarts` (that limit is for runners that crash).
Inline actors are neither replaced nor rebuilt: an exception in one ends the run.

Replay shards (`runtime.replay_shards` > 1): several replay actors, each taking the chunks of its
block of runners (`spec.replay_shard_of`); every learner's sample is drawn from all of them, each
its part of every batch (`records.rows_per_replay_shard`), and the learner lays the parts side by
side. Shard 0 sits in learner 0's bundle, each other in its first runner's.

RLPD (`algo.prior_data` set): the replay actor (shard 0) loads the dataset into its prior buffer,
and every batch it samples is `[prior rows | online rows]` at `algo.prior_data_ratio`; the dataset's
observations seed the observation normalizer's statistics (`queue_prior_stats`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from aa_ray.records import (
    Checkpoint,
    ChunkStats,
    LearnerReport,
    LearnerState,
    NormMoments,
    ObsDims,
    PriorData,
    prior_rows,
    return_moments,
    rows_per_replay_shard,
)
from aa_ray.runtime.checkpoint import REPLAY_FILE
from aa_ray.runtime.cluster import NodeLoss, RayActors
from aa_ray.runtime.device_learner import DeviceLearner
from aa_ray.runtime.fleet import Fleet
from aa_ray.runtime.inline import InlineActors
from aa_ray.runtime.learner import Learner
from aa_ray.runtime.metrics import run_tag
from aa_ray.runtime.remote import ActorLost, LearnerFailed, Ready, TrainingError, get_each, get_results
from aa_ray.runtime.replay import ReplayBuffer, join_shards, split_shards
from aa_ray.runtime.runners import runner_class
from aa_ray.spec.experiment import ExperimentSpec


class ActorsSnapshot(NamedTuple):
    """The actors' part of a checkpoint."""

    learner: LearnerState  # learner 0's (every learner holds the same)
    replay: dict[str, Any]  # the replay buffer's state (its shards' in a list); empty without one
    runners: list[dict[str, Any]]  # every runner's state (runtime.mode device: every learner's envs and ring)
    replay_table: Any  # the replay buffer's rows (a pyarrow Table, every shard's), when asked for and there is one


class QueuedUpdate(NamedTuple):
    """Refs of one learner iteration: every learner's update, and the replay's sample it learns from."""

    updates: list[Any]  # one per learner: its LearnerReport
    samples: list[Any]  # the replay shards' samples, every shard's for each learner


class RunnerRestart(NamedTuple):
    runner: int
    reason: str
    restarts: int  # the run's runner restarts so far, this one included
    node: str | None = None  # the id of the lost node the runner was on, if that is why it went


def actor_backend(spec: ExperimentSpec, learning: bool = True) -> RayActors | InlineActors:
    """What makes the run's actors: Ray actors in a placement group (which this reserves), or
    `runtime.backend: inline`'s plain objects in this process."""
    return InlineActors() if spec.runtime.backend == "inline" else RayActors(spec, learning)


class ActorGraph:
    """Makes, feeds, restores and rebuilds the run's actors. Creating one reserves the placement
    group (inside a Tune trial: takes the trial's; inline: none); `start` makes the actors, `close`
    ends both."""

    def __init__(
        self, spec: ExperimentSpec, obs: ObsDims, act_dim: int, prior_path: Path | None = None, learning: bool = True,
        runner: type | None = None,
    ):
        """`learning=False`: runners only (a rollout with given weights), in bundles of their own.
        `runner`: the class each runner is (default: the spec's runner kind, `runners.runner_class`)."""
        self.spec, self.learning = spec, learning
        self.runner_class = runner or runner_class(spec)
        self.obs, self.act_dim, self.prior_path = obs, act_dim, prior_path
        self.actors = actor_backend(spec, learning)
        self.first_runner_bundle = spec.learners.num_learners if learning else 0
        self.learners: list[Any] = []
        self.runners: list[Any] = []
        self.fleet: Any | None = None  # the loops' one call per iteration to every runner (`aa_ray.runtime.fleet`)
        self.fleet_is_actor = False  # a Ray actor of its own, not a plain object in this process
        self.replays: list[Any] = []  # the replay shards (one replay actor by default); none on-policy
        self.prior_info: PriorData | None = None  # what the replay actor loaded from algo.prior_data
        self.weights: tuple[Any, Any] | None = None  # refs of the newest published (policy state, version)
        self.pending_stats: list[NormMoments] = []  # runners' normalizer moments the learners have not merged yet
        self.replay_size = 0  # transitions in the replay shards together
        self.shard_sizes: list[int] = []  # each replay shard's, as the async loop's adds return them
        self.runner_restarts = 0
        self.runners_lost_with_nodes = 0  # the restarts that were not the runner's own fault
        self.unreported_restarts: list[RunnerRestart] = []  # replaced runners the driver has not told yet
        self.lost_node_ids: set[str] = set()  # the nodes lost in this run
        self.unreported_node_losses: list[NodeLoss] = []

    # ---- making and ending the actors ------------------------------------------------------------
    def start(self) -> None:
        """Start every actor in its bundle; several learners join one process group; the replay
        actor loads the RLPD dataset."""
        spec = self.spec
        if not self.learning:
            self.runners = [self._make_runner(index) for index in range(spec.runners.num_runners)]
            self._check_envs(self.runners, "env runner")
            return
        device_mode = spec.runtime.mode == "device"  # each learner steps its own envs into its own ring
        self.learners = [
            self.actors.start(
                DeviceLearner if device_mode else Learner, spec, self.obs, self.act_dim, rank,
                bundle=rank, num_cpus=spec.learners.cpus_per_learner, num_gpus=spec.learners.gpus_per_learner,
                torch_threads=spec.learners.torch_threads,
            )
            for rank in range(spec.learners.num_learners)
        ]
        if device_mode:
            self._check_envs(self.learners, "device learner")
        else:
            self.runners = [self._make_runner(index) for index in range(spec.runners.num_runners)]
            self._check_envs(self.runners, "env runner")
        if spec.algo.replay_actor and not device_mode:
            self.replays = [self._make_replay(shard) for shard in range(spec.runtime.replay_shards)]
            self.shard_sizes = [0] * len(self.replays)
        if not device_mode:
            self._start_fleet()
        if len(self.learners) > 1:  # Ray only: the spec refuses several learners inline
            host = self.actors.node_ip(0)  # learner 0's node
            address = get_results(self.learners[0].rendezvous_address.remote(host))
            get_results([learner.join.remote(address) for learner in self.learners])
        if self.prior_path is not None:
            algo = spec.algo
            self.prior_info = get_results(
                self.replays[0].load_prior.remote(str(self.prior_path), algo.prior_data_ratio, algo.gamma, spec.env.id)
            )

    def _check_envs(self, actors: list[Any], what: str) -> None:
        """Each actor that steps envs made the env, and the same one the driver did: a worker without
        the user's env package (or with another version of it) fails here, naming the actor's own
        error, before any training (ActorStartFailed is never retried)."""
        for index, dims in enumerate(get_results([actor.env_dims.remote() for actor in actors])):
            if tuple(dims) != (self.obs, self.act_dim):
                raise TrainingError(
                    f"{what} {index} made {self.spec.env.id} with observations {dims[0]} and {dims[1]} actions, "
                    f"but the driver made it with {self.obs} and {self.act_dim}: the workers have another version of "
                    "the env's code; ship it with env.py_modules (or ray job submit --working-dir)"
                )

    def _start_fleet(self) -> None:
        """A fleet actor in learner 0's bundle from `runtime.fleet_actor_from` runners on (Ray only);
        below that, and inline, a plain `Fleet` in this process."""
        self.fleet_is_actor = (self.spec.runtime.backend == "ray"
                               and len(self.runners) >= self.spec.runtime.fleet_actor_from)
        if self.fleet_is_actor:
            self.fleet = self.actors.start(Fleet, self.runners, self.replays, self._shard_of_runner(), bundle=0,
                                           num_cpus=0)
        else:
            self.fleet = Fleet(self.runners, self.replays, self._shard_of_runner())

    def _shard_of_runner(self) -> list[int]:
        return [self.spec.replay_shard_of(index) for index in range(len(self.runners))]

    def call_fleet(self, method: str, *args: Any) -> Any:
        """Submit one call to the fleet: a ref of its result (in this process: run at once, a `Ready`;
        its exceptions, a runner's in an inline run, are raised as they are)."""
        if self.fleet_is_actor:
            return getattr(self.fleet, method).remote(*args)
        return Ready(getattr(self.fleet, method)(*args))

    def _make_replay(self, shard: int) -> Any:
        spec, shards = self.spec, self.spec.runtime.replay_shards
        # shard 0 in learner 0's bundle (its node: the samples reach learner 0 through shared memory)
        bundle = 0 if shard == 0 else self.first_runner_bundle + spec.first_runner_of_replay_shard(shard)
        return self.actors.start(
            ReplayBuffer, -(-spec.algo.buffer_size // shards), self.obs.full, self.act_dim, seed=spec.seed,
            run=run_tag(spec), obs_groups=self.obs.groups, shard=shard,
            bundle=bundle, num_cpus=spec.runtime.replay_cpus,
        )

    def _make_runner(self, index: int, incarnation: int = 0) -> Any:
        return self.actors.start(
            self.runner_class, self.spec, index, incarnation,
            bundle=self.first_runner_bundle + index, num_cpus=self.spec.runners.cpus_per_runner,
            torch_threads=self.spec.runners.torch_threads,
        )

    def kill(self) -> None:
        # the runners let go of their envs first: Ray ends an actor's process with SIGTERM, and its
        # handler raising inside a vector env's __del__ printed a traceback on the user's console
        self.actors.wait_briefly([runner.close.remote() for runner in self.runners], timeout_s=5.0)
        for actor in [*self.learners, *self.replays, *self.runners, self.fleet if self.fleet_is_actor else None]:
            if actor is not None:
                self.actors.kill(actor)
        self.learners, self.runners, self.replays, self.fleet, self.fleet_is_actor = [], [], [], None, False

    def close(self) -> None:
        """Kill the actors and give back the placement group (if this graph reserved it)."""
        self.kill()
        self.actors.close()

    # ---- faults ----------------------------------------------------------------------------------
    def replace_runner(self, index: int, reason: str, failed: Any) -> None:
        """Replace runner `index` (`failed`, the actor whose call failed) in its bundle with a new
        incarnation, queued for `take_restarts`. If its node was lost, every runner that node held goes
        with it, after the node's bundles were re-placed: an actor on a dead raylet's node can answer
        for a while before it ends, and one found later (by a checkpoint's call, say) would otherwise
        look like a lost learner. A failure of a runner already replaced that way is ignored.
        TrainingError past `runtime.max_runner_restarts` runner crashes. The chunk it was collecting
        is lost, the replay buffer is not."""
        if self.runners[index] is not failed:
            return
        lost = self.settle_lost_nodes([failed])
        if not lost:
            self._restart_runner(index, reason, node=None)
            return
        on_lost_nodes = {name: loss.node_id for loss in lost for name in loss.actors}
        for other in range(len(self.runners)):
            node = on_lost_nodes.get(f"env runner {other}")
            if other == index or node is not None:
                self._restart_runner(other, reason if other == index else f"its node {node} was lost",
                                     node=node or lost[0].node_id)

    def _restart_runner(self, index: int, reason: str, node: str | None) -> None:
        """A new incarnation of runner `index` in its bundle (`node`: the lost node the old one was on)."""
        self.runner_restarts += 1
        self.runners_lost_with_nodes += node is not None
        limit = self.spec.runtime.max_runner_restarts
        if self.runner_restarts - self.runners_lost_with_nodes > limit:
            raise TrainingError(
                f"env runner {index} failed ({reason}) after runtime.max_runner_restarts={limit} restarts "
                "in this run; fix the env (or raise the limit) and resume from the last checkpoint"
            )
        self.actors.kill(self.runners[index])  # one whose env raised is still alive and holds its bundle
        self.runners[index] = self._make_runner(index, incarnation=self.runner_restarts)
        if self.weights is not None:
            self.runners[index].set_weights.remote(*self.weights)
        if self.fleet is not None:
            self.call_fleet("replace", index, self.runners[index])
        self.unreported_restarts.append(RunnerRestart(index, reason, self.runner_restarts, node))

    def settle_lost_nodes(self, gone: list[Any]) -> list[NodeLoss]:
        """The nodes lost with these gone actors (none if each died alone). For a lost node, once Ray
        has declared it dead, wait until its bundles are placed on the surviving nodes (ResourceError
        if they cannot hold them within `runtime.resource_timeout_s`); a node not seen lost before is
        queued for `take_node_losses`."""
        lost = self.actors.lost_nodes(gone, self._named())
        if lost:
            self.actors.await_placement(self.spec.runtime.resource_timeout_s)
        for loss in lost:
            if loss.node_id not in self.lost_node_ids:
                self.lost_node_ids.add(loss.node_id)
                self.unreported_node_losses.append(loss)
        return lost

    def take_node_losses(self) -> list[NodeLoss]:
        """The lost nodes since the last call."""
        losses, self.unreported_node_losses = self.unreported_node_losses, []
        return losses

    def take_restarts(self) -> list[RunnerRestart]:
        """The runner restarts since the last call. Kept here, not in an iteration's result, so that
        one is reported even when a learner or the replay dies later in the same iteration."""
        restarts, self.unreported_restarts = self.unreported_restarts, []
        return restarts

    def rebuild(self, lost: list[str] | None = None) -> list[NodeLoss]:
        """After a learner or the replay actor died (`lost`: the names of the actors that are gone):
        every actor replaced in the same bundles (re-placed first, if a node was lost with them), empty.
        The caller loads a checkpoint into them (`restore`) or starts over. Returns the nodes lost with
        the gone actors."""
        lost_nodes = self.settle_lost_nodes([actor for name, actor in self._named() if name in (lost or [])])
        # whatever was lost (an object, say, whose node is gone), the group is whole on live nodes first
        self.actors.await_placement(self.spec.runtime.resource_timeout_s)
        self.kill()
        self.pending_stats, self.replay_size, self.weights = [], 0, None
        self.start()
        return lost_nodes

    def dead_actors(self) -> list[str]:
        """Names of the actors that are gone (a busy one, e.g. a learner waiting on a dead peer's
        collective, does not answer within the timeout and is not counted)."""
        return self.actors.dead(self._named())

    def _named(self) -> list[tuple[str, Any]]:
        named = [(f"learner {rank}", learner) for rank, learner in enumerate(self.learners)]
        named += [("replay" if len(self.replays) == 1 else f"replay shard {shard}", replay)
                  for shard, replay in enumerate(self.replays)]
        named += [("fleet", self.fleet)] if self.fleet_is_actor else []
        return named + [(f"env runner {index}", runner) for index, runner in enumerate(self.runners)]

    # ---- checkpoints -----------------------------------------------------------------------------
    def snapshot(self, with_replay_table: bool) -> ActorsSnapshot:
        """The actors' part of a checkpoint: learner 0's state, the replay buffer's state (and its
        rows as a table, if asked), every runner's state."""
        learner_ref = self.learners[0].state_dict.remote()
        if self.spec.runtime.mode == "device":  # each learner's envs and replay ring are its "runner"
            with_ring = self.spec.checkpoint.save_replay
            runner_refs = [learner.runner_state.remote(with_ring) for learner in self.learners]
            return ActorsSnapshot(get_results(learner_ref), {}, get_results(runner_refs), None)
        state_refs = [replay.state.remote() for replay in self.replays]
        table_refs = [replay.to_table.remote() for replay in self.replays] if with_replay_table else []
        runner_refs = [runner.state.remote() for runner in self.runners]
        states, tables = get_results(state_refs), get_results(table_refs)
        replay_state = {} if not states else states[0] if len(states) == 1 else {"shards": states}
        replay_table = join_shards(tables) if tables else None
        return ActorsSnapshot(get_results(learner_ref), replay_state, self._runner_states(runner_refs), replay_table)

    def _runner_states(self, refs: list[Any]) -> list[dict[str, Any]]:
        """The runners' states from their `state` calls (`refs`). A runner found gone here is replaced
        as the loops replace one (with the rest of its node's, if the node was lost), and the checkpoint
        holds its replacement's state: a runner lost between two iterations costs its chunk, not the
        graph."""
        asked = list(self.runners)
        outcomes = get_each(refs)
        for index, (_, failure) in enumerate(outcomes):
            if failure is not None:
                self.replace_runner(index, failure, asked[index])
        return [state if self.runners[index] is asked[index] else get_results(self.runners[index].state.remote())
                for index, (state, _) in enumerate(outcomes)]

    def restore(self, checkpoint: Checkpoint, replay_table: Any) -> None:
        """Load a checkpoint's learner, replay and runner state into the actors."""
        calls = [learner.load_state_dict.remote(checkpoint.learner) for learner in self.learners]
        if self.replays and replay_table is not None:
            source = str(checkpoint.folder / REPLAY_FILE)
            tables, states = split_shards(replay_table, checkpoint.replay, len(self.replays))
            calls += [replay.load_table.remote(table, state, source)
                      for replay, table, state in zip(self.replays, tables, states, strict=True)]
            self.shard_sizes = [table.num_rows for table in tables]
            self.replay_size = replay_table.num_rows
        runner_states = checkpoint.runners
        for runner, state in zip(self.runners, runner_states, strict=False):
            calls.append(runner.load_state.remote(state))
        if self.spec.runtime.mode == "device":
            calls += [learner.load_runner_state.remote(state)
                      for learner, state in zip(self.learners, runner_states, strict=False)]
        get_results(calls)
        if self.spec.runtime.mode == "device":
            self.replay_size = sum(get_results([learner.replay_size.remote() for learner in self.learners]))

    def queue_prior_stats(self) -> None:
        """Seed the normalizer with the RLPD dataset's observations (a fresh start; a restored
        normalizer already holds them)."""
        if self.prior_info is not None:
            # a dataset's observation moments join the normalizer like a runner's; its returns do not
            self.pending_stats.append(NormMoments(self.prior_info.obs, return_moments([])))

    # ---- weights and updates ---------------------------------------------------------------------
    def load_runner_weights(self, state: dict[str, Any]) -> None:
        """Give every runner these policy weights (a checkpoint's, for a rollout: no learner here)."""
        self.weights = (state, 0)
        get_results([runner.set_weights.remote(state, 0) for runner in self.runners])

    def request_weights(self) -> tuple[Any, Any]:
        """Refs of learner 0's (policy state as numpy arrays, version), queued behind its updates so far."""
        return self.learners[0].published_weights.options(num_returns=2).remote()

    def publish_weights(self, to_runners: bool = True) -> None:
        """Request learner 0's newest weights and send them to every runner; with `to_runners` off,
        only request them: the sync loop passes them with each runner's next sample call instead (one
        call per runner per iteration, the weights themselves put in the object store once)."""
        self.weights = self.request_weights()
        if to_runners:
            for runner in self.runners:
                runner.set_weights.remote(*self.weights)

    def queue_stats(self, chunk_stats: list[ChunkStats]) -> None:
        """Finished chunks' normalizer moments, for the learners' next update to merge."""
        self.pending_stats += [stats.moments for stats in chunk_stats]

    def add_chunk(self, runner: int, transitions: Any) -> None:
        """The async loop's add: runner `runner`'s chunk (a ref) into its replay shard, at once.
        ObjectLost when the chunk was lost with its runner's node."""
        shard = self.spec.replay_shard_of(runner)
        self.shard_sizes[shard] = get_results(self.replays[shard].add.remote(transitions))
        self.replay_size = sum(self.shard_sizes)

    def submit_update(self) -> QueuedUpdate:
        """Queue one learner iteration on every learner: a global stack of the algorithm's
        `updates_per_iteration` batches from the replay actor, one shard per learner, and the
        normalizer moments to merge."""
        algo, num_learners = self.spec.algo, len(self.learners)
        if len(self.replays) == 1:
            parts = [self.replays[0].sample_for_learners.options(num_returns=num_learners).remote(
                algo.updates_per_iteration, algo.batch_size, num_learners
            )]
        else:  # every shard its part of every learner's batches
            rows = algo.batch_size // num_learners
            prior = prior_rows(rows, algo.prior_data_ratio) if self.prior_info is not None else 0
            split = rows_per_replay_shard(rows, prior, len(self.replays))
            parts = [replay.sample_part.options(num_returns=num_learners).remote(
                algo.updates_per_iteration, n_prior, n_online, num_learners
            ) for replay, (n_prior, n_online) in zip(self.replays, split, strict=True)]
        per_learner = [[part] if num_learners == 1 else part for part in parts]  # [shard][learner]
        updates = [learner.update.remote(self.pending_stats, *(shard[rank] for shard in per_learner))
                   for rank, learner in enumerate(self.learners)]
        self.pending_stats = []
        return QueuedUpdate(updates, [ref for shard in per_learner for ref in shard])

    def submit_rollouts(self, rollouts: list[Any]) -> list[Any]:
        """Queue an update on all of this iteration's rollouts on every learner (each takes its share)."""
        updates = [learner.update.remote(self.pending_stats, *rollouts) for learner in self.learners]
        self.pending_stats = []
        return updates

    def finish_update(self, update_refs: list[Any]) -> LearnerReport:
        """Rank 0's metrics of a submitted update. ActorLost when a learner died (the trainer
        recovers), LearnerFailed when one raised (the run stops)."""
        try:
            return get_results(update_refs)[0]
        except ActorLost:
            raise
        except TrainingError as err:
            raise LearnerFailed(f"a learner failed, so the run stopped ({err})") from None

    def evaluate(self, episodes: int) -> dict[str, float]:
        """Runner 0 evaluates the newest weights (its replacement does, when it died doing so); in
        `runtime.mode: device`, learner 0 on envs of its own."""
        if self.spec.runtime.mode == "device":
            return get_results(self.learners[0].evaluate.remote(episodes))
        self.runners[0].set_weights.remote(*self.weights)  # async: it may still act with older weights
        evaluator = self.runners[0]
        try:
            return get_results(evaluator.evaluate.remote(episodes))
        except ActorLost as lost:
            self.replace_runner(0, str(lost), evaluator)
            return get_results(self.runners[0].evaluate.remote(episodes))

    def record_video(self, max_frames: int) -> tuple[bytes | None, str | None]:
        if not self.runners:
            return None, "eval video skipped: runtime.mode device renders no frames; set eval.video: false"
        return get_results(self.runners[0].record_video.remote(max_frames))
