"""`aa-ray` command line: run and validate experiment specs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from aa_ray.spec.loader import SpecError, load_spec, spec_hash, spec_yaml


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
    run.add_argument("--resume", metavar="CHECKPOINT", help="continue from a checkpoint folder")
    run.add_argument("--no-track", action="store_true", help="do not record the run in MLflow")
    run.add_argument("--plain", action="store_true", help="plain log lines instead of the live display")

    validate = commands.add_parser("validate", help="print the resolved spec, or what is wrong with it")
    with_spec(validate)
    return parser


def _fail(message: str, code: int = 2) -> int:
    print(f"aa-ray: error: {message}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        spec = load_spec(args.spec, args.overrides)
    except SpecError as err:
        return _fail(str(err))

    if args.command == "validate":
        from aa_ray.runtime.env_runner import env_dims

        try:
            obs_dim, act_dim = env_dims(spec)
        except SpecError as err:
            return _fail(str(err))
        print(f"# env {spec.env.id}: obs_dim {obs_dim}, act_dim {act_dim}")
        print(f"# spec hash {spec_hash(spec)}\n# placement-group bundles: {spec.bundles()}")
        print(spec_yaml(spec), end="")
        return 0

    # Imported here so `validate` and an invalid spec never start (or import) Ray or MLflow.
    from aa_ray.runtime.checkpoint import CheckpointError, check_compatible, load_checkpoint
    from aa_ray.runtime.cluster import ResourceError
    from aa_ray.runtime.trainer import Trainer, TrainingError

    resume = None
    if args.resume:
        try:
            resume = load_checkpoint(args.resume)
            check_compatible(spec, resume)
        except CheckpointError as err:
            return _fail(str(err))
    trainer = Trainer(spec, resume=resume, track=False if args.no_track else None, live=False if args.plain else None)
    try:
        result = trainer.run()
    except SpecError as err:
        return _fail(str(err))
    except (ResourceError, TrainingError) as err:
        hint = f" Last checkpoint: {trainer.last_checkpoint}." if trainer.last_checkpoint else ""
        return _fail(f"{err}{hint}", code=1)
    except KeyboardInterrupt:
        return _fail("interrupted", code=130)
    print(f"run folder: {Path(result['run_dir'])}")
    if result["mlflow_run_id"]:
        print(f"mlflow run: {result['mlflow_run_id']}  (see it with: mlflow ui)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
