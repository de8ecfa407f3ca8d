"""`aa-ray pipeline`: stages (train / rollout / train ...) run in dependency order, each as a Tune
trial with its own placement group. A later stage uses an earlier one's output by name
(`policy: ppo.checkpoint`, `inputs: {algo.prior_data: rollouts.dataset}`).

Stages are content-addressed: a stage's key hashes its resolved spec, its own settings and the
*contents* of its inputs, and its outputs live in `<output_dir>/pipelines/<name>/<stage>-<key>/`.
A stage whose folder holds a completed record under the same key is reused, not re-run (`--force`
reruns), but only while its output still has the content hash the record took when the stage
ended: an output changed since (a replaced checkpoint) is named, its folder is moved aside
(`<stage>-<key>.changed-<time>`) and the stage runs again. A later stage gets an earlier one's
output with that recorded hash, and a rollout stage reads its policy's checkpoint only if the file
still has it (`load_checkpoint(..., sha256=...)`): no stage trusts a file it did not verify. A
failing stage stops the pipeline; the completed stages keep their outputs, so the next invocation
starts at the stage that failed.

SIGTERM or SIGINT stops the running stage as a sweep's trials are stopped (`session.TuneSession`):
its child run and the parent end KILLED with the stop reason, no later stage starts, and
`pipeline.json` says `preempted`. `resume=True` (`--resume latest`) continues that invocation: its
parent run again, the stages it completed are not rerun (nor copied again), and the stopped train
stage resumes from its newest checkpoint into its own child run. The console is a sweep's: Tune's
status table and a line per trial event; each stage's output goes to `trial.log` in its folder.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple

from ray import tune

from aa_ray import metric_names as m
from aa_ray.data.minari_format import is_minari_folder
from aa_ray.rollout.job import rollout_bundles
from aa_ray.runtime import cluster
from aa_ray.runtime.checkpoint import STATE_FILE, newest_checkpoint
from aa_ray.spec.experiment import ExperimentSpec
from aa_ray.spec.loader import set_values, spec_hash, validate_spec
from aa_ray.tune.parent import ParentRun, absolute_paths, trial_tracking, tune_storage
from aa_ray.tune.session import (
    RESUMABLE,
    TrialEvents,
    TuneSession,
    mark_stopped_children,
    read_state,
    result_loggers,
    status_table,
    trials_left,
    write_state,
)
from aa_ray.tune.specs import Pipeline, RolloutStage, parse_reference
from aa_ray.tune.trials import (
    DRIVER_CPUS,
    TRIAL_LOG,
    output_to_log,
    rollout_trial,
    train_trial,
    trial_resources,
)

PIPELINE_FILE = "pipeline.json"  # in the pipeline's folder: its newest invocation's parent run, how it ended
RECORD_FILE = "stage.json"  # written last, when a stage completed: its key, outputs and MLflow run
DATASET_FILE = "dataset.parquet"
MINARI_ROOT = "minari"  # a minari-format stage's dataset root: <stage folder>/minari/<dataset id>


class PipelineError(RuntimeError):
    """A stage failed; the message names it and where the completed stages' outputs are."""


class StageOutput(NamedTuple):
    """A completed stage's output and its content hash (`output_digest`), taken when the stage ended."""

    path: Path
    sha256: str


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

    def __init__(self, pipeline: Pipeline, name: str, outputs: dict[str, StageOutput], root: Path):
        self.name = name
        self.stage = pipeline.spec.stages[name]
        references = self.stage.references()
        given = {where: outputs[parse_reference(ref)[0]] for where, ref in references.items()}
        inputs = {where: output.path for where, output in given.items()}
        digests = {where: output.sha256 for where, output in given.items()}
        raw = absolute_paths(pipeline.raws[name])
        if isinstance(self.stage, RolloutStage):
            self.spec = validate_spec(raw, source=f"stage {name}")
            self.checkpoint = inputs.get("policy")
            self.checkpoint_sha256 = digests.get("policy")
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

    def completed_record(self) -> tuple[dict[str, Any] | None, str | None]:
        """(the stage's record, None) when it completed under this key and its output still has the
        hash recorded then; (None, why) when it completed but its output changed since; (None, None)
        when it did not complete."""
        path = self.folder / RECORD_FILE
        if not path.is_file() or not self.output.exists():
            return None, None
        record = json.loads(path.read_text())
        if not isinstance(record, dict) or record.get("key") != self.key:
            return None, None
        recorded = record.get("output_sha256")
        changed = self.output / STATE_FILE if self.output.is_dir() and not is_minari_folder(self.output) \
            else self.output
        if not isinstance(recorded, str):
            return None, f"its record ({path}) holds no content hash of {changed} (an older aa-ray wrote it)"
        found = output_digest(self.output)
        if found != recorded:
            return None, (f"{changed} changed since the stage ended (sha256 {found[:12]}..., recorded "
                          f"{recorded[:12]}...)")
        return record, None

    def move_aside(self) -> Path:
        """Move the stage's folder out of the way of a new run of it; returns where it went."""
        aside = self.folder.with_name(f"{self.folder.name}.changed-{datetime.now().strftime('%Y%m%dT%H%M%S')}")
        self.folder.rename(aside)
        return aside

    def bundles(self) -> list[dict[str, float]]:
        return stage_bundles(self.stage, self.spec)

    def trial_config(self, tracking: dict[str, Any] | None, resume_from: Path | None = None) -> dict[str, Any]:
        """The stage trial's config (`stage_trial`): `resume_from`, a train stage's checkpoint that a
        stopped invocation left."""
        spec_raw = self.spec.model_dump(mode="json")
        shown = {"stage": self.name, "kind": self.stage.kind, "folder": str(self.folder)}  # the console's, the log's
        if isinstance(self.stage, RolloutStage):
            return {
                **shown, "spec": spec_raw, "episodes": self.stage.episodes,
                "checkpoint": str(self.checkpoint) if self.checkpoint else None, "scripted": self.stage.scripted,
                "checkpoint_sha256": self.checkpoint_sha256,
                "deterministic": self.stage.deterministic, "tracking": tracking, "format": self.stage.format,
                "dataset_id": self.dataset_id,
                # a Minari dataset goes under its root, by id; a Parquet one is the file itself
                "out": str(self.folder / MINARI_ROOT if self.dataset_id else self.output),
            }
        return {**shown, "spec": spec_raw, "run_dir": str(self.folder), "tracking": tracking,
                "resume_from": str(resume_from) if resume_from else None}


