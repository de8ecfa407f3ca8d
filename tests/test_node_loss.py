"""Nodes lost mid-run, for real: a local Ray cluster (`ray.cluster_utils.Cluster`: a head that runs
no actors and worker nodes, each a raylet with its own object store and logical CPUs), a small SAC
run on pusher-reach with `runtime.placement: spread` over two workers, and a worker's raylet ended
mid-run, as a spot preemption ends it, twice: first the node without learner 0 (its runners are
replaced on the other node, nothing else changes), then, once a fresh node has joined, the node
that holds learner 0 and the replay actor (Ray re-places every bundle on the fresh node and the actor
graph is rebuilt there from the last checkpoint). The run finishes its budget and its events.jsonl
names each node and what was lost with it."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
from ray.util.placement_group import placement_group_table
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from aa_ray.records import ChunkStats, Transitions
from aa_ray.runtime.fleet import Fleet
from aa_ray.runtime.remote import ObjectLost, get_results
from aa_ray.runtime.replay import ReplayBuffer
from aa_ray.runtime.trainer import Trainer
from aa_ray.spec.loader import load_spec

SPECS = Path(__file__).resolve().parents[1] / "specs"
CHECKPOINT_EVERY = 300
# the rebuilt graph runs on past the checks of its actors (at 1,200 the run had once ended, with no error, by then)
BUDGET = 1800
RUNNERS, TRAIN_EVERY = 2, 5
OVERRIDES = [
    "tracking.enabled=false", "checkpoint.save_replay=true", f"checkpoint.every_env_steps={CHECKPOINT_EVERY}",
    "algo.actor_hidden_dims=[32,32]", "algo.critic_hidden_dims=[32,32]", "algo.batch_size=64",
    "algo.warm_up_steps=200", f"algo.train_every={TRAIN_EVERY}", f"budget.env_steps={BUDGET}",
    f"runners.num_runners={RUNNERS}", "runners.cpus_per_runner=0.5", "eval.every_env_steps=600", "eval.episodes=1",
    "runtime.placement=spread",
]
# The GCS declares a node dead once its health checks fail: by default 5 checks 3 s apart (15 s and
# more). A test cluster checks more often; the runtime waits for the verdict however long it takes.
FAST_HEALTH_CHECKS = {"health_check_period_ms": 500, "health_check_failure_threshold": 3,
                      "health_check_timeout_ms": 1000}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """A head with no CPUs for actors (the driver's node) and two workers of 4 logical CPUs each: any
    worker alone can hold the whole run (1.5 CPUs for learner 0 and the replay, 2 x 0.5 for the runners)."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "include_dashboard": False, "_system_config": FAST_HEALTH_CHECKS,
    })
    for _ in range(2):
        add_worker(cluster)
    ray.init(address=cluster.address)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def add_worker(cluster: Any) -> Any:
    node = cluster.add_node(num_cpus=4, object_store_memory=150 * 2**20)
    cluster.wait_for_nodes()
    return node


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def events(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def nodes_of(trainer: Trainer, actors: list[Any]) -> list[str]:
    """The node each actor runs on, as it told the runtime when it started (an answer that outlives the
    actor, should the run end and kill it first)."""
    return ray.get([trainer.graph.actors.node_refs[actor] for actor in actors], timeout=60)


def test_a_chunk_lost_after_its_runner_returned_it_is_dropped_and_the_others_are_stored(cluster: Any) -> None:
    """A runner's chunk waits in its node's object store until the replay actor takes it; lost with
    the node, it fails the whole add before the add runs (ObjectLost). The fleet drops that chunk with
    its stats and stores the others. The chunk is put by an actor on a node of its own, which is then
    ended: its only copy goes with that node's object store. (A killed owner on a node that lives on
    was not enough: its object's copy could outlive it there and the add found it, twice in CI.)"""

    @ray.remote(num_cpus=0)
    class Owner:
        def chunk(self) -> list[Any]:
            return [ray.put(Transitions.empty(7, 3, 2))]

    doomed = add_worker(cluster)
    owner = Owner.options(scheduling_strategy=NodeAffinitySchedulingStrategy(doomed.node_id, soft=False)).remote()
    [lost] = ray.get(owner.chunk.remote())
    cluster.remove_node(doomed)
    replay = ray.remote(ReplayBuffer).options(num_cpus=0).remote(100, 3, 2, seed=0)
    data = [ray.put(Transitions.empty(5, 3, 2)), lost, ray.put(Transitions.empty(11, 3, 2))]
    with pytest.raises(ObjectLost, match="an object it needed was lost"):
        get_results(replay.add.remote(*data))
    stats = [ChunkStats(rows, [], 0, None) for rows in (5, 7, 11)]
    size, kept = Fleet._added(replay, list(zip(data, stats, strict=True)), replay.add.remote(*data))
    assert size == 16 and [chunk.env_steps for chunk in kept] == [5, 11]
    ray.kill(replay)


def test_lost_nodes_cost_at_most_the_work_since_the_last_checkpoint(cluster: Any, tmp_path: Path) -> None:
    start = time.monotonic()
    run_dir = tmp_path / "run"
    trainer = Trainer(load_spec(SPECS / "sac.yaml", OVERRIDES), run_dir=run_dir, live=False)
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = trainer.run()
        except Exception as err:  # what the user would see
            outcome["error"] = err

    def logged(kind: str, count: int = 1) -> Callable[[], bool]:
        return lambda: sum(e["event"] == kind for e in events(run_dir)) >= count or not thread.is_alive()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    wait_for(lambda: trainer.last_checkpoint is not None or not thread.is_alive(), "the first checkpoint")
    assert "error" not in outcome, outcome.get("error")
    marks = {"first checkpoint": time.monotonic() - start}

    # where Ray put each bundle, read from the placement group's own table (the replay shares learner 0's)
    workers = {node.node_id: node for node in cluster.worker_nodes}
    bundle_nodes = placement_group_table(trainer.graph.actors.group)["bundles_to_node_id"]
    assert set(bundle_nodes.values()) == set(workers), f"spread should use both workers: {bundle_nodes}"
    learners_node = bundle_nodes[0]
    runners_node = next(node for node in workers if node != learners_node)  # so it holds a runner or two
    first_lost = {f"env runner {bundle - 1}" for bundle, node in bundle_nodes.items() if node == runners_node}
    assert first_lost and nodes_of(trainer, trainer.learners) == [learners_node]

    # 1. the node without learner 0: its runners are replaced on the other node, the run goes on
    wait_for(lambda: trainer.counters.env_steps >= CHECKPOINT_EVERY + 60, "a few steps past the checkpoint")
    marks["runners' node killed"] = time.monotonic() - start
    cluster.remove_node(workers[runners_node], allow_graceful=False)  # its raylet ends: the node is gone
    wait_for(logged("runner_restart", len(first_lost)), "the runners replaced")
    assert thread.is_alive() and trainer.graph_restarts == 0
    assert nodes_of(trainer, trainer.runners) == [learners_node] * RUNNERS
    marks["runners replaced"] = time.monotonic() - start

    # 2. a fresh node joins; the node of learner 0 and the replay (and now every runner) is lost
    fresh = add_worker(cluster).node_id
    wait_for(lambda: trainer.counters.env_steps >= 2 * CHECKPOINT_EVERY + 60, "a few steps past a later checkpoint")
    marks["learner's node killed"] = time.monotonic() - start
    cluster.remove_node(workers[learners_node], allow_graceful=False)
    wait_for(logged("actor_graph_restart"), "the actor graph rebuilt")
    assert thread.is_alive(), outcome  # the rebuilt runners, learner and replay live on the fresh node
    assert nodes_of(trainer, [*trainer.learners, *trainer.graph.replays, *trainer.runners]) == [fresh] * (2 + RUNNERS)
    marks["graph rebuilt"] = time.monotonic() - start
    thread.join(timeout=240)
    marks["run finished"] = time.monotonic() - start

    assert "error" not in outcome, outcome.get("error")
    result = outcome["result"]
    assert result.env_steps >= BUDGET and result.stop_reason == "budget"
    assert result.graph_restarts == 1 and result.runner_restarts >= len(first_lost)
    log = events(run_dir)
    print("node loss test:", ", ".join(f"{mark} at {seconds:.1f} s" for mark, seconds in marks.items()))
    lost = [e for e in log if e["event"] == "node_lost"]
    everything = {"learner 0", "replay", *(f"env runner {index}" for index in range(RUNNERS))}
    assert [(e["node_id"], set(e["actors"])) for e in lost] == [(runners_node, first_lost),
                                                               (learners_node, everything)], log
    replaced = [e for e in log if e["event"] == "runner_restart"]
    assert {(e["node_lost"], f"env runner {e['runner']}") for e in replaced[:len(first_lost)]} == {
        (runners_node, name) for name in first_lost}
    # a runner on the second node may have been found gone (and replaced) before the learner was
    assert all(e["node_lost"] == learners_node for e in replaced[len(first_lost):])
    restarts = [e for e in log if e["event"] == "actor_graph_restart"]
    assert len(restarts) == 1 and restarts[0]["nodes_lost"] == [learners_node], log
    restart = restarts[0]
    assert {"learner 0", "replay"} <= set(restart["lost"])
    assert restart["resumed_from"].startswith(str(run_dir / "checkpoints" / "step_"))
    assert restart["replay_size"] == restart["env_steps"] >= 2 * CHECKPOINT_EVERY  # the checkpoint's replay, whole
    # what the lost node cost: the env steps since that checkpoint, at most its interval and an iteration
    assert restart["lost_at_env_steps"] - restart["env_steps"] <= CHECKPOINT_EVERY + RUNNERS * TRAIN_EVERY

