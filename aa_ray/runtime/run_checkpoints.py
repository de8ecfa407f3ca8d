"""A run's checkpoints: what goes into one (the actors' state from the graph, the driver's own state,
the MLflow run to continue), where it goes (`<run folder>/checkpoints/<name>`), the newest one
written, and loading one back into a graph. The file format is `checkpoint.py`'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aa_ray import metric_names as m
from aa_ray.runtime.checkpoint import load_checkpoint, read_replay, save_checkpoint
from aa_ray.runtime.driver_state import DriverState
from aa_ray.runtime.graph import ActorGraph
from aa_ray.runtime.phases import Phases
from aa_ray.spec.experiment import ExperimentSpec


class RunCheckpoints:
    def __init__(self, spec: ExperimentSpec, run_dir: Path, phases: Phases):
        self.spec, self.folder, self.phases = spec, run_dir / "checkpoints", phases
        self.last: Path | None = None  # the newest checkpoint this run wrote

    def save(self, name: str, graph: ActorGraph, state: DriverState, mlflow_run_id: str | None) -> Path:
        """Everything a bit-exact resume needs (sync mode): learner, replay, runners and the driver's
        own pending state, written atomically (see `checkpoint.save_checkpoint`)."""
        with self.phases.timed(m.PHASE_CHECKPOINT):
            actors = graph.snapshot(with_replay_table=self.spec.checkpoint.save_replay)
            payload = {
                **state.checkpoint_fields(graph.pending_stats),
                "learner": actors["learner"],
                "replay": actors["replay"],
                "runners": actors["runners"],
                "mlflow_run_id": mlflow_run_id,
            }
            self.last = save_checkpoint(self.folder / name, self.spec, payload, actors["replay_table"])
            return self.folder / name

    def restore(self, payload: dict[str, Any], replay_table: Any, graph: ActorGraph, reports: bool) -> DriverState:
        """Load a checkpoint into the actors; the driver's state it saved."""
        graph.restore(payload, replay_table)
        state, graph.pending_stats = DriverState.from_checkpoint(self.spec, reports, payload)
        return state

    def restore_last(self, graph: ActorGraph, reports: bool) -> DriverState | None:
        """The newest checkpoint of this run loaded back into (new) actors; None if there is none yet."""
        if self.last is None:
            return None
        payload = load_checkpoint(self.last)
        table = read_replay(payload, graph.obs.full, graph.act_dim) if self.spec.algo.replay_actor else None
        return self.restore(payload, table, graph, reports)

    def resume_hint(self) -> str:
        if self.last is not None:
            return f"resume from the last checkpoint with: aa-ray run SPEC --resume {self.last}"
        return "no checkpoint was written before it (checkpoint.every_env_steps sets how often one is)"