def stage_trial(config: dict[str, Any]) -> None:
    """One stage as a Tune trial, its output in `trial.log` in the stage's folder."""
    with output_to_log(Path(config["folder"]) / TRIAL_LOG):
        (rollout_trial if config["kind"] == "rollout" else train_trial)(config)


def stage_bundles(stage: Any, spec: ExperimentSpec) -> list[dict[str, float]]:
    """A stage trial's placement group: the trial's own bundle, then its runs' actors."""
    actors = rollout_bundles(spec) if isinstance(stage, RolloutStage) else spec.bundles()
    return [{"CPU": DRIVER_CPUS}, *actors]


def pipeline_root(pipeline: Pipeline) -> Path:
    first = validate_spec(absolute_paths(pipeline.raws[pipeline.order[0]]))
    return Path(first.runtime.output_dir) / "pipelines" / pipeline.spec.name


def run_pipeline(pipeline: Pipeline, force: bool = False, track: bool = True, report: Any = print,
                 resume: bool = False) -> dict[str, Any]:
    """Run (or reuse) every stage in order, until the end or a stop signal. Returns each stage's
    status, output and MLflow run, and whether a signal `preempted` it. `resume`: continue the
    pipeline's newest invocation if a signal (or a crash) interrupted it."""
    name = pipeline.spec.name
    root = pipeline_root(pipeline)
    first_spec: ExperimentSpec = validate_spec(pipeline.raws[pipeline.order[0]])
    earlier = read_state(root / PIPELINE_FILE)
    resuming = resume and earlier.get("status") in RESUMABLE
    if resume:
        report(f"resuming the pipeline in {root} (its last invocation: {earlier['status']})" if resuming else
               f"no interrupted pipeline {name} in {root}: starting a new invocation")
    parent = None
    tracked = track and first_spec.tracking.enabled
    if tracked and "mlflow" in first_spec.tracking.backends:
        reopen = earlier.get("parent_run_id") if resuming else None
        parent = ParentRun(first_spec.tracking.experiment, "pipeline", name, run_name=f"pipeline:{name}",
                           reopen=reopen)
        if parent.run_id != reopen:  # params are written once per parent run
            parent.log(params={"stages": " -> ".join(pipeline.order), "force": force})
            parent.log_artifact(pipeline.path)
        report(f"mlflow parent run: {parent.run_id} (experiment {first_spec.tracking.experiment!r}): {parent.url}")

    session = TuneSession("pipeline's running stage")
    storage = None
    status, ending = "FAILED", "failed"  # how the parent run and pipeline.json end, unless told otherwise
    outputs: dict[str, StageOutput] = {}
    stages: dict[str, dict[str, Any]] = {}
    stopped = None
    write_state(root / PIPELINE_FILE, parent_run_id=parent.run_id if parent else None, status="running")
    try:
        # the stages this parent run already completed (run or copied) in an invocation a signal stopped
        done = {child.data.tags.get("aa_ray.stage_key"): child.info.run_id for child in parent.children()
                if child.info.status == "FINISHED"} if parent is not None and resuming else {}
        for stage_name in pipeline.order:
            if session.signals.received:  # it came between two stages
                stopped = stage_name
                break
            plan = StagePlan(pipeline, stage_name, outputs, root)
            tags = {"aa_ray.stage": stage_name, "aa_ray.stage_key": plan.key}
            run_name = f"{name}:{stage_name}"
            record, changed = (None, None) if force else plan.completed_record()
            if changed is not None:
                report(f"stage {stage_name}: not reused: {changed}; its folder was moved to {plan.move_aside()}, "
                       "and the stage runs again")
            if record is not None and plan.key in done:
                report(f"stage {stage_name}: finished earlier in this parent run (key {plan.key}): {plan.output}")
                stages[stage_name] = {"status": "finished earlier", "output": str(plan.output),
                                      "mlflow_run_id": done[plan.key]}
            elif record is not None:
                report(f"stage {stage_name}: reused, unchanged since {record['finished']} (key {plan.key}): "
                       f"{plan.output}")
                run_id = record.get("mlflow_run_id")
                if parent is not None and run_id:
                    run_id = parent.copy_child(run_id, run_name, tags)
                stages[stage_name] = {"status": "reused", "output": str(plan.output), "mlflow_run_id": run_id}
            else:
                report(f"stage {stage_name}: running {plan.stage.kind} (key {plan.key}) in {plan.folder}")
                resume_from = None
                if resuming and not isinstance(plan.stage, RolloutStage):
                    resume_from = newest_checkpoint(plan.folder / "checkpoints")
                    if resume_from is not None:
                        report(f"stage {stage_name}: resuming from {resume_from.name}")
                if not session.started:  # an embedded Ray is sized for the largest stage
                    session.start(_largest_stage_cpus(pipeline), sorted(
                        {path for stage in pipeline.checked.values() for path in stage.env.py_modules}))
                    storage = tune_storage(pipeline.spec.storage, root / "tune", pipeline.path)
                cluster.check_capacity(plan.bundles(), what=f"stage {stage_name!r}")
                tracking = None
                if tracked:  # a resumed stage finds its MLflow child run by these tags
                    tracking = {**trial_tracking(parent, "pipeline", name, root.name, run_name, tags), "identity": tags}
                if not _run_stage(plan, plan.trial_config(tracking, resume_from), pipeline.spec.max_failures,
                                  root, storage):
                    stopped = stage_name
                    if parent is not None:
                        mark_stopped_children(parent, "aa_ray.stage_key", {plan.key}, session.signals.stop_reason())
                    break
                run_id = _child_run_id(parent, plan.key)
                plan.folder.mkdir(parents=True, exist_ok=True)
                record = {"key": plan.key, "stage": stage_name, "kind": plan.stage.kind, "output": str(plan.output),
                          "output_sha256": output_digest(plan.output),
                          "finished": datetime.now().isoformat(timespec="seconds"), "mlflow_run_id": run_id}
                (plan.folder / RECORD_FILE).write_text(json.dumps(record, indent=1))
                stages[stage_name] = {"status": "ran", "output": str(plan.output), "mlflow_run_id": run_id}
            outputs[stage_name] = StageOutput(plan.output, record["output_sha256"])
        status = "KILLED" if stopped else "FINISHED"
        ending = "preempted" if stopped else "finished"
        return {"stages": stages, "root": str(root), "parent_run_id": parent.run_id if parent else None,
                "preempted": stopped is not None, "stopped_stage": stopped}
    except KeyboardInterrupt:  # a second signal: the stage resumes from its newest checkpoint all the same
        status, ending = "KILLED", "interrupted"
        raise
    finally:
        write_state(root / PIPELINE_FILE, status=ending)
        session.end(parent, status, report)


