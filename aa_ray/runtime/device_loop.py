"""The loop of `runtime.mode: device`: every learner process steps its own env copies, stores them in
its own replay ring and trains on it (`aa_ray.runtime.device_learner`), so an iteration is one call
per learner and nothing moves between actors but counts, episodes and metrics.

    learners.iterate(train_every, random_actions, learn)     # all ranks at once; DDP keeps them in step
    learners.replay_size()                                   # what the rings can draw (read in that iteration)

Warm-up and the start of learning are decided as in the sync loop (`learning_started`), from the env
steps collected before the iteration and the rings' size after the last one. Unlike the sync loop, an
iteration learns from data that includes its own collection: the env and the learner share one
process, so there is nothing to overlap. Ray and the inline backend are driven alike
(`remote.get_results`).
"""

from __future__ import annotations

from aa_ray.runtime.graph import ActorGraph
from aa_ray.runtime.loops import Iteration, learning_started
from aa_ray.runtime.remote import ActorLost, LearnerFailed, TrainingError, get_results
from aa_ray.spec.experiment import ExperimentSpec


class DeviceLoop:
    """`graph.learners` are `DeviceLearner` shells (one per learner process); the graph has no runners
    and no replay actor, and its `replay_size` is the learners' rings together."""

    def __init__(self, spec: ExperimentSpec, graph: ActorGraph, env_steps: int):
        self.spec, self.graph = spec, graph
        self.env_steps = env_steps  # collected before this iteration
        self.learning = False

    def step(self) -> Iteration:
        algo, graph = self.spec.algo, self.graph
        self.learning = self.learning or learning_started(self.spec, self.env_steps, graph.replay_size)
        random_actions = self.env_steps < algo.warm_up_steps
        calls = [learner.iterate.remote(algo.train_every, random_actions, self.learning)
                 for learner in graph.learners]
        sizes = [learner.replay_size.remote() for learner in graph.learners]
        try:
            results = get_results(calls)
            graph.replay_size = sum(get_results(sizes))
        except ActorLost:  # the trainer rebuilds the graph from the last checkpoint
            raise
        except TrainingError as err:  # an env or a learner raised: the same data would fail the same way
            raise LearnerFailed(f"a device learner failed, so the run stopped ({err})") from None
        it = Iteration(chunks=[stats for stats, _ in results], learner=results[0][1])
        self.env_steps += it.env_steps
        return it
