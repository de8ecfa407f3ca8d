"""`aa-ray rollout`: record a transition dataset with the env-runner fleet.

The spec's env and `runners` section decide what runs: R `DatasetRecorder` actors (`recorder.py`),
each stepping its E env copies with a checkpoint's policy or the env's scripted controller. The driver hands each
runner a share of the episodes in rounds (one `rollout` call per runner per round) and streams
every round's episodes into the dataset while the next round runs: a Parquet file (the default,
`aa_ray/data/dataset.py`) or, with `format="minari"`, a Minari dataset (`aa_ray/data/minari_format.py`).
The scripted controller is the one the env declares in its metadata (`aa_ray.envs.controllers`).
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa

from aa_ray.data import minari_format
from aa_ray.data.dataset import DatasetMeta, DatasetWriter, dataset_meta
from aa_ray.errors import SpecError, write_failure
from aa_ray.spec.experiment import ExperimentSpec
from aa_ray.spec.loader import spec_to_dict, validate_spec
from aa_ray.spec.trust import named_code, refuse_untrusted_code

ROUNDS = 20  # about this many progress reports per rollout
FORMATS = ("parquet", minari_format.FORMAT)
DatasetFormat = Literal["parquet", "minari"]


class RolloutError(ValueError):
    """A rollout that cannot start (no scripted controller, a checkpoint for another env...)."""


def _report(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def policy_from_checkpoint(spec: ExperimentSpec, checkpoint: str | Path, trust_code: bool = False,
                           sha256: str | None = None) -> tuple[ExperimentSpec, dict]:
    """The spec to roll out with (the checkpoint's algo, so runners build its policy network) and
    the policy weights. CheckpointError (a bad path or file, or one whose state file no longer has
    the `sha256` recorded when it was written), RolloutError (wrong env), SpecError (the checkpoint's
    algo does not fit the rest of the spec) or UntrustedCodeError (the checkpoint names code that the
    user's spec does not, and `trust_code` is off). A checkpoint read by its recorded hash is the
    caller's own (a pipeline's train stage): the code it names is that stage's spec's."""
    from aa_ray.algos.registry import build_policy
    from aa_ray.envs import env_dims
    from aa_ray.runtime.checkpoint import CheckpointError, checkpoint_policy, load_checkpoint

    payload = load_checkpoint(checkpoint, sha256=sha256)
    # what the user's own spec names is theirs to run
    refuse_untrusted_code(payload.spec, f"checkpoint {payload.folder}", trust_code or sha256 is not None,
                          named_by_user=named_code(spec_to_dict(spec)))
    trained, state = checkpoint_policy(payload, trust_code=True)
    if trained.env.id != spec.env.id:
        raise RolloutError(
            f"checkpoint {payload.folder} was trained on env {trained.env.id!r}, the spec's env is "
            f"{spec.env.id!r}; roll it out with the spec stored beside it (spec.yaml)."
        )
    obs, act_dim = env_dims(spec)
    try:
        build_policy(trained.algo, obs, act_dim).load_state_dict(state)
    except RuntimeError as err:
        raise CheckpointError(
            f"checkpoint {payload.folder}: its policy does not fit env {spec.env.id} "
            f"(obs_dim {obs.full}, act_dim {act_dim}): {str(err).splitlines()[0]}"
        ) from None
    # validated as a whole: the checkpoint's algo must fit the rest of the spec (e.g. its runtime.mode)
    source = f"{spec.name} with the algo of checkpoint {payload.folder}"
    return validate_spec({**spec_to_dict(spec), "algo": spec_to_dict(trained)["algo"]}, source=source), state


def check_scripted(spec: ExperimentSpec, instead: str = "use --checkpoint to roll out a trained policy") -> None:
    """RolloutError unless the spec's env declares a scripted controller that loads; `instead` says
    what else the user can do (in the command line's words by default)."""
    from aa_ray.envs.controllers import METADATA_KEY
    from aa_ray.envs.make import scripted_controller

    try:
        declared = scripted_controller(spec)
    except SpecError:  # the env itself cannot be made: its own error
        raise
    except ValueError as err:  # the declaration is wrong, or its module does not import
        raise RolloutError(f"env {spec.env.id!r}: {err}") from None
    if declared is None:
        raise RolloutError(
            f"env {spec.env.id!r} has no scripted controller (an env declares one in its metadata[{METADATA_KEY!r}], "
            "e.g. 'mypkg.controllers:reach', a function from a batch of observations to actions in [-1, 1]); "
            f"{instead}."
        )


def default_dataset_id(spec: ExperimentSpec, scripted: bool) -> str:
    """A Minari id for a rollout that was not given one: <spec name>/<scripted|policy>-v0."""
    return f"{spec.name}/{'scripted' if scripted else 'policy'}-v0"


def minari_root(out: str | Path | None) -> Path:
    """Where a Minari dataset is written: `out`, else MINARI_DATASETS_PATH; never a default in the
    user's home (RolloutError instead)."""
    if out is not None:
        return Path(out).expanduser()
    if os.environ.get(minari_format.ROOT_ENV):
        return minari_format.default_root()
    raise RolloutError(f"--format minari needs --out ROOT (the dataset root folder) or {minari_format.ROOT_ENV} set")


def open_writer(
    spec: ExperimentSpec, out: str | Path | None, meta: DatasetMeta, dataset_format: str, dataset_id: str | None,
    overwrite: bool = False,
) -> DatasetWriter | minari_format.MinariWriter:
    """The writer of a rollout's dataset; every problem with where it goes is raised here, before
    any actor starts."""
    if dataset_format == minari_format.FORMAT:
        return minari_format.MinariWriter(
            minari_root(out), dataset_id or default_dataset_id(spec, meta.producer == "scripted"), meta,
            env_spec=minari_format.recorded_env_spec(spec),
        )
    if dataset_format != "parquet":
        raise RolloutError(f"--format must be one of {', '.join(FORMATS)}, got {dataset_format!r}")
    if out is None:
        raise RolloutError("--out PATH (the .parquet file to write) is needed")
    if Path(out).is_dir():
        raise RolloutError(f"--out {out} is a folder; pass the path of the .parquet file to write")
    if Path(out).exists() and not overwrite:
        raise RolloutError(f"--out {out} already exists (a dataset someone may still need); pass --overwrite to "
                           "replace it once the new one is complete, or choose another path")
    return DatasetWriter(out, meta)


@contextmanager
def whole_or_nothing(writer: DatasetWriter | minari_format.MinariWriter) -> Iterator[None]:
    """The writer's block: the dataset moved into place at its end, removed if it raises; a write that
    fails (a full disk, a folder taken away) is one RolloutError naming the dataset and why."""
    try:
        with writer:
            yield
    except (OSError, pa.ArrowException) as err:
        raise not_written(writer.path, err) from None


def not_written(dataset: Path, err: BaseException) -> RolloutError:
    return RolloutError(f"the dataset {dataset} could not be written: {write_failure(dataset, err)}; nothing of it "
                        "was left behind.")


def rollout_bundles(spec: ExperimentSpec) -> list[dict[str, float]]:
    return spec.bundles(learning=False)


def rollout(
    spec: ExperimentSpec,
    out: str | Path | None,
    episodes: int,
    *,
    checkpoint: str | Path | None = None,
    scripted: bool = False,
    deterministic: bool = False,
    report: Callable[[str], None] = _report,
    dataset_format: DatasetFormat = "parquet",
    dataset_id: str | None = None,
    trust_code: bool = False,
    overwrite: bool = False,
    checkpoint_sha256: str | None = None,
) -> dict[str, Any]:
    """Write `episodes` episodes of the spec's env to the dataset `out`: a Parquet file, or with
    `dataset_format="minari"` a Minari dataset `<out>/<dataset_id>` (out: the dataset root, default
    MINARI_DATASETS_PATH; dataset_id default `<spec name>/<scripted|policy>-v0`). Everything that can
    be checked is checked before any actor starts (SpecError, CheckpointError, RolloutError,
    DatasetError). The
    runners are an `ActorGraph` without learners: Ray actors, or with `runtime.backend: inline` plain
    objects in this process. Returns a summary: path, episodes, transitions, mean_return, producer,
    and `mean_<name>` for each task metric the env reports (mean_success from is_success;
    `aa_ray.envs.info_metrics`). `trust_code`: run the code the checkpoint's stored spec names
    beyond what `spec` names (`aa_ray.spec.trust`); `checkpoint_sha256`: the checkpoint's state file
    hash recorded when the caller wrote it, which makes it trusted if the file still has it (a
    pipeline's own train stage). `overwrite`: replace a Parquet dataset already at
    `out` (refused otherwise; a Minari dataset is never replaced). A disk that fills up is a
    RolloutError, with nothing of the dataset left behind."""
    from aa_ray.envs import env_dims
    from aa_ray.envs.info_metrics import metric_name
    from aa_ray.rollout.recorder import DatasetRecorder
    from aa_ray.runtime import cluster
    from aa_ray.runtime.graph import ActorGraph
    from aa_ray.runtime.remote import get_results

    if episodes < 1:
        raise RolloutError(f"--episodes must be at least 1, got {episodes}")
    if scripted == (checkpoint is not None):
        raise RolloutError("roll out either a checkpoint's policy or the scripted controller (exactly one)")
    if spec.env.batched is not None:
        raise RolloutError(
            f"env.batched: {spec.env.batched}: aa-ray rollout records whole episodes of gymnasium env copies, and "
            "a batched env is not supported by it yet; train on the batched env, and record the dataset from a spec "
            "of the same task without env.batched where one exists"
        )
    obs, act_dim = env_dims(spec)  # SpecError for an env that cannot be made or used
    policy_state = None
    if scripted:
        check_scripted(spec)
        producer = "scripted"
    else:
        spec, policy_state = policy_from_checkpoint(spec, checkpoint, trust_code, checkpoint_sha256)
        producer = str(Path(checkpoint).resolve())
    meta = dataset_meta(spec, producer)
    try:
        writer = open_writer(spec, out, meta, dataset_format, dataset_id, overwrite)
    except (OSError, pa.ArrowException) as err:
        raise not_written(Path(out or "."), err) from None

    # closed (moved into place) only once every episode is written; removed on any error
    with whole_or_nothing(writer):
        started_ray = spec.runtime.backend == "ray" and cluster.connect(spec)
        graph: ActorGraph | None = None
        try:
            graph = ActorGraph(spec, obs, act_dim, learning=False, runner=DatasetRecorder)
            graph.start()
            runners = graph.runners
            if policy_state is not None:
                graph.load_runner_weights(policy_state)

            per_call = max(spec.runners.envs_per_runner, math.ceil(episodes / (len(runners) * ROUNDS)))
            next_id = 0

            def submit() -> list:
                nonlocal next_id
                calls = []
                for runner in runners:
                    n = min(per_call, episodes - next_id)
                    if n > 0:
                        calls.append(runner.rollout.remote(n, next_id, scripted=scripted, deterministic=deterministic))
                        next_id += n
                return calls

            returns: list[float] = []
            infos: dict[str, list[float]] = {}  # info key -> each episode's value at its end (envs.info_metrics)
            pending = submit()
            while pending:
                results = get_results(pending)
                pending = submit()  # the next round runs while this one is written
                for transitions, stats in results:
                    writer.write(transitions)
                    returns += [episode.episode_return for episode in stats]
                    for episode in stats:
                        for key, value in episode.info.items():
                            infos.setdefault(key, []).append(value)
                line = f"rollout: {len(returns)}/{episodes} episodes, {writer.num_transitions:,} transitions"
                line += f", mean return {np.mean(returns):.4g}"
                line += "".join(f", mean {metric_name(key)} {np.mean(values):.4g}" for key, values in infos.items())
                report(line)
            summary = {
                "path": str(writer.path),
                "format": dataset_format,
                "episodes": len(returns),
                "transitions": writer.num_transitions,
                "mean_return": float(np.mean(returns)),
                "producer": producer,
            }
            if dataset_format == minari_format.FORMAT:
                summary["dataset_id"] = writer.dataset_id
            # each task metric's mean at the episodes' ends: mean_success (is_success), mean_<key>
            summary |= {f"mean_{metric_name(key)}": float(np.mean(values)) for key, values in infos.items()}
            return summary
        finally:
            if graph is not None:
                graph.close()
            cluster.disconnect(started_ray)
