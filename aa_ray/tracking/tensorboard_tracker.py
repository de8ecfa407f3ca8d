"""The `tensorboard` tracking backend: TensorBoard event files written into the run folder, so
`tensorboard --logdir runs/` shows every run, and a sweep's trials (run folders inside the sweep's
folder) as one subfolder each. A resumed run appends a new event file to the same folder, which
TensorBoard reads as one run.

The spec's values and the run's tags go in as text (TensorBoard's TEXT tab). Files of the run
(spec, events, trace, videos, checkpoints) are in the run folder already: TensorBoard has no
separate store to copy them to, nor a place for models.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from torch.utils.tensorboard import SummaryWriter

from aa_ray.spec.experiment import ExperimentSpec
from aa_ray.spec.loader import spec_yaml
from aa_ray.tracking.credentials import scrub_uris, scrubbed
from aa_ray.tracking.tracker import RunContext

if TYPE_CHECKING:
    from aa_ray.tracking.models import ModelUpload, SavedModel
    from aa_ray.tracking.outbox import Notice

SPEC_TEXT = "spec"  # the text tag holding the run's spec (YAML)
TAGS_TEXT = "tags"  # and its tags (one "key: value" a line)
STATUS_TEXT = "status"  # and how the run ended, with the stop reason where there is one


class TensorBoardTracker:
    """Its run id is the run folder it writes in. A resumed run writes in its own run folder: the
    same one, unless the checkpoint was resumed from outside a run folder (then a new run starts)."""

    backend = "tensorboard"

    def __init__(self, spec: ExperimentSpec, run_dir: Path, run_id: str | None = None,
                 context: RunContext | None = None):
        self.folder = run_dir.resolve()
        self.folder.mkdir(parents=True, exist_ok=True)
        self.writer = SummaryWriter(log_dir=str(self.folder), flush_secs=spec.tracking.flush_every_s)
        self.tags: dict[str, str] = {}
        if run_id != str(self.folder):  # a new run: its spec and tags, once
            context = context or RunContext()
            tags = {"algo": spec.algo.name, "env": spec.env.id, **context.tags}
            if context.run_name:
                tags["run_name"] = context.run_name
            if context.group:
                tags["group"] = context.group
            # markdown: a code block keeps the YAML's indentation
            self.writer.add_text(SPEC_TEXT, "```\n" + scrub_uris(spec_yaml(spec)) + "\n```", global_step=0)
            self.writer.add_text(TAGS_TEXT, "  \n".join(f"{k}: {v}" for k, v in scrubbed(tags).items()), global_step=0)

    @property
    def run_id(self) -> str:
        return str(self.folder)

    @property
    def url(self) -> str | None:
        return None  # the page is wherever `tensorboard --logdir` is served

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, global_step=step)

    def flush(self) -> bool:
        self.writer.flush()
        return True

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        """Nothing to do: the file is in the run folder, beside the event files."""

    def log_model(self, saved: SavedModel, register_as: str | None = None) -> ModelUpload | None:
        return None  # the model folder stays in the run folder (models/), which TensorBoard does not show

    def set_tag(self, key: str, value: str) -> None:
        self.tags[key] = scrub_uris(value)

    def notices(self) -> list[Notice]:
        return []  # local files: no store to lose

    def finish(self, status: str, say: Callable[[str], None] = print, wait_s: float | None = None) -> int:
        ending = "  \n".join([status, *(f"{k}: {v}" for k, v in self.tags.items())])
        self.writer.add_text(STATUS_TEXT, ending)
        self.writer.close()
        return 0
