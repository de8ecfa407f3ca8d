"""Tune trainables. A trial is one whole actor graph: its placement group holds a bundle for the
trial's driver (this function) followed by the experiment spec's own bundles, and the trainer's
`ActorGraph` puts its actors into those (`aa_ray.runtime.cluster.placement`), so Tune never
oversubscribes the cluster. A trial reports every evaluation and checkpoint to Tune; a retried trial resumes from its
last checkpoint and keeps writing into the same runs of every tracking backend."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

from ray import tune

from aa_ray import metric_names as m
from aa_ray.runtime.cluster import PLACEMENT_STRATEGIES
from aa_ray.spec.experiment import ExperimentSpec
from aa_ray.spec.loader import spec_hash, validate_spec
from aa_ray.tracking.mlflow_tracker import PARENT_TAG, retry_locked
from aa_ray.tracking.tracker import RunContext

DRIVER_CPUS = 0.5  # the trial's own process mostly waits on its actors
TRIAL_TAG = "aa_ray.trial_id"
TRIAL_LOG = "trial.log"  # in the trial's run folder (beside spec.yaml and checkpoints/): what the trial printed
# A finished trial's process takes the sweep's or suite's next trial of the same size rather than a
# new process starting, which would import Ray Tune, MLflow, torch and MuJoCo again (about 4.5 s of
# CPU each). A trial leaves nothing behind in its process: its generators, log and trackers are its own.
REUSE_TRIAL_PROCESSES = True


@contextmanager
def output_to_log(path: Path) -> Iterator[None]:
    """Everything this trial prints (its progress lines, warnings, a resume's notice) goes to its
    own log file rather than the sweep's console; a retried trial appends to it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", buffering=1) as log, redirect_stdout(log), redirect_stderr(log):
        yield


def trial_bundles(spec: ExperimentSpec) -> list[dict[str, float]]:
    """A training trial's placement group: the trial's own bundle, then the run's actors."""
    return [{"CPU": DRIVER_CPUS}, *spec.bundles()]


def trial_resources(spec: ExperimentSpec, bundles: list[dict[str, float]] | None = None) -> tune.PlacementGroupFactory:
    """What Tune reserves for a trial: its placement group (`trial_bundles` unless `bundles` is given),
    laid over the nodes as the spec's `runtime.placement` says."""
    bundles = trial_bundles(spec) if bundles is None else bundles
    return tune.PlacementGroupFactory(bundles, strategy=PLACEMENT_STRATEGIES[spec.runtime.placement])


def run_context(config: dict[str, Any], trial_id: str) -> RunContext:
    """Where the trial is tracked (`parent.trial_tracking`): its MLflow run nested under the sweep's,
    suite's or pipeline's parent, where there is one, and its group in the other backends. A retried
    trial that had not checkpointed yet finds the MLflow run its first attempt created instead of
    starting another. A trial is known by its Tune id, or by `tracking["identity"]` tags that outlive
    one invocation (a suite's cell)."""
    tracking = config["tracking"]
    identity = tracking.get("identity") or {TRIAL_TAG: trial_id}
    tags = {**tracking["tags"], TRIAL_TAG: trial_id, **identity}
    earlier = []
    if tracking["parent_run_id"] is not None:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=tracking["uri"])
        conditions = [f"tags.`{PARENT_TAG}` = '{tracking['parent_run_id']}'",
                      *(f"tags.`{key}` = '{value}'" for key, value in identity.items())]
        earlier = retry_locked(
            lambda: client.search_runs([tracking["experiment_id"]], filter_string=" and ".join(conditions))
        )
    return RunContext(
        tracking_uri=tracking["uri"], parent_run_id=tracking["parent_run_id"], run_name=tracking["run_name"],
        tags=tags, run_id=earlier[0].info.run_id if earlier else None, group=tracking.get("group"),
    )


