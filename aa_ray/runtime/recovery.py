"""Faults the run survives. A runner that died was already replaced by the graph: here it is told
(an event and `runtime/runner_restarts`). A learner or the replay actor that died takes the whole actor
graph back to the run's last checkpoint (to the start if there is none yet), in the same MLflow run,
up to `runtime.max_learner_restarts` times; the env steps since that checkpoint are collected again,
and the metrics of those steps are logged twice. A node lost with some of the actors is told first
(a `node_lost` event naming the node and the actors it held), then what was done about each.
"""

from __future__ import annotations

from aa_ray import metric_names as m
from aa_ray.runtime.driver_state import DriverState
from aa_ray.runtime.graph import ActorGraph
from aa_ray.runtime.remote import TrainingError
from aa_ray.runtime.run_checkpoints import RunCheckpoints
from aa_ray.runtime.run_record import RunRecord
from aa_ray.spec.experiment import ExperimentSpec


class Recovery:
    def __init__(self, spec: ExperimentSpec, graph: ActorGraph, checkpoints: RunCheckpoints, record: RunRecord):
        self.spec, self.graph, self.checkpoints, self.record = spec, graph, checkpoints, record
        self.graph_restarts = 0  # the actor graph rebuilt after a learner or the replay actor died

    def report_node_losses(self, env_steps: int) -> None:
        for loss in self.graph.take_node_losses():
            self.record.event("node_lost", env_steps, node_id=loss.node_id, ip=loss.ip, actors=loss.actors)

    def report_runner_restarts(self, env_steps: int) -> None:
        self.report_node_losses(env_steps)
        for restart in self.graph.take_restarts():
            where = {"node_lost": restart.node} if restart.node else {}
            self.record.event("runner_restart", env_steps, runner=restart.runner, reason=restart.reason,
                              restarts=restart.restarts, **where)
            self.record.log({m.RUNTIME_RUNNER_RESTARTS: float(restart.restarts)}, env_steps)

    def rebuild_graph(self, reason: str, lost_state: DriverState, reports: bool) -> DriverState:
        """A learner or the replay actor died (`reason`): every actor replaced, the last checkpoint
        loaded into them; the driver's state to go on from (TrainingError past the restart limit)."""
        lost_at = lost_state.counters.env_steps
        self.report_runner_restarts(lost_at)  # replaced earlier in the iteration that lost the actor
        self.graph_restarts += 1
        limit = self.spec.runtime.max_learner_restarts
        lost = self.graph.dead_actors() or ["an actor"]
        if self.graph_restarts > limit:
            raise TrainingError(
                f"{', '.join(lost)} died ({reason}) after runtime.max_learner_restarts={limit} restarts of the "
                f"actor graph in this run; {self.checkpoints.resume_hint()}"
            )
        lost_nodes = self.graph.rebuild(lost)
        self.report_node_losses(lost_at)
        state = self.checkpoints.restore_last(self.graph, reports)
        if state is None:  # from the start
            state = DriverState.fresh(self.spec, reports)
            self.graph.queue_prior_stats()
        env_steps = state.counters.env_steps
        state.counters.evals = [e for e in lost_state.counters.evals if e[m.EVAL_AT_ENV_STEPS] <= env_steps]
        self.graph.publish_weights()
        where = {"nodes_lost": [loss.node_id for loss in lost_nodes]} if lost_nodes else {}
        self.record.event(
            "actor_graph_restart", env_steps, lost=lost, reason=reason, lost_at_env_steps=lost_at,
            resumed_from=str(self.checkpoints.last or "the start"), replay_size=self.graph.replay_size,
            restarts=self.graph_restarts, **where,
        )
        self.record.log({m.RUNTIME_GRAPH_RESTARTS: float(self.graph_restarts)}, env_steps)
        return state
