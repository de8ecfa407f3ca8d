"""`aa-ray pipeline`: stages (train / rollout / train ...) run in dependency order, each as a Tune
trial with its own placement group. A later stage uses an earlier one's output by name
(`policy: ppo.checkpoint`, `inputs: {algo.prior_data: rollouts.dataset}`).

Stages are content-addressed: a stage's key hashes its resolved spec, its own settings and the
*contents* of its inputs, and its outputs live in `<output_dir>/pipelines/<name>/<stage>-<key>/`.
A stage whose folder holds a completed record under the same key is reused, not re-run (`--force`
reruns). A failing stage stops the pipeline; the completed stages keep their outputs, so the next
invocation starts at the stage that failed.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from pathlib import Path
from typing import Any

from ray import tune

from aa_ray.data.minari_format import is_minari_folder
from aa_ray.data.rollout import rollout_bundles
from aa_ray.runtime.checkpoint import STATE_FILE
from aa_ray.spec.experiment import ExperimentSpec
from aa_ray.spec.loader import set_values, spec_hash, validate_spec
from aa_ray.tune.parent import ParentRun, absolute_paths, end_invocation, tune_storage
from aa_ray.tune.specs import Pipeline, RolloutStage, parse_reference
from aa_ray.tune.trials import DRIVER_CPUS, rollout_trial, train_trial, trial_resources

RECORD_FILE = "stage.json"  # written last, when a stage completed: its key, outputs and MLflow run
DATASET_FILE = "dataset.parquet"
MINARI_ROOT = "minari"  # a minari-format stage's dataset root: <stage folder>/minari/<dataset id>


class PipelineError(RuntimeError):
    """A stage failed; the message names it and where the completed stages' outputs are."""


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def output_digest(output: Path) -> str:
    """The content hash of a stage output: a checkpoint's state file, a dataset file, or a Minari
    dataset's files (their names and contents)."""
    if is_minari_folder(output):
        digest = hashlib.sha256()
        for file in sorted(p for p in output.rglob("*") if p.is_file()):
            digest.update(f"{file.relative_to(output)}:{file_digest(file)}".encode())
        return digest.hexdigest()
    return file_digest(output / STATE_FILE if output.is_dir() else output)


class StagePlan:
    """One stage, resolved: the spec it runs, its inputs and key, and where its outputs go."""

    def __init__(self, pipeline: Pipeline, name: str, outputs: dict[str, Path], root: Path):
        self.name = name
        self.stage = pipeline.spec.stages[name]
        references = self.stage.references()
        inputs = {where: outputs[parse_reference(ref)[0]] for where, ref in references.items()}
        digests = {where: output_digest(path) for where, path in inputs.items()}
        raw = absolute_paths(pipeline.raws[name])
        if isinstance(self.stage, RolloutStage):
            self.spec = validate_spec(raw, source=f"stage {name}")
            self.checkpoint = inputs.get("policy")
            settings = {"episodes": self.stage.episodes, "deterministic": self.stage.deterministic,
                        "scripted": self.stage.scripted}
            self.dataset_id = None
            if self.stage.format == "minari":  # (a Parquet stage's key stays what it was before formats)
                self.dataset_id = self.stage.dataset_id or f"{pipeline.spec.name}/{name}-v0"
                settings |= {"format": self.stage.format, "dataset_id": self.dataset_id}
            identity = {"kind": "rollout", "spec": spec_hash(self.spec), **settings, "inputs": digests}
        else:
            # hashed with the inputs' contents in place of their paths; run with the paths
            hashed = validate_spec(set_values(raw, {k: f"sha256:{d}" for k, d in digests.items()}))
            self.spec = validate_spec(set_values(raw, {k: str(p) for k, p in inputs.items()}), source=f"stage {name}")
            identity = {"kind": "train", "spec": spec_hash(hashed), "inputs": digests}
        self.key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:12]
        self.folder = root / f"{name}-{self.key}"
        if not isinstance(self.stage, RolloutStage):
            self.output = self.folder / "checkpoints" / "final"
        elif self.dataset_id is not None:
            self.output = self.folder / MINARI_ROOT / self.dataset_id
        else:
            self.output = self.folder / DATASET_FILE

    def completed_record(self) -> dict[str, Any] | None:
        path = self.folder / RECORD_FILE
        if not path.is_file() or not self.output.exists():
            return None
        record = json.loads(path.read_text())
        return record if record.get("key") == self.key else None

    def bundles(self) -> list[dict[str, float]]:
        return stage_bundles(self.stage, self.spec)

    def trial_config(self, tracking: dict[str, Any] | None) -> tuple[Any, dict[str, Any]]:
        spec_raw = self.spec.model_dump(mode="json")
        if isinstance(self.stage, RolloutStage):
            return rollout_trial, {
                "spec": spec_raw, "episodes": self.stage.episodes,
                "checkpoint": str(self.checkpoint) if self.checkpoint else None, "scripted": self.stage.scripted,
                "deterministic": self.stage.deterministic, "tracking": tracking, "format": self.stage.format,
                "dataset_id": self.dataset_id,
                # a Minari dataset goes under its root, by id; a Parquet one is the file itself
                "out": str(self.folder / MINARI_ROOT if self.dataset_id else self.output),
            }
        return train_trial, {"spec": spec_raw, "run_dir": str(self.folder), "tracking": tracking}