def train_trial(config: dict[str, Any], on_finished: Callable[[dict[str, float]], None] | None = None) -> None:
    """Train one experiment spec (`config["spec"]`, a raw dict) inside a Tune trial. `on_finished`
    sees the final metrics before they are reported (Tune may end the trial's process after that)."""
    from aa_ray.runtime.checkpoint import load_checkpoint
    from aa_ray.runtime.trainer import Trainer

    context = tune.get_context()
    spec = validate_spec(config["spec"], source=f"trial {context.get_trial_name()}")
    resume = None
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:  # a retry: continue where the last reported checkpoint left off
        resume = load_checkpoint(checkpoint.to_directory())
    elif config.get("resume_from"):  # a suite's run that an interrupted invocation left behind
        resume = load_checkpoint(config["resume_from"])
    if resume is not None and resume.driver is not None:  # one without counters is refused by verify_resume
        print(f"trial {context.get_trial_name()}: resuming from {resume.driver.counters.env_steps:,} env steps")

    latest: dict[str, float] = {}  # every metric's newest value: Tune wants the sweep metric in every result

    def report(metrics: dict[str, float], folder: Path | None) -> None:
        latest.update(metrics)
        if on_finished is not None and metrics.get(m.RUN_FINISHED):
            on_finished(dict(latest))
        result = {**latest, "spec_hash": spec_hash(spec), "resumed": float(resume is not None)}
        tune.report(result, checkpoint=tune.Checkpoint.from_directory(folder) if folder else None)

    trainer = Trainer(
        spec, run_dir=Path(config["run_dir"]), resume=resume, live=False,
        # no tracking for the trial: the sweep, suite or pipeline is not tracked (--no-track)
        track=bool(config["tracking"]),
        context=run_context(config, context.get_trial_id()) if config["tracking"] else None, reporter=report,
    )
    trainer.run()


def rollout_trial(config: dict[str, Any]) -> None:
    """Record a dataset (`aa_ray.rollout.job`: Parquet, or Minari with `format: minari`) inside a
    Tune trial; the MLflow child run holds its summary and lists the dataset as its input
    (`aa_ray.data.mlflow_inputs`). Reports the summary once."""
    from mlflow.tracking import MlflowClient

    from aa_ray.data.mlflow_inputs import track_rollout
    from aa_ray.rollout.job import rollout

    context = tune.get_context()
    spec = validate_spec(config["spec"], source=f"trial {context.get_trial_name()}")
    if config.get("dataset_id"):
        # the stage folder is named by the stage's content key: a dataset already there is this stage's
        # own, from an attempt that failed after writing it (Minari never overwrites a dataset)
        shutil.rmtree(Path(config["out"]) / config["dataset_id"], ignore_errors=True)
    summary = rollout(
        spec, config["out"], config["episodes"], checkpoint=config["checkpoint"], scripted=config["scripted"],
        deterministic=config["deterministic"], report=print, dataset_format=config.get("format", "parquet"),
        # the policy is a train stage's of this pipeline, read only if its state file still has the hash the
        # stage recorded; a dataset already at `out` is this stage's own
        dataset_id=config.get("dataset_id"), checkpoint_sha256=config.get("checkpoint_sha256"), overwrite=True,
    )
    tracking = config["tracking"]
    if tracking and tracking["parent_run_id"] is not None:  # rollouts are recorded in MLflow only
        client = MlflowClient(tracking_uri=tracking["uri"])
        tags = {**tracking["tags"], PARENT_TAG: tracking["parent_run_id"], "mlflow.runName": tracking["run_name"],
                "env": spec.env.id, "dataset": summary["path"]}
        params = {"episodes": config["episodes"], "policy": config["checkpoint"] or "scripted",
                  "deterministic": config["deterministic"], "format": summary["format"]}
        summary["mlflow_run_id"] = track_rollout(client, spec.tracking.experiment, tags, summary, params)
    tune.report({"transitions": float(summary["transitions"]), "mean_return": summary["mean_return"],
                 "mlflow_run_id": summary.get("mlflow_run_id", "")})
