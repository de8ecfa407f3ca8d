"""The training loops. Each `step()` runs one iteration on the actor graph and returns what it did
(`Iteration`); the trainer counts, logs, evaluates and checkpoints from that (`aa_ray.runtime.cadence`).

Sync mode (`SyncLoop`), one iteration in submission order:

    replay.sample -> learners.update     # learn from data up to iteration k-1
    learner.published_weights            # weights v(k), passed with the runners' next sample calls
    fleet: runners.sample(train_every, v(k-1))  # concurrently: load weights v(k-1), collect with them
    fleet: replay.add(new transitions)   # once replay.sample has run: this iteration's data joins

The runners are called through the graph's `Fleet` (`aa_ray.runtime.fleet`), one call per
iteration: the weights are put in the object store once and passed by reference, and the fleet adds
the chunks to the replay actor (after the learners' sample of the same iteration, whose refs the
driver hands it) and returns their stats and the replay's size. The transitions go from the runners'
object stores to the replay actor, never through the driver. In a large fleet the fleet is an actor
of its own, so the driver's work per iteration grows little with the runner count.

Async mode (`AsyncLoop`, `runtime.mode: async`): nothing waits for a whole iteration. Each runner
always has a chunk of `train_every` steps in progress and starts the next one as soon as one
returns, with the newest weights the learner has published; the learners always have the next
update queued behind the current one (its batch is sampled while they train). Two throttles keep
the run what the spec says: the learners take an update only when the runners have collected the
env steps it stands for (the UTD ratio holds on average), and the runners stop collecting when
they are two learner updates ahead. A learner update also waits while any runner acts with
weights older than `runtime.max_policy_lag` versions (the lag logged as `runtime/policy_lag_max`).
An async iteration ends when an update lands (or, before learning starts and at the budget, when
a chunk lands).

Which loop a run gets is its algorithm family's (`aa_ray.runtime.families`): the off-policy
family's `loop` is "replay" (sync or async), the on-policy family's is "rollouts".

On-policy algorithms (`OnPolicyLoop`, e.g. PPO) have no replay actor and no overlap: every runner
collects a rollout of `train_every` steps per env with the current weights, the learners update on
all of them, and the new weights reach the runners before their next rollout. An iteration in
which a runner failed is not learned from (its envs' share is missing).

A runner that fails is replaced at once (`ActorGraph.replace_runner`) and named in the iteration.
A chunk whose runner returned it and then lost its node (the transitions were in that node's
object store: `ObjectLost` when the replay actor takes them) is dropped, uncounted (by the fleet, in
sync mode), like the chunk a failed runner was collecting; the iteration's other chunks are stored.

The sync and on-policy loops drive Ray actors and `runtime.backend: inline`'s in-process ones
alike (`aa_ray.runtime.inline`); the async loop waits on whichever Ray ref lands first, so it
runs on Ray only (the spec refuses async inline).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from aa_ray import metric_names as m
from aa_ray.records import ChunkStats, EpisodeStats, LearnerReport
from aa_ray.runtime.families import family_of
from aa_ray.runtime.fleet import FleetChunks
from aa_ray.runtime.graph import ActorGraph
from aa_ray.runtime.remote import ActorLost, ObjectLost, get_or_failure, get_results
from aa_ray.spec.experiment import ExperimentSpec


@dataclass
class Iteration:
    """What one iteration did."""

    chunks: list[ChunkStats] = field(default_factory=list)  # finished chunks' stats (env steps, episodes)
    learner: LearnerReport | None = None  # rank 0's report, when an update landed
    loop_metrics: dict[str, float] = field(default_factory=dict)  # async: policy version, updates per fleet step
    policy_lags: list[int] = field(default_factory=list)  # async: versions each chunk's weights were behind

    @property
    def env_steps(self) -> int:
        return sum(stats.env_steps for stats in self.chunks)

    @property
    def episodes(self) -> list[EpisodeStats]:
        return [episode for stats in self.chunks for episode in stats.episodes]

    @property
    def updates(self) -> int:
        """Gradient updates the learners made (off-policy: replay batches trained on)."""
        return self.learner.updates if self.learner is not None else 0


def learning_started(spec: ExperimentSpec, env_steps: int, replay_size: int) -> bool:
    """Warm-up is over, and the buffer holds a batch (a run resumed from a checkpoint without its
    replay refills the buffer before sampling it)."""
    algo = spec.algo
    return env_steps >= algo.warm_up_steps and replay_size >= min(algo.batch_size, max(algo.warm_up_steps, 1))


def replay_loop(spec: ExperimentSpec, graph: ActorGraph, env_steps: int) -> SyncLoop | AsyncLoop:
    return AsyncLoop(spec, graph, env_steps) if spec.runtime.mode == "async" else SyncLoop(spec, graph, env_steps)


def rollout_loop(spec: ExperimentSpec, graph: ActorGraph, env_steps: int) -> OnPolicyLoop:
    return OnPolicyLoop(spec, graph)


LOOPS = {"replay": replay_loop, "rollouts": rollout_loop}  # a family's `loop` -> its loop


def make_loop(spec: ExperimentSpec, graph: ActorGraph, env_steps: int) -> SyncLoop | AsyncLoop | OnPolicyLoop:
    """The loop of the spec's algorithm family, starting at `env_steps` collected (the graph's
    weights are published)."""
    return LOOPS[family_of(spec).loop](spec, graph, env_steps)


def _collect(graph: ActorGraph, fleet_ref: Any, it: Iteration) -> FleetChunks:
    """Wait for the fleet's iteration; replace the runners that failed. ActorLost if the replay actor
    was found gone (the trainer rebuilds the graph)."""
    chunks: FleetChunks = get_results(fleet_ref)
    failed = [(index, graph.runners[index], failure) for index, failure in chunks.failures]
    for index, runner, failure in failed:  # a node's loss replaces all its runners at the first
        graph.replace_runner(index, failure, runner)
    if chunks.replay_lost is not None:
        raise ActorLost(f"the replay actor: {chunks.replay_lost}")
    it.chunks += chunks.stats
    return chunks


class SyncLoop:
    def __init__(self, spec: ExperimentSpec, graph: ActorGraph, env_steps: int):
        self.spec, self.graph = spec, graph
        self.env_steps = env_steps  # collected before this iteration
        self.learning = False

    def step(self) -> Iteration:
        algo, graph, it = self.spec.algo, self.graph, Iteration()
        self.learning = self.learning or learning_started(self.spec, self.env_steps, graph.replay_size)
        random_actions = self.env_steps < algo.warm_up_steps
        weights = list(graph.weights or ())  # the newest published: each runner loads them before it samples
        update = None
        if self.learning:
            update = graph.submit_update()
            graph.publish_weights(to_runners=False)  # they go with the next iteration's sample calls
        after = update.samples if update else []  # this iteration's chunks join the buffer after its sample
        chunks = _collect(graph, graph.call_fleet("sample", algo.train_every, random_actions, weights, after), it)
        if update:
            it.learner = graph.finish_update(update.updates)
        graph.replay_size = chunks.replay_size
        graph.queue_stats(it.chunks)
        self.env_steps += it.env_steps
        return it


class OnPolicyLoop:
    def __init__(self, spec: ExperimentSpec, graph: ActorGraph):
        self.spec, self.graph = spec, graph

    def step(self) -> Iteration:
        algo, graph, it = self.spec.algo, self.graph, Iteration()
        chunks = _collect(graph, graph.call_fleet("sample_rollout", algo.train_every, list(graph.weights)), it)
        rollouts = chunks.rollouts
        graph.queue_stats(it.chunks)
        if len(rollouts) == len(graph.runners):
            it.learner = graph.finish_update(graph.submit_rollouts(rollouts))
            graph.publish_weights(to_runners=False)  # they go with the next rollout's call
        return it


class ChunkInFlight(NamedTuple):
    """A chunk the async loop asked a runner for."""

    runner: int
    actor: Any  # the runner that collects it (its index may hold a replacement by the time it lands)
    transitions: Any  # ref of its data
    version: int  # of the weights it acts with


class AsyncLoop:
    def __init__(self, spec: ExperimentSpec, graph: ActorGraph, env_steps: int):
        self.spec, self.graph = spec, graph
        self.env_steps = env_steps  # collected so far, chunks of the current iteration included
        self.update_steps = spec.algo.train_every * spec.transitions_per_fleet_step  # env steps one update stands for
        self.chunk_steps = spec.algo.train_every * spec.runners.envs_per_runner
        # learner updates queued at once; a chunk starting now may see all of them land, so the
        # queue is never deeper than the lag bound
        self.depth = min(2, spec.runtime.max_policy_lag)
        self.published = int(get_results(graph.weights[1]))
        self.runner_version = [self.published] * len(graph.runners)
        self.chunks: dict[Any, ChunkInFlight] = {}  # by its stats ref
        self.updates: deque[tuple[list[Any], tuple[Any, Any]]] = deque()  # (update refs, weights refs)
        self.idle = set(range(len(graph.runners)))
        self.submitted = self.completed = 0
        self.learn_start: int | None = None  # env steps when learning started (warm-up, or a refill on resume)

    def _may_collect(self) -> bool:
        if self.learn_start is None:
            return True
        # never more than two updates' worth of env steps ahead of the learner
        ahead = self.env_steps + len(self.chunks) * self.chunk_steps - self.learn_start
        return ahead < (self.completed + 2) * self.update_steps

    def _may_update(self) -> bool:
        if self.learn_start is None or len(self.updates) >= self.depth:
            return False
        if self.submitted * self.update_steps > self.env_steps - self.learn_start:  # UTD: wait for the data
            return False
        next_version = self.published + len(self.updates) + 1
        oldest = min((chunk.version for chunk in self.chunks.values()), default=self.published)
        return next_version - oldest <= self.spec.runtime.max_policy_lag

    def _start_chunks(self) -> None:
        algo, graph = self.spec.algo, self.graph
        for index in sorted(self.idle):
            if not self._may_collect():
                break
            if self.runner_version[index] != self.published:
                graph.runners[index].set_weights.remote(*graph.weights)
                self.runner_version[index] = self.published
            random_actions = self.env_steps + len(self.chunks) * self.chunk_steps < algo.warm_up_steps
            transitions, stats_ref = graph.runners[index].sample.options(num_returns=2).remote(
                algo.train_every, random_actions
            )
            self.chunks[stats_ref] = ChunkInFlight(index, graph.runners[index], transitions, self.published)
            self.idle.discard(index)

    def step(self) -> Iteration:
        import ray  # async mode is Ray's only (never imported by an inline run)

        graph, it = self.graph, Iteration()
        while True:
            self._start_chunks()
            if self.learn_start is None and learning_started(self.spec, self.env_steps, graph.replay_size):
                self.learn_start = self.env_steps
            while self._may_update():
                self.updates.append((graph.submit_update().updates, graph.request_weights()))
                self.submitted += 1
            waiting = list(self.chunks) + ([self.updates[0][0][0]] if self.updates else [])
            [ready], _ = ray.wait(waiting, num_returns=1)
            if ready in self.chunks:
                if self._chunk_landed(ready, it):
                    return it
                continue
            update_refs, graph.weights = self.updates.popleft()
            it.learner = graph.finish_update(update_refs)
            self.completed += 1
            self.published += 1
            learned_fleet_steps = max(self.env_steps - self.learn_start, 1) / self.spec.transitions_per_fleet_step
            it.loop_metrics = {
                m.RUNTIME_UPDATES_PER_FLEET_STEP: self.completed * it.updates / learned_fleet_steps,
                m.RUNTIME_POLICY_VERSION: float(self.published),
            }
            return it

    def _chunk_landed(self, stats_ref: Any, it: Iteration) -> bool:
        """Store a finished chunk; whether the iteration ends with it (before learning, or at the budget)."""
        index, runner, transitions, version = self.chunks.pop(stats_ref)
        self.idle.add(index)
        stats, failure = get_or_failure(stats_ref)
        if failure is not None:
            self.graph.replace_runner(index, failure, runner)
            self.runner_version[index] = -1  # the replacement gets weights with its first chunk
            return False
        try:
            self.graph.add_chunk(index, transitions)
        except ObjectLost:  # the runner returned it, then lost its node: dropped (the runner is replaced next)
            return False
        it.policy_lags.append(self.published - version)
        it.chunks.append(stats)
        self.graph.queue_stats([stats])
        self.env_steps += stats.env_steps
        return self.submitted == 0 or self.env_steps >= self.spec.budget.env_steps
