"""The `wandb` tracking backend: a Weights & Biases run through W&B's own client, in the project
`tracking.wandb_project` (default: `tracking.experiment`). Its files are in the run folder
(`<run folder>/wandb/`); with WANDB_MODE=offline nothing leaves the machine until `wandb sync`.

The W&B client queues and sends in a process of its own, with its own retries: MLflow's outbox and
its outage guarantees (`outbox.py`) do not cover it. A run of a sweep, suite or pipeline is in the
W&B group named after it. A resumed run continues the same W&B run (same id, `resume="allow"`); W&B
keeps a step only once, so the steps the interrupted attempt logged past its checkpoint are not
logged again (MLflow and TensorBoard keep both, as the `run/resumed_at` metric marks). A Tune trial
retried before its first checkpoint has no W&B id to continue: it starts a second W&B run in the
group (MLflow finds its run by the trial's tags instead).

The API key is W&B's to read (WANDB_API_KEY, or `wandb login`); aa-ray never reads, shows nor logs it.
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import wandb

from aa_ray.errors import UserError
from aa_ray.spec.experiment import ExperimentSpec
from aa_ray.spec.loader import flatten, spec_hash, spec_to_dict
from aa_ray.tracking.credentials import scrub_uris, scrubbed
from aa_ray.tracking.tracker import RunContext

if TYPE_CHECKING:
    from aa_ray.tracking.models import ModelUpload, SavedModel
    from aa_ray.tracking.outbox import Notice

_MAX_TAG = 64  # W&B's limit on a tag's length
_EXIT_CODES = {"FINISHED": 0, "KILLED": 75}  # 75: a preempted run, as `aa-ray run` exits; anything else is 1


class WandbError(UserError):
    """W&B cannot start or continue the run (not logged in, a project it refuses)."""


class WandbTracker:
    backend = "wandb"

    def __init__(self, spec: ExperimentSpec, run_dir: Path, run_id: str | None = None,
                 context: RunContext | None = None):
        context = context or RunContext()
        run_dir.mkdir(parents=True, exist_ok=True)
        project = spec.tracking.wandb_project or spec.tracking.experiment
        tags = [spec.algo.name[:_MAX_TAG], spec.env.id[:_MAX_TAG]]
        try:
            self.run = wandb.init(
                project=project, entity=spec.tracking.wandb_entity, dir=str(run_dir),
                id=run_id or secrets.token_hex(6), resume="allow", reinit="create_new",
                name=context.run_name or f"{spec.name}-{spec_hash(spec)[:6]}", group=context.group, tags=tags,
                # a spec value may be a URI with credentials (an output folder on object storage)
                config={**{k: scrub_uris(str(v)) for k, v in flatten(spec_to_dict(spec)).items()},
                        "aa_ray_tags": scrubbed(context.tags)},
                allow_val_change=True,  # a resumed run's spec may differ in what a resume may change
                settings=wandb.Settings(console="off", silent=True, disable_git=True, save_code=False,
                                        x_save_requirements=False),
            )
        except (wandb.errors.Error, OSError) as err:
            reason = scrub_uris(str(err).splitlines()[0] if str(err) else type(err).__name__)[:300]
            raise WandbError(
                f"tracking.backends: wandb could not start the run in W&B project {project!r} ({reason}). Log in "
                "with `wandb login` (or set WANDB_API_KEY in the environment), set tracking.wandb_project and "
                "tracking.wandb_entity to a project you can write, set WANDB_MODE=offline to record it locally and "
                "`wandb sync` it later, or remove wandb from tracking.backends."
            ) from None

    @property
    def run_id(self) -> str:
        return str(self.run.id)

    @property
    def url(self) -> str | None:
        return self.run.url or None  # None offline

    @property
    def files_dir(self) -> Path:
        """The W&B run's own folder (offline: what `wandb sync` uploads)."""
        return Path(self.run.settings.sync_dir)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def flush(self) -> bool:
        return True  # W&B's client sends on its own schedule, from its own process

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        """Kept in the W&B run's files, under `artifact_path`, as the MLflow run keeps it."""
        target = Path(self.run.dir) / (artifact_path or "") / path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path, target)  # a checkpoint's state may be large: no second copy where a link will do
        except OSError:
            shutil.copy2(path, target)
        self.run.save(str(target), base_path=self.run.dir, policy="now")

    def log_model(self, saved: SavedModel, register_as: str | None = None) -> ModelUpload | None:
        return None  # models are MLflow's (tracking.log_model); the model folder is in the run folder

    def set_tag(self, key: str, value: str) -> None:
        self.run.summary[key] = scrub_uris(value)[:5000]

    def notices(self) -> list[Notice]:
        return []  # W&B's client reports its own connection trouble

    def finish(self, status: str, say: Callable[[str], None] = print, wait_s: float | None = None) -> int:
        self.run.finish(exit_code=_EXIT_CODES.get(status, 1))
        return 0
