"""The env runners as one: the driver's single call per iteration to the whole fleet.

Each call the driver submits to an actor, and each object ref it holds, costs it CPU (serializing
the call, counting the ref's borrowers), about 0.5-0.7 ms per runner on the 2-core machine of
RESULTS 27. With one sample call per runner per iteration and every chunk's ref passed on to the
replay actor, the driver's CPU per iteration grew with the fleet: 3.7 ms at 1 runner, 24.6 ms at
32. A `Fleet` takes one call per iteration and does the per-runner work itself: it calls every
runner, waits for their chunks together, adds them to the replay actor in runner order and returns
their stats, the runners that failed and the replay's new size. With replay shards
(`runtime.replay_shards`), each runner's chunks go to its shard, one add per shard.

Where it runs is the graph's choice (`runtime.fleet_actor_from`): in a large fleet, a Ray actor of
its own in learner 0's bundle (the replay actor's node), so the per-runner work leaves the driver's
process; in a small one (and always inline), a plain object in the driver's process, where it costs
no extra hop. The calls each runner and the replay actor receive, and their order, are the same
either way, so sync mode stays reproducible and the inline backend keeps repeating the Ray backend's
numbers.

Order: an iteration's chunks must join the buffer after the learners' sample of the same iteration
(the sync loop learns from the data up to the iteration before). The driver submits that sample; the
fleet, another caller as an actor, is given its refs (`after`) and waits for it to have run before
it adds (Ray orders calls per caller only).

The data stays off the driver: a runner's transitions go from its node's object store to the replay
actor; the driver sees their stats and counts only (on-policy, whose rollouts go to the learners,
it gets their refs).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aa_ray.records import ChunkStats
from aa_ray.runtime.remote import ActorLost, ObjectLost, get_each, get_results, wait_done


@dataclass
class FleetChunks:
    """One iteration of the fleet, in runner order: the stats of the chunks it kept, the runners that
    failed (with why) and, off-policy, the replay's size once it added the chunks; on-policy, the
    rollouts' refs."""

    stats: list[ChunkStats] = field(default_factory=list)
    failures: list[tuple[int, str]] = field(default_factory=list)
    replay_size: int = 0
    replay_lost: str | None = None  # the replay actor is gone (why): the driver recovers the graph
    rollouts: list[Any] = field(default_factory=list)


class Fleet:
    """Holds the runners' handles (Ray actors, or inline shells) and the replay shards' (none
    on-policy), with the shard each runner adds to."""

    def __init__(self, runners: list[Any], replays: list[Any] | None = None, shard_of: list[int] | None = None):
        self.runners, self.replays = list(runners), list(replays or [])
        self.shard_of = shard_of or [0] * len(self.runners)

    def replace(self, index: int, runner: Any) -> None:
        """Runner `index` was replaced (its predecessor failed): call this one from now on."""
        self.runners[index] = runner

    def sample(self, num_steps: int, random_actions: bool, weights: list[Any], after: list[Any]) -> FleetChunks:
        """Off-policy: every runner's `sample`, each loading `weights` (refs of the policy state and
        its version, passed on unresolved; empty: none published yet) first; then the chunks added to
        the replay actor, once the calls behind `after` (the learners' sample) have run."""
        chunks, data = self._wait([
            runner.sample.options(num_returns=2).remote(num_steps, random_actions, *weights)
            for runner in self.runners
        ])
        wait_done(after)
        try:
            chunks.replay_size, chunks.stats = self._add(data)
        except ActorLost as lost:  # told, not raised: raised in an actor it would reach the driver as an error
            chunks.replay_lost = str(lost)
        return chunks

    def sample_rollout(self, num_steps: int, weights: list[Any]) -> FleetChunks:
        """On-policy: every runner loads `weights`, then collects a rollout of `num_steps` steps per env."""
        for runner in self.runners:
            runner.set_weights.remote(*weights)
        chunks, data = self._wait([
            runner.sample_rollout.options(num_returns=2).remote(num_steps) for runner in self.runners
        ])
        chunks.rollouts = [ref for ref, _, _ in data]
        return chunks

    def _add(self, data: list[tuple[Any, ChunkStats, int]]) -> tuple[int, list[ChunkStats]]:
        """Every shard's add of its runners' chunks (in runner order), all submitted before any is
        waited for, so the shards add at once: the replay's size, and the stats of the chunks added."""
        by_shard = [[(ref, stats) for ref, stats, of in data if of == shard] for shard in range(len(self.replays))]
        pending = [replay.add.remote(*(ref for ref, _ in mine)) for replay, mine in zip(self.replays, by_shard,
                                                                                        strict=True)]
        size, kept = 0, []
        for replay, mine, add in zip(self.replays, by_shard, pending, strict=True):
            shard_size, added = self._added(replay, mine, add)
            size, kept = size + shard_size, kept + added
        return size, kept

    @staticmethod
    def _added(replay: Any, chunks: list[tuple[Any, ChunkStats]], add: Any) -> tuple[int, list[ChunkStats]]:
        """A replay shard's size once `add` (its add of these chunks: refs of their data, with their
        stats) ran, and the stats of the chunks it added. A chunk lost with its node after its runner
        returned it made the whole add fail before it ran: it is dropped with its stats, and the others
        are added again one by one."""
        try:
            return get_results(add), [stats for _, stats in chunks]
        except ObjectLost:
            kept = []
            for ref, stats in chunks:
                try:
                    get_results(replay.add.remote(ref))
                    kept.append(stats)
                except ObjectLost:
                    pass
            return get_results(replay.add.remote()), kept

    def _wait(self, sampled: list[tuple[Any, Any]]) -> tuple[FleetChunks, list[tuple[Any, ChunkStats, int]]]:
        """Every chunk's stats (one wait for all); the runners that failed; the others' (data ref,
        stats, replay shard)."""
        chunks, data = FleetChunks(), []
        outcomes = get_each([stats_ref for _, stats_ref in sampled])
        for index, ((data_ref, _), (stats, failure)) in enumerate(zip(sampled, outcomes, strict=True)):
            if failure is not None:
                chunks.failures.append((index, failure))
            else:
                data.append((data_ref, stats, self.shard_of[index]))
                chunks.stats.append(stats)
        return chunks, data