def stage_bundles(stage: Any, spec: ExperimentSpec) -> list[dict[str, float]]:
    """A stage trial's placement group: the trial's own bundle, then its runs' actors."""
    actors = rollout_bundles(spec) if isinstance(stage, RolloutStage) else spec.bundles()
    return [{"CPU": DRIVER_CPUS}, *actors]


def pipeline_root(pipeline: Pipeline) -> Path:
    first = validate_spec(absolute_paths(pipeline.raws[pipeline.order[0]]))
    return Path(first.runtime.output_dir) / "pipelines" / pipeline.spec.name


def run_pipeline(pipeline: Pipeline, force: bool = False, track: bool = True, report: Any = print) -> dict[str, Any]:
    """Run (or reuse) every stage in order. Returns each stage's status, output and MLflow run."""
    from aa_ray.runtime import cluster

    name = pipeline.spec.name
    root = pipeline_root(pipeline)
    first_spec: ExperimentSpec = validate_spec(pipeline.raws[pipeline.order[0]])
    parent = None
    if track and first_spec.tracking.enabled:
        parent = ParentRun(first_spec.tracking.experiment, "pipeline", name, run_name=f"pipeline:{name}")
        parent.log(params={"stages": " -> ".join(pipeline.order), "force": force})
        parent.log_artifact(pipeline.path)
        report(f"mlflow parent run: {parent.run_id} (experiment {first_spec.tracking.experiment!r}): {parent.url}")

    started_ray, storage = False, None
    status = "FAILED"
    outputs: dict[str, Path] = {}
    stages: dict[str, dict[str, Any]] = {}
    try:
        for stage_name in pipeline.order:
            plan = StagePlan(pipeline, stage_name, outputs, root)
            tags = {"aa_ray.stage": stage_name, "aa_ray.stage_key": plan.key}
            run_name = f"{name}:{stage_name}"
            record = None if force else plan.completed_record()
            if record is not None:
                report(f"stage {stage_name}: reused, unchanged since {record['finished']} (key {plan.key}): "
                       f"{plan.output}")
                run_id = record.get("mlflow_run_id")
                if parent is not None and run_id:
                    run_id = parent.copy_child(run_id, run_name, tags)
                stages[stage_name] = {"status": "reused", "output": str(plan.output), "mlflow_run_id": run_id}
            else:
                report(f"stage {stage_name}: running {plan.stage.kind} (key {plan.key}) in {plan.folder}")
                if storage is None:  # an embedded Ray is sized for the largest stage
                    started_ray = cluster.connect(None, cpus=_largest_stage_cpus(pipeline), py_modules=sorted(
                        {path for stage in pipeline.checked.values() for path in stage.env.py_modules}))
                    storage = tune_storage(pipeline.spec.storage, root / "tune", pipeline.path)
                cluster.check_capacity(plan.bundles(), what=f"stage {stage_name!r}")
                tracking = parent.child_tracking(run_name, tags) if parent else None
                _run_stage(plan, tracking, pipeline.spec.max_failures, root, storage)
                run_id = _child_run_id(parent, plan.key)
                plan.folder.mkdir(parents=True, exist_ok=True)
                (plan.folder / RECORD_FILE).write_text(json.dumps({
                    "key": plan.key, "stage": stage_name, "kind": plan.stage.kind, "output": str(plan.output),
                    "finished": datetime.now().isoformat(timespec="seconds"), "mlflow_run_id": run_id,
                }, indent=1))
                stages[stage_name] = {"status": "ran", "output": str(plan.output), "mlflow_run_id": run_id}
            outputs[stage_name] = plan.output
        status = "FINISHED"
        return {"stages": stages, "root": str(root), "parent_run_id": parent.run_id if parent else None}
    finally:
        end_invocation(parent, status, started_ray, report)


def _largest_stage_cpus(pipeline: Pipeline) -> float:
    return max(
        sum(bundle.get("CPU", 0.0) for bundle in stage_bundles(pipeline.spec.stages[name], pipeline.checked[name]))
        for name in pipeline.order
    )


def _run_stage(plan: StagePlan, tracking: dict[str, Any] | None, max_failures: int, root: Path, storage: str) -> None:
    trainable, config = plan.trial_config(tracking)
    tuner = tune.Tuner(
        tune.with_resources(trainable, trial_resources(plan.spec, plan.bundles())),
        param_space=config,
        run_config=tune.RunConfig(
            name=f"{plan.name}-{plan.key}", storage_path=storage,
            failure_config=tune.FailureConfig(max_failures=max_failures), verbose=0,
        ),
    )
    result = tuner.fit()[0]
    if result.error is not None:
        cause = getattr(result.error, "cause", None) or result.error
        reason = str(cause).strip().splitlines()[-1] if str(cause).strip() else type(cause).__name__
        raise PipelineError(
            f"stage {plan.name!r} ({plan.stage.kind}) failed: {reason}. Completed stages keep their outputs under "
            f"{root}; fix the cause and run the pipeline again (completed stages are reused). Trial logs: "
            f"{result.path}"
        )


def _child_run_id(parent: ParentRun | None, key: str) -> str | None:
    if parent is None:
        return None
    runs = [run for run in parent.children() if run.data.tags.get("aa_ray.stage_key") == key]
    return runs[0].info.run_id if runs else None