def _largest_stage_cpus(pipeline: Pipeline) -> float:
    return max(
        sum(bundle.get("CPU", 0.0) for bundle in stage_bundles(pipeline.spec.stages[name], pipeline.checked[name]))
        for name in pipeline.order
    )


def _run_stage(plan: StagePlan, config: dict[str, Any], max_failures: int, root: Path, storage: str) -> bool:
    """Run the stage as one Tune trial; False when a stop signal cut it short."""
    experiment = f"{plan.name}-{plan.key}-{datetime.now():%Y%m%d-%H%M%S}"  # a resumed stage's attempt is another
    events = TrialEvents(str(plan.folder), m.EVAL_RETURN, by="stage", folders={plan.name: str(plan.folder)})
    tuner = tune.Tuner(
        tune.with_resources(stage_trial, trial_resources(plan.spec, plan.bundles())),
        param_space=config,
        run_config=tune.RunConfig(
            name=experiment, storage_path=storage, failure_config=tune.FailureConfig(max_failures=max_failures),
            # verbose 1: the status table only; TrialEvents says what happens to the stage's trial
            verbose=1, progress_reporter=status_table({"stage": "stage"}, m.EVAL_RETURN),
            callbacks=[*result_loggers(), events],
        ),
    )
    result = tuner.fit()[0]
    if trials_left(f"{storage.rstrip('/')}/{experiment}"):
        return False
    if result.error is not None:
        cause = getattr(result.error, "cause", None) or result.error
        reason = str(cause).strip().splitlines()[-1] if str(cause).strip() else type(cause).__name__
        raise PipelineError(
            f"stage {plan.name!r} ({plan.stage.kind}) failed: {reason}. Completed stages keep their outputs under "
            f"{root}; fix the cause and run the pipeline again (completed stages are reused). Trial logs: "
            f"{result.path}"
        )
    return True


def _child_run_id(parent: ParentRun | None, key: str) -> str | None:
    if parent is None:
        return None
    runs = [run for run in parent.children() if run.data.tags.get("aa_ray.stage_key") == key]
    return runs[0].info.run_id if runs else None
