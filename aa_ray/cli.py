"""`aa-ray` command line: run and validate experiment specs, evaluate and export checkpoints, record
transition datasets, run Tune sweeps, benchmark suites and multi-stage pipelines. Training,
evaluation and export go through the Python API (`aa_ray.api`)."""

from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from aa_ray import metric_names
from aa_ray.errors import UserError
from aa_ray.spec.loader import load_spec, spec_hash, spec_yaml

# `aa-ray run` stopped by SIGTERM or SIGINT after writing its checkpoint (`aa-ray sweep`: after saving
# Tune's state): sysexits' EX_TEMPFAIL ("try again later"), so a job scheduler can tell a preempted
# run, to requeue, from a failed one (1)
PREEMPTED_EXIT_CODE = 75

if TYPE_CHECKING:
    from aa_ray.spec.experiment import ExperimentSpec


POLICY_SOURCE_HELP = ("a checkpoint folder (runs/<run>/checkpoints/<name>), or an MLflow model a run logged: its "
                      "folder (runs/<run>/models/policy), runs:/<run id>/policy or models:/<name>/<version> (its "
                      "policy data is read; the code the model ships never runs)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="aa-ray", description="Ray-distributed RL from declarative specs.")
    commands = parser.add_subparsers(dest="command", required=True)

    def with_spec(p: argparse.ArgumentParser) -> None:
        p.add_argument("spec", help="path to a YAML experiment spec")
        p.add_argument(
            "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
            help="override a spec field by dotted path, e.g. --set algo.utd_ratio=2 (repeatable)",
        )

    run = commands.add_parser("run", help="train: embedded local Ray, or RAY_ADDRESS when set")
    with_spec(run)
    run.add_argument(
        "--resume", metavar="CHECKPOINT",
        help="continue from a checkpoint folder; 'latest': the newest checkpoint of this spec's newest run under "
        "runtime.output_dir trained with the same env and algo (a new run if there is none: the same command "
        "serves a job that is requeued)",
    )
    run.add_argument("--resume-without-replay", action="store_true",
                     help="with --resume: start from an empty replay buffer that refills, not the checkpoint's "
                     "replay file (a missing one is refused without this)")
    run.add_argument("--no-track", action="store_true", help="do not record the run in MLflow")
    run.add_argument("--plain", action="store_true", help="plain log lines instead of the live display")

    validate = commands.add_parser(
        "validate", help="check an experiment spec, sweep, suite or pipeline file (which one is detected) as its "
        "command will: print what it resolves to, or what is wrong with it",
    )
    with_spec(validate)

    rollout = commands.add_parser(
        "rollout",
        help="record a transition dataset (Parquet or Minari) from a checkpoint's policy or a scripted controller",
    )
    with_spec(rollout)
    rollout.add_argument("--episodes", type=_positive_int, required=True, metavar="N", help="episodes to record")
    rollout.add_argument(
        "--out", metavar="PATH",
        help="the dataset file to write (.parquet); with --format minari the dataset root folder (default: "
        "MINARI_DATASETS_PATH), the dataset goes to PATH/<dataset id>",
    )
    rollout.add_argument("--format", choices=["parquet", "minari"], default="parquet",
                         help="Parquet with RLlib's columns (default), or a Minari dataset")
    rollout.add_argument("--dataset-id", metavar="ID",
                         help="with --format minari: the Minari id, (namespace/)name-v<N> (default <spec name>/"
                         "<scripted|policy>-v0)")
    rollout.add_argument("--overwrite", action="store_true",
                         help="replace a Parquet dataset already at --out (once the new one is complete)")
    rollout.add_argument("--track", action="store_true",
                         help="record the rollout as an MLflow run, with the dataset it wrote as its input")
    source = rollout.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", metavar="CKPT", help="act with this checkpoint's policy")
    source.add_argument("--scripted", action="store_true", help="act with the env's scripted controller")
    rollout.add_argument(
        "--deterministic", action="store_true", help="with --checkpoint: the policy's mean action, no sampling"
    )
    _trust_code_flag(rollout)

    evaluate = commands.add_parser(
        "eval", help="evaluate a checkpoint's policy on its env's eval seeds (return, length, success, task metrics)"
    )
    evaluate.add_argument("checkpoint", help=POLICY_SOURCE_HELP)
    evaluate.add_argument("--episodes", type=_positive_int, metavar="N",
                          help="episodes (default: the run's eval.episodes)")
    evaluate.add_argument("--video", metavar="OUT.gif", help="also write the first episode as a GIF")
    _trust_code_flag(evaluate)

    export = commands.add_parser(
        "export", help="write a checkpoint's deterministic policy as a TorchScript or ONNX file (runs without aa-ray)"
    )
    export.add_argument("checkpoint", help=POLICY_SOURCE_HELP)
    export.add_argument("--format", required=True, choices=["torchscript", "onnx"])
    export.add_argument("--out", required=True, metavar="FILE", help="the file to write")
    _trust_code_flag(export)

    sweep = commands.add_parser("sweep", help="a Ray Tune search over spec keys (see specs/sweeps/)")
    sweep.add_argument("spec", help="path to a YAML sweep spec")
    sweep.add_argument(
        "--resume", nargs="?", const="latest", choices=["latest"],
        help="continue the newest sweep of this name that a signal (or a crash of this command) interrupted: "
        "unfinished trials from their last checkpoint, into the same MLflow runs (a new sweep if there is none)",
    )
    sweep.add_argument("--no-track", action="store_true", help="do not record the sweep in MLflow")

    suite = commands.add_parser(
        "suite", help="a benchmark suite: specs x envs x seeds as Tune trials, resumable (see specs/suites/)"
    )
    suite.add_argument("spec", help="path to a YAML suite spec")
    suite_start = suite.add_mutually_exclusive_group()
    suite_start.add_argument("--force", action="store_true", help="rerun every cell under a new parent run")
    suite_start.add_argument(
        "--resume", nargs="?", const="latest", choices=["latest"],
        help="continue the suite a signal (or a crash of this command) interrupted: unfinished cells from their "
        "newest checkpoint, into the same MLflow runs (what every invocation of a suite does; it says so)",
    )
    suite.add_argument("--only", nargs="+", metavar="LABEL_OR_ENV",
                       help="run only the cells of these spec labels or env ids (the rest wait for a later call)")
    suite.add_argument("--no-track", action="store_true", help="do not record the suite in MLflow")

    pipeline = commands.add_parser("pipeline", help="train / rollout / train stages as Tune trials (specs/pipelines/)")
    pipeline.add_argument("spec", help="path to a YAML pipeline spec")
    pipeline_start = pipeline.add_mutually_exclusive_group()
    pipeline_start.add_argument("--force", action="store_true",
                                help="rerun every stage, even unchanged completed ones")
    pipeline_start.add_argument(
        "--resume", nargs="?", const="latest", choices=["latest"],
        help="continue the pipeline's newest invocation if a signal (or a crash of this command) interrupted it: "
        "the same MLflow parent run, its completed stages not rerun, the stopped stage from its newest checkpoint",
    )
    pipeline.add_argument("--no-track", action="store_true", help="do not record the pipeline in MLflow")

    commands.add_parser("robots", help="list the robot tasks this install can train (EnvPool's ports of MuJoCo "
                        "Playground's, UniLab's): observation groups, actions, control rate, episode length, reward "
                        "terms")

    report = commands.add_parser("report", help="compare runs from the MLflow store: curves (PNG, HTML) and a table")
    chosen = report.add_mutually_exclusive_group()
    chosen.add_argument("--experiment", help="every training run of this MLflow experiment (default: aa-ray)")
    chosen.add_argument("--parent", metavar="RUN_ID", help="the child runs of a sweep or pipeline (the report is "
                        "also logged to this run)")
    chosen.add_argument("--runs", nargs="+", metavar="RUN_ID", help="these runs")
    report.add_argument(
        "--metric", default=metric_names.EVAL_RETURN, help=f"the curve's metric (default {metric_names.EVAL_RETURN})"
    )
    report.add_argument("--threshold", type=float, help="also report env steps and minutes until the metric reaches "
                        "this; a suite's X of minutes to reach X (default: its SB3 runs' median at their budget)")
    report.add_argument("--mode", choices=["max", "min"], default="max",
                        help="min: lower is better (e.g. a task metric that is an error)")
    report.add_argument("--out", help="output folder (default reports/<time>)")
    return parser


def _trust_code_flag(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--trust-code", action="store_true",
        help="run the code the checkpoint's stored spec names (env entry point, imports, py_modules, mirror, "
        "algorithm plugin); without it such a checkpoint is refused, naming that code, and nothing is imported",
    )


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _say(text: str, end: str = "\n", file: TextIO | None = None) -> None:
    """Print for the user. What the commands print quotes URIs (credentials scrubbed) and user strings
    (names, paths, env ids, values: control characters shown, not obeyed)."""
    from aa_ray.runtime.progress import printable
    from aa_ray.tracking.credentials import scrub_uris

    print(printable(scrub_uris(text)), end=end, file=file)


def _fail(message: str, code: int = 2) -> int:
    _say(f"aa-ray: error: {message}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command in ("sweep", "suite", "pipeline"):
        return _tune_command(args)
    if args.command == "report":
        return _report(args)
    if args.command == "robots":
        return _robots()
    if args.command in ("eval", "export"):
        return _policy_command(args)
    if args.command == "validate":
        try:
            kind = _file_kind(args.spec)
            if kind != "experiment spec":
                return _validate_tune_file(kind, args)
            spec = load_spec(args.spec, args.overrides)
        except UserError as err:
            return _fail(str(err))
        return _validate(spec)
    try:
        spec = load_spec(args.spec, args.overrides)
    except UserError as err:
        return _fail(str(err))
    if args.command == "rollout":
        return _rollout(spec, args)
    return _run(spec, args)


def _robots() -> int:
    from aa_ray.envs.robots import robot_table, robot_tasks, unilab_tasks

    tasks = robot_tasks() + unilab_tasks()
    if not tasks:
        return _fail("no robot task is installed: they come with EnvPool (pip install -e '.[envpool]', Linux x86-64) "
                     "and UniLab (pip install -e '.[unilab]')")
    _say(robot_table(tasks))
    _say(f"\n{len(tasks)} tasks. Train one with env: {{id: <env.id>, batched: <one of its env.batched>}} (playground "
         "takes the task's Playground name); the actor reads state (UniLab's: obs) and the critic also "
         "privileged_state (critic) unless algo.actor_obs and algo.critic_obs say otherwise; each reward term is "
         "logged as train/reward/<term> and eval/reward/<term>.")
    return 0


def _file_kind(path: str) -> str:
    from aa_ray.spec.loader import read_yaml
    from aa_ray.tune.specs import file_kind

    return file_kind(read_yaml(path), Path(path))


def _validate_tune_file(kind: str, args: argparse.Namespace) -> int:
    """`validate` of a sweep, suite or pipeline: loaded as its command loads it (every trial, cell and
    stage spec validated), and summarized."""
    from aa_ray.tune.specs import load_pipeline, load_suite, load_sweep

    if args.overrides:
        return _fail(f"--set applies to experiment specs; {args.spec} is a {kind}: edit its set: section instead")
    if kind == "sweep":
        sweep = load_sweep(args.spec)
        _say(f"# sweep {sweep.spec.name}: base {sweep.spec.base}, metric {sweep.spec.metric} ({sweep.spec.mode}), "
              f"{sweep.spec.num_samples} sample(s) of {', '.join(sweep.spec.search_space)}; every value checked "
              "against the base spec")
    elif kind == "suite":
        suite = load_suite(args.spec)
        _say(f"# suite {suite.spec.name}: {len(suite.cells)} runs ({len(suite.spec.specs)} specs x "
              f"{len(suite.spec.envs)} envs x {len(suite.spec.seeds)} seeds), each validated:")
        _say("\n".join(f"#   {name}" for name in suite.cells))
    else:
        pipeline = load_pipeline(args.spec)
        _say(f"# pipeline {pipeline.spec.name}: stages in order, each validated: "
              + ", ".join(f"{name} ({pipeline.spec.stages[name].kind})" for name in pipeline.order))
    return 0


def _validate(spec: ExperimentSpec) -> int:
    """`validate` of an experiment spec: its env made once (dims), its prior data, hash and bundles."""
    from aa_ray.envs import env_dims

    try:
        obs, act_dim = env_dims(spec)
    except UserError as err:
        return _fail(str(err))
    groups = f" ({', '.join(f'{key} {dim}' for key, dim in obs.groups)}; the actor reads {obs.actor})" \
        if obs.groups else ""
    _say(f"# env {spec.env.id}: obs_dim {obs.full}{groups}, act_dim {act_dim}")
    if spec.prior_data is not None:
        from aa_ray.data.dataset import DatasetError

        try:
            _say(f"# algo.prior_data: {_prior_data_note(spec, obs.full, act_dim)}")
        except DatasetError as err:
            return _fail(f"algo.prior_data: {err}")
    _say(f"# spec hash {spec_hash(spec)}\n# placement-group bundles: {spec.bundles()}")
    _say(spec_yaml(spec), end="")
    return 0


def _run(spec: ExperimentSpec, args: argparse.Namespace) -> int:
    """`aa-ray run`: the Python API's fit, its errors as one message each."""
    from aa_ray.api import Experiment
    from aa_ray.data.dataset import DatasetError
    from aa_ray.runtime.cadence import PREEMPTED
    from aa_ray.runtime.checkpoint import CheckpointError
    from aa_ray.runtime.cluster import ResourceError
    from aa_ray.runtime.remote import TrainingError
    from aa_ray.runtime.run_checkpoints import latest_checkpoint

    experiment = Experiment(spec)
    resume = args.resume
    if resume == "latest":
        resume, said = latest_checkpoint(spec)
        _say(said)
    try:
        result = experiment.fit(resume=resume, track=False if args.no_track else None,
                                progress="plain" if args.plain else "auto",
                                resume_without_replay=args.resume_without_replay)
    except (UserError, DatasetError, CheckpointError) as err:
        return _fail(str(err))
    except (ResourceError, TrainingError) as err:
        last = experiment.trainer.last_checkpoint if experiment.trainer else None
        return _fail(f"{err}" + (f" Last checkpoint: {last}." if last else ""), code=1)
    except KeyboardInterrupt as err:
        last = experiment.trainer.last_checkpoint if experiment.trainer else None
        return _fail(f"interrupted{f' ({err})' if str(err) else ''}" + (f"; last checkpoint: {last}" if last else ""),
                     code=130)
    if result.stop_reason == PREEMPTED:
        _say(f"stopped by a signal at {result.env_steps:,} env steps; checkpoint: {result.checkpoint}\n"
              "continue it with the same command and --resume latest", file=sys.stderr)
        return PREEMPTED_EXIT_CODE
    _say(f"run folder: {result.run_dir}")
    if result.mlflow_run_id:
        _say(f"mlflow run: {result.mlflow_run_id}  {result.mlflow_url}" + _ui_hint(result.mlflow_url))
    if "tensorboard" in result.tracking_runs:
        _say(f"tensorboard: tensorboard --logdir {result.tracking_runs['tensorboard']}")
    if "wandb" in result.tracking_runs:  # offline, `wandb sync` on the run folder's wandb/ uploads it
        _say(f"wandb run: {result.tracking_runs['wandb']}  (files in {result.run_dir / 'wandb'})")
    return 0


def _ui_hint(url: str) -> str:
    return "  (after: mlflow ui)" if url.startswith("http://127.0.0.1:5000/") else ""


def _policy_command(args: argparse.Namespace) -> int:
    """`aa-ray eval` and `aa-ray export` of a checkpoint's policy."""
    from aa_ray.api import load_policy
    from aa_ray.runtime.checkpoint import CheckpointError

    try:
        policy = load_policy(args.checkpoint, trust_code=args.trust_code)
        if args.command == "export":
            out = policy.export(args.out, args.format)
            keys = f" = {' + '.join(policy.obs_keys)}" if policy.obs_keys else ""
            _say(f"{args.format}: {out} (obs {policy.obs_dim}{keys} -> action {policy.act_dim}, {policy.spec.env.id})")
            return 0
        result = policy.evaluate(args.episodes, video=args.video)
    except (UserError, CheckpointError, ValueError) as err:
        return _fail(str(err))
    except RuntimeError as err:  # the video could not be rendered here
        return _fail(str(err), code=1)
    shown = "  ".join(f"{key} {value:.4g}" for key, value in result.items())
    _say(f"{policy.spec.env.id}, {args.episodes or policy.spec.eval.episodes} episodes: {shown}")
    if args.video:
        _say(f"video: {args.video}")
    return 0


def _prior_data_note(spec: ExperimentSpec, obs_dim: int, act_dim: int) -> str:
    """`validate`'s line on the RLPD dataset. A dataset that does not exist yet is fine here (the
    shipped specs validate before anyone made one); one that does not fit the env is a DatasetError."""
    from aa_ray.data import minari_format, read_dataset

    path = minari_format.resolve(spec.prior_data) or Path(spec.prior_data).expanduser()  # an id: its folder
    if not path.exists():
        return f"{path} does not exist yet (`aa-ray run` needs it; make it with `aa-ray rollout`)"
    dataset = read_dataset(path, expect_env_id=spec.env.id, expect_obs_dim=obs_dim, expect_act_dim=act_dim)
    return f"{path}: {dataset.num_rows:,} transitions from {dataset.meta.producer}"


def _rollout(spec: ExperimentSpec, args: argparse.Namespace) -> int:
    from aa_ray.data.dataset import DatasetError
    from aa_ray.rollout.job import RolloutError, rollout
    from aa_ray.runtime.checkpoint import CheckpointError
    from aa_ray.runtime.cluster import ResourceError
    from aa_ray.runtime.remote import TrainingError

    if args.dataset_id is not None and args.format != "minari":
        return _fail("--dataset-id names a Minari dataset: add --format minari")
    if args.track:  # a store that does not answer stops the rollout before it starts
        from aa_ray.tracking.mlflow_tracker import TrackingError, check_store_answers, store_uri

        try:
            check_store_answers(store_uri())
        except TrackingError as err:
            return _fail(str(err))
    try:
        summary = rollout(
            spec, args.out, args.episodes, checkpoint=args.checkpoint, scripted=args.scripted,
            deterministic=args.deterministic, dataset_format=args.format, dataset_id=args.dataset_id,
            trust_code=args.trust_code, overwrite=args.overwrite,
        )
    except (UserError, CheckpointError, RolloutError, DatasetError) as err:
        return _fail(str(err))
    except (ResourceError, TrainingError) as err:
        return _fail(str(err), code=1)
    except KeyboardInterrupt:
        return _fail("interrupted", code=130)
    line = f"dataset: {summary['path']} ({summary['episodes']} episodes, {summary['transitions']:,} transitions"
    line += f", mean return {summary['mean_return']:.4g}"
    for key, value in summary.items():  # the env's task metrics (mean_success, mean_<info key>)
        if key.startswith("mean_") and key != "mean_return":
            line += f", mean {key.removeprefix('mean_')} {value:.4g}"
    _say(line + ")")
    if "dataset_id" in summary:
        root = Path(summary["path"]).parents[len(Path(summary["dataset_id"]).parts) - 1]
        _say(f"minari: MINARI_DATASETS_PATH={root} then minari.load_dataset({summary['dataset_id']!r})")
    if args.track:
        from mlflow.exceptions import MlflowException

        try:
            _say(f"mlflow run: {_track_rollout(spec, args, summary)}")
        except (MlflowException, DatasetError) as err:
            return _fail(f"the dataset is written, but MLflow did not record the rollout: {str(err).splitlines()[0]}",
                         code=1)
    return 0


def _track_rollout(spec: ExperimentSpec, args: argparse.Namespace, summary: dict) -> str:
    """The rollout as an MLflow run (`aa_ray.data.mlflow_inputs.track_rollout`); its page's link."""
    from mlflow import MlflowClient

    from aa_ray.data.mlflow_inputs import track_rollout
    from aa_ray.tracking.mlflow_tracker import retry_locked, run_link, store_uri

    client = MlflowClient(tracking_uri=store_uri())
    tags = {"mlflow.runName": f"rollout-{spec.name}", "env": spec.env.id, "dataset": summary["path"]}
    params = {"episodes": args.episodes, "policy": args.checkpoint or "scripted", "deterministic": args.deterministic,
              "format": args.format}
    run_id = track_rollout(client, spec.tracking.experiment, tags, summary, params)
    experiment_id = retry_locked(lambda: client.get_run(run_id)).info.experiment_id
    return run_link(str(client.tracking_uri), experiment_id, run_id)


def _report(args: argparse.Namespace) -> int:
    from datetime import datetime

    from mlflow.exceptions import MlflowException

    from aa_ray.tracking.report import ReportError, make_report

    out = Path(args.out or f"reports/{datetime.now():%Y%m%d-%H%M%S}")
    try:
        result = make_report(out, metric=args.metric, experiment=args.experiment, parent=args.parent,
                             run_ids=args.runs, threshold=args.threshold, mode=args.mode)
    except (ReportError, MlflowException) as err:
        return _fail(str(err).splitlines()[0])
    for row in [*result["rows"], *result.get("minutes", []), *result.get("iqm", [])]:
        _say("  ".join(f"{key} {value:.4g}" if isinstance(value, float) else f"{key} {value}"
                        for key, value in row.items()))
    _say(result["machine"])
    _say(f"report: {result['html']} and {result['png']}" + (f" (also logged to run {args.parent})"
                                                              if args.parent else ""))
    return 0


def _tune_command(args: argparse.Namespace) -> int:
    from aa_ray.tune.specs import load_pipeline, load_suite, load_sweep

    loader = {"sweep": load_sweep, "suite": load_suite, "pipeline": load_pipeline}[args.command]
    try:  # everything in the file is checked before Ray starts
        loaded = loader(args.spec)
    except UserError as err:
        return _fail(str(err))
    from aa_ray.runtime.cluster import ResourceError, job_tracking_problem

    problem = job_tracking_problem(not args.no_track)
    if problem:
        return _fail(problem)
    try:
        if args.command == "sweep":
            from aa_ray.tune.sweep import run_sweep, trials_table

            outcome = run_sweep(loaded, track=not args.no_track, resume=args.resume is not None)
            if outcome["preempted"]:  # no table: its unfinished trials would read as stopped early
                _say(f"sweep stopped by a signal, its state saved ({outcome['root']}); continue it with the same "
                      "command and --resume latest (unfinished trials resume from their last checkpoint)",
                      file=sys.stderr)
                return PREEMPTED_EXIT_CODE
            _say(trials_table(outcome, loaded.spec.metric))
            failed = [t for t in outcome["trials"] if t["error"]]
            if outcome["best"] is None:
                return _fail(f"no trial of the sweep finished; see {outcome['root']}", code=1)
            return 1 if failed else 0
        if args.command == "suite":
            from aa_ray.tune.suite import cells_table, run_suite

            outcome = run_suite(loaded, force=args.force, track=not args.no_track, only=args.only,
                                resume=args.resume is not None)
            _say(cells_table(outcome))
            if outcome["preempted"]:
                _say(f"suite stopped by a signal ({outcome['root']}); continue it with the same command and "
                      "--resume latest (stopped cells resume from their newest checkpoint)", file=sys.stderr)
                return PREEMPTED_EXIT_CODE
            if outcome["parent_run_id"]:
                _say(f"report: aa-ray report --parent {outcome['parent_run_id']}")
            failed = [row for row in outcome["cells"] if row["status"] == "failed"]
            return 1 if failed else 0
        from aa_ray.tune.pipeline import PipelineError, run_pipeline

        try:
            outcome = run_pipeline(loaded, force=args.force, track=not args.no_track, resume=args.resume is not None)
        except PipelineError as err:
            return _fail(str(err), code=1)
        for name, stage in outcome["stages"].items():
            _say(f"{name}: {stage['status']}  {stage['output']}")
        if outcome["preempted"]:
            _say(f"pipeline stopped by a signal at stage {outcome['stopped_stage']!r} ({outcome['root']}); continue "
                  "it with the same command and --resume latest (the stage resumes from its newest checkpoint)",
                  file=sys.stderr)
            return PREEMPTED_EXIT_CODE
        return 0
    except ResourceError as err:
        return _fail(str(err), code=1)
    except UserError as err:  # e.g. a multi-node cluster without shared Tune storage
        return _fail(str(err))
    except KeyboardInterrupt:
        return _fail("interrupted", code=130)


def command() -> int:
    """The `aa-ray` program (its console script, and `python -m aa_ray.cli`): `main` on the command
    line's arguments, in a process of its own."""
    # What the imports above built (torch's and pydantic's objects: about 185,000 that the collector
    # tracks) lives as long as the process. Frozen, Python's full collections stop walking it again and
    # again while a command imports and builds the rest (Ray, MLflow, Tune): a tracked 300-step inline
    # run took about 0.9 CPU-s less (benchmarks/RESULTS.md section 38). Not in `main`: in a caller's own
    # process (a notebook, a test) it would freeze that process's garbage of the moment for good.
    gc.freeze()
    return main()


if __name__ == "__main__":
    sys.exit(command())
