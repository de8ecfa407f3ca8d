"""A run's checkpoints: what goes into one (the actors' state from the graph, the driver's own state,
the tracked runs to continue), where it goes (`<run folder>/checkpoints/<name>`), the newest one
written, and loading one back into a graph. The file format is `checkpoint.py`'s.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

from aa_ray import metric_names as m
from aa_ray.errors import UserError
from aa_ray.records import Checkpoint, CheckpointParts
from aa_ray.runtime.checkpoint import (
    REPLAY_FILE,
    CheckpointError,
    CheckpointWriteError,
    complete_steps,
    env_algo_differences,
    load_checkpoint,
    newest_checkpoint,
    read_replay,
    save_checkpoint,
)
from aa_ray.runtime.driver_state import DriverState
from aa_ray.runtime.graph import ActorGraph
from aa_ray.runtime.phases import Phases
from aa_ray.runtime.remote import TrainingError
from aa_ray.spec.experiment import ExperimentSpec


class RunCheckpoints:
    def __init__(self, spec: ExperimentSpec, run_dir: Path, phases: Phases,
                 writing: Callable[[], AbstractContextManager[Any]] = nullcontext):
        self.spec, self.folder, self.phases = spec, run_dir / "checkpoints", phases
        self.last: Path | None = None  # the newest checkpoint this run wrote
        # around each write and prune: `StopSignals.writing`, so an immediate stop lets them complete
        self.writing = writing

    def save(self, name: str, graph: ActorGraph, state: DriverState, tracking_runs: dict[str, str]) -> Path:
        """Everything a bit-exact resume needs (sync mode): learner, replay, runners and the driver's
        own pending state, written atomically (see `checkpoint.save_checkpoint`); `tracking_runs`: the
        run's id in each tracking backend, continued on a resume."""
        with self.phases.timed(m.PHASE_CHECKPOINT):
            actors = graph.snapshot(with_replay_table=self.spec.checkpoint.save_replay)
            parts = CheckpointParts(
                learner=actors.learner, replay=actors.replay, runners=actors.runners,
                driver=state.checkpoint_part(graph.pending_stats), tracking=dict(tracking_runs),
            )
            with self.writing():
                try:
                    self.last = save_checkpoint(self.folder / name, self.spec, parts, actors.replay_table)
                except CheckpointWriteError as err:
                    raise TrainingError(
                        f"{err}. The run stopped (training on with nowhere to save it would only lose more): free "
                        f"space, keep fewer checkpoints (checkpoint.keep_last) or set runtime.output_dir to a larger "
                        f"disk, then continue it with: aa-ray run SPEC --resume latest"
                    ) from None
                self._keep_newest()
            return self.last

    def _keep_newest(self) -> None:
        """`checkpoint.keep_last`: the older step_* checkpoints removed; of those kept, only the newest
        keeps its replay file (a resume or a recovery reads the newest; the others serve eval and export)."""
        keep = self.spec.checkpoint.keep_last
        if keep is None:  # every checkpoint kept whole
            return
        steps = complete_steps(self.folder)
        for old in steps[:-keep]:
            shutil.rmtree(old)
        for older in steps[-keep:-1]:
            (older / REPLAY_FILE).unlink(missing_ok=True)

    def check_writable(self) -> None:
        """The run's folder can be written (checked before any actor starts, so a bad runtime.output_dir
        fails in seconds, not at the first checkpoint); nothing is left behind by the check."""
        run_dir = self.folder.parent
        where = next(p for p in (run_dir, *run_dir.parents) if p.exists())
        try:
            if not where.is_dir():
                raise NotADirectoryError(f"{where} is a file, not a folder")
            with tempfile.TemporaryFile(dir=where):
                pass
        except OSError as err:
            raise UserError(
                f"runtime.output_dir: the run folder {run_dir} cannot be written ({err}); set runtime.output_dir "
                f"to a folder you can write to"
            ) from None

    def restore(self, checkpoint: Checkpoint, replay_table: Any, graph: ActorGraph, reports: bool) -> DriverState:
        """Load a checkpoint into the actors; the driver's state it saved (a checkpoint without one
        was refused by `checkpoint.verify_resume`)."""
        if checkpoint.driver is None:
            raise CheckpointError(f"checkpoint {checkpoint.folder} holds no run counters; it cannot be resumed.")
        graph.restore(checkpoint, replay_table)
        graph.pending_stats = list(checkpoint.driver.pending_stats)
        return DriverState.from_checkpoint(self.spec, reports, checkpoint.driver)

    def restore_last(self, graph: ActorGraph, reports: bool) -> DriverState | None:
        """The newest checkpoint of this run loaded back into (new) actors; None if there is none yet."""
        if self.last is None:
            return None
        checkpoint = load_checkpoint(self.last)
        table = read_replay(checkpoint, graph.obs.full, graph.act_dim) if self.spec.algo.replay_actor else None
        return self.restore(checkpoint, table, graph, reports)

    def resume_hint(self) -> str:
        if self.last is not None:
            return f"resume from the last checkpoint with: aa-ray run SPEC --resume {self.last}"
        return "no checkpoint was written before it (checkpoint.every_env_steps sets how often one is)"


def run_folder_of(checkpoint: Path) -> Path | None:
    """The run folder a checkpoint belongs to (`<run folder>/checkpoints/<name>`); None for a checkpoint
    kept anywhere else."""
    checkpoint = checkpoint.resolve()
    return checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else None


def latest_checkpoint(spec: ExperimentSpec) -> tuple[Path | None, str]:
    """What `aa-ray run SPEC --resume latest` continues, and the line that says so: the newest
    checkpoint of the newest run of this spec under its runtime.output_dir. A run of this spec is
    one named like it (`<name>-<hash>-<time>`, any hash: a resume may change the budget, say, which
    the hash covers) whose checkpoint was trained with the same env and algo sections: a run of
    another algo (`--set algo.name=td3`) is not this spec's, so with none left a new run starts
    (the line says so), as the same command does before the first run. A checkpoint that cannot be
    read is returned as found: the resume names what is wrong with it."""
    pattern = re.compile(rf"{re.escape(spec.name)}-[0-9a-f]{{8}}-(\d{{8}}-\d{{6}})")
    stamped = [(found[1], run) for run in Path(spec.runtime.output_dir).glob(f"{spec.name}-*")
               if (found := pattern.fullmatch(run.name))]
    other: tuple[Path, list[str]] | None = None  # the newest run of the name trained otherwise
    for _, run in sorted(stamped, reverse=True):
        if (checkpoint := newest_checkpoint(run / "checkpoints")) is None:
            continue
        try:
            differences = env_algo_differences(spec, load_checkpoint(checkpoint))
        except CheckpointError:
            return checkpoint, f"resuming from {checkpoint}"
        if not differences:
            return checkpoint, f"resuming from {checkpoint}"
        other = other or (run, list(differences))
    where = f"no checkpoint of {spec.name} under {spec.runtime.output_dir}"
    if other is not None:
        run, keys = other
        shown = ", ".join(keys[:3]) + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")
        where = (f"no run of {spec.name} under {spec.runtime.output_dir} was trained with this env and algo "
                 f"(the newest, {run.name}, differs in {shown})")
    return None, f"{where}: starting a new run"
