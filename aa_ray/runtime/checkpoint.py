"""Checkpoint folders: `state.pt` (torch, loaded with weights_only=True), `spec.yaml`, and
optionally `replay.parquet`.

A folder is written whole or not at all: its files go into `<name>.partial/`, which then replaces
`<name>/` by renames, so a crash mid-write leaves the last complete checkpoint of that name (and
every earlier one) as it was (between the two renames of a replaced folder, under
`<name>.previous/`). `state.pt` records how many replay rows belong with it, and a
resume checks the pair before any actor starts.

In memory a checkpoint is a `records.Checkpoint` (learner, replay, runners, driver, tracking, the
stored spec). `save_checkpoint` is the one writer of the file and `_todays_checkpoint` the one
reader of every older format:
- format 1: no env runner state (the runners restart their envs), no pending normalizer moments
  or recent episodes (the averages start over), the runners' random streams under `runner_rng`;
- format 2 adds those, which a bit-exact resume needs;
- format 3: the knob names of the redesign (one scheme across algorithms); an older stored spec is
  renamed on load (`aa_ray.algos.migrate_old_knobs`);
- format 4: the run's id in each tracking backend (`tracking`), where format 3 kept its MLflow run
  id alone (`mlflow_run_id`).
Within the learner's state, the update count was `critic_updates` before the algorithm families,
and the updates drew from torch's global CPU generator (`torch_rng`) before the learner had a
generator of its own."""

from __future__ import annotations

import hashlib
import io
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from aa_ray.algos.registry import ALGORITHMS, migrate_old_knobs
from aa_ray.data.value_checks import first_bad_value
from aa_ray.errors import SpecError, write_failure
from aa_ray.records import Checkpoint, CheckpointParts, DriverCheckpoint, LearnerState, NormMoments, RunCounters
from aa_ray.runtime.env_state import pack, unpack
from aa_ray.spec.experiment import ExperimentSpec
from aa_ray.spec.loader import flatten, spec_to_dict, spec_yaml, validate_spec
from aa_ray.spec.trust import refuse_untrusted_code, stored_type_errors

FORMAT_VERSION = 4
READABLE_VERSIONS = (1, 2, 3, 4)
STATE_FILE, SPEC_FILE, REPLAY_FILE = "state.pt", "spec.yaml", "replay.parquet"
# Inside an MLflow model folder a run logs (`tracking.models`): its policy as a checkpoint (weights
# and spec), which `load_policy` reads with weights_only=True. MLflow's own flavors beside it run
# code when loaded (the pyfunc loader module; the PyTorch flavor's program unpickles its weights).
MODEL_POLICY_FOLDER = Path("data") / "aa_ray_policy"

# Sections that define what the networks and their data mean. A resumed run may change the
# budget, eval cadence, fleet size or tracking, but not these.
_MUST_MATCH = ("env", "algo")
_PARTIAL = ".partial"


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message names the file and what is wrong."""


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written (a full disk, a folder it may not write to). Its partial
    folder is gone and the checkpoints written before it are as they were."""


def save_checkpoint(folder: Path, spec: ExperimentSpec, parts: CheckpointParts, replay: pa.Table | None = None) -> Path:
    """Write `folder` atomically (see the module docstring): the parts, the spec and the replay table.
    CheckpointWriteError, saying what filled up and where, if the files cannot be written."""
    partial = folder.with_name(folder.name + _PARTIAL)
    shutil.rmtree(partial, ignore_errors=True)  # left by a crash during an earlier write
    try:
        partial.mkdir(parents=True)
        if replay is not None:
            pq.write_table(replay, partial / REPLAY_FILE)
        torch.save(_file_contents(spec, parts, replay.num_rows if replay is not None else None), partial / STATE_FILE)
        (partial / SPEC_FILE).write_text(spec_yaml(spec))
    except (OSError, RuntimeError) as err:  # torch.save reports a full disk as a RuntimeError
        problem = _write_failure(folder, err)  # before the partial files go: they are what filled the disk
        shutil.rmtree(partial, ignore_errors=True)
        raise CheckpointWriteError(problem) from None
    if folder.exists():  # "final" of a resumed run: swap, so one complete version exists at any time
        previous = folder.with_name(folder.name + ".previous")
        shutil.rmtree(previous, ignore_errors=True)
        folder.rename(previous)
        partial.rename(folder)
        shutil.rmtree(previous)
    else:
        partial.rename(folder)
    return folder


def policy_only(policy: dict[str, torch.Tensor]) -> CheckpointParts:
    """A checkpoint's parts that hold an acting policy and nothing else (what an MLflow model keeps:
    `load_policy` reads it, a resume refuses it)."""
    return CheckpointParts(learner=LearnerState(algo={"policy": policy}, weights_version=0, gradient_updates=0,
                                                noise_generator=None))


def _file_contents(spec: ExperimentSpec, parts: CheckpointParts, replay_rows: int | None) -> dict[str, Any]:
    """The state file's contents: plain dicts, lists, numbers, strings and tensors only, which
    `torch.load(weights_only=True)` reads without running any code."""
    contents: dict[str, Any] = {
        "format_version": FORMAT_VERSION, "spec": spec_to_dict(spec),
        "replay": dict(parts.replay), "runners": list(parts.runners), "tracking": dict(parts.tracking),
    }
    if parts.learner is not None:
        contents["learner"] = {key: value for key, value in parts.learner._asdict().items() if value is not None}
    if parts.driver is not None:
        contents["counters"] = parts.driver.counters._asdict()
        contents["driver"] = pack({
            "pending_stats": [moments.to_dict() for moments in parts.driver.pending_stats],
            "returns": list(parts.driver.returns),
            "infos": {key: list(values) for key, values in parts.driver.infos.items()},
        })
    if replay_rows is not None:
        contents["replay_rows"] = replay_rows
    return contents


def _write_failure(folder: Path, err: Exception) -> str:
    return (f"checkpoint {folder} could not be written: {write_failure(folder, err)}; its partial folder was removed, "
            "the earlier checkpoints are intact")


def newest_checkpoint(folder: Path) -> Path | None:
    """The newest complete checkpoint under a run's `checkpoints/` folder: `final`, else the latest
    `step_*`. A `<name>.partial/` a crash left mid-write already holds a (truncated) state file, so
    it is never a candidate."""
    final = folder / "final"
    if (final / STATE_FILE).is_file():
        return final
    steps = complete_steps(folder)
    return steps[-1] if steps else None


def complete_steps(folder: Path) -> list[Path]:
    """A run's complete step_* checkpoints under `folder`, oldest first."""
    return sorted(p for p in folder.glob("step_*") if not p.name.endswith(_PARTIAL) and (p / STATE_FILE).is_file())


def load_checkpoint(path: str | Path, sha256: str | None = None) -> Checkpoint:
    """Read a checkpoint folder (or its state.pt). Raises CheckpointError with a clear message.
    `sha256`: the state file's content hash, recorded when it was written (a pipeline stage's
    output); the file is then read once, and refused unless it still has that hash."""
    path = Path(path)
    state_file = path / STATE_FILE if path.is_dir() else path
    if not state_file.is_file():
        raise CheckpointError(
            f"checkpoint {str(path)!r} not found: pass a checkpoint folder (it holds {STATE_FILE})."
        )
    source: Path | io.BytesIO = state_file
    if sha256 is not None:
        contents = state_file.read_bytes()
        found = hashlib.sha256(contents).hexdigest()
        if found != sha256:
            raise CheckpointError(
                f"checkpoint file {state_file} changed since it was written (sha256 {found[:12]}..., recorded "
                f"{sha256[:12]}...): something replaced it, so it is not read. Run the stage that wrote it again."
            )
        source = io.BytesIO(contents)
    try:
        payload = torch.load(source, map_location="cpu", weights_only=True)
    except Exception as err:  # a damaged file fails anywhere in zip, pickle or tensor decoding
        if isinstance(err, PermissionError):
            raise CheckpointError(f"checkpoint file {state_file} cannot be read ({err}).") from None
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise CheckpointError(
            f"checkpoint file {state_file} is corrupt or not an aa-ray checkpoint ({reason}); "
            "use another checkpoint of the run."
        ) from None
    if not isinstance(payload, dict) or "format_version" not in payload:
        raise CheckpointError(f"checkpoint file {state_file} is not an aa-ray checkpoint.")
    if payload["format_version"] not in READABLE_VERSIONS:
        raise CheckpointError(
            f"checkpoint file {state_file} has format version {payload['format_version']!r}, "
            f"this aa-ray reads versions {', '.join(map(str, READABLE_VERSIONS))}; use the aa-ray that wrote it."
        )
    stored = payload.get("spec")
    damaged = stored_type_errors(stored) if isinstance(stored, dict) else []
    if damaged:  # read strictly: the trust rule compares the strings a spec names code by (spec/trust.py)
        raise CheckpointError(
            f"checkpoint file {state_file} is damaged or was not written by aa-ray: its stored spec's "
            f"{'; '.join(damaged)}. A spec names its code, paths and ids by strings, so nothing of this one was "
            "read or imported; use another checkpoint of the run."
        )
    try:
        return _todays_checkpoint(payload, state_file.parent)
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as err:
        what = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
        raise CheckpointError(
            f"checkpoint file {state_file} is damaged or was not written by aa-ray (format "
            f"{payload['format_version']}: {what}); use another checkpoint of the run."
        ) from None


def _todays_checkpoint(saved: dict[str, Any], folder: Path) -> Checkpoint:
    """A state file of any readable format as today's `Checkpoint` (the module docstring lists what
    each format changed): the one place older formats are read."""
    version = saved["format_version"]
    spec = saved.get("spec")
    if isinstance(spec, dict):
        _todays_algo_section(spec, version)
        _todays_env_section(spec)
    # format 1 kept only the runners' random streams
    runners = saved.get("runners") or [{"numpy_rng": r["numpy"], "torch_rng": r["torch"]}
                                       for r in saved.get("runner_rng", [])]
    tracking = saved.get("tracking")
    if tracking is None:  # formats 1 to 3: the MLflow run alone
        tracking = {"mlflow": saved["mlflow_run_id"]} if saved.get("mlflow_run_id") else {}
    rows = saved.get("replay_rows")
    return Checkpoint(
        folder=folder, spec=spec if isinstance(spec, dict) else {}, written_format=version,
        learner=_todays_learner_state(saved.get("learner")), replay=dict(saved.get("replay") or {}),
        runners=list(runners), driver=_todays_driver_part(saved),
        tracking={str(backend): str(run) for backend, run in tracking.items()},
        replay_rows=rows if isinstance(rows, int) else None,
    )


def _todays_learner_state(saved: dict[str, Any] | None) -> LearnerState | None:
    if saved is None:  # a checkpoint made for rollouts or tests may hold no learner
        return None
    return LearnerState(
        # a policy-only checkpoint (`policy_only`; an MLflow model's, written with the algo part alone
        # before that) holds no counts
        algo=saved["algo"], weights_version=int(saved.get("weights_version", 0)),
        gradient_updates=int(saved.get("gradient_updates", saved.get("critic_updates", 0))),
        noise_generator=saved.get("noise_generator"),
        global_cpu_generator=saved.get("global_cpu_generator", saved.get("torch_rng")),
    )


def _todays_driver_part(saved: dict[str, Any]) -> DriverCheckpoint | None:
    """The driver's part; None when the file holds no run counters (not written by a training run).
    Format 1 kept the counters only: no pending moments, and the averages start over."""
    counters = saved.get("counters")
    if not (isinstance(counters, dict) and all(isinstance(counters.get(key), int) for key in RunCounters._fields)):
        return None
    driver = unpack(saved["driver"]) if "driver" in saved else {}
    return DriverCheckpoint(
        counters=RunCounters(**{key: counters[key] for key in RunCounters._fields}),
        pending_stats=[NormMoments.from_dict(moments) for moments in driver.get("pending_stats", [])],
        returns=[float(value) for value in driver.get("returns", [])],
        # (a checkpoint from before task metrics kept one of them under its own name: its average starts over)
        infos={key: [float(value) for value in values] for key, values in driver.get("infos", {}).items()},
    )


def _todays_algo_section(stored: dict[str, Any], version: int) -> None:
    """The stored algo section in today's knob names (a checkpoint from before the knob redesign,
    format < 3), with today's defaults for knobs added since it was written (e.g. `sym_aug`), so it
    compares equal to a spec that means the same run. A section that does not validate is left for
    the resume checks to name."""
    algo = stored.get("algo")
    if not isinstance(algo, dict) or algo.get("name") not in ALGORITHMS:
        return
    try:
        renamed = migrate_old_knobs(algo) if version < 3 else algo
    except (TypeError, ValueError, ZeroDivisionError):  # a damaged section: the resume checks name it
        return
    try:
        stored["algo"] = ALGORITHMS[algo["name"]].config.model_validate(renamed).model_dump(mode="json")
    except ValueError:
        stored["algo"] = renamed


# env fields added since checkpoints were first written, with the values that mean "as before"
ENV_FIELDS_ADDED = {"entry_point": None, "imports": [], "py_modules": [], "mirror": None}


def _todays_env_section(stored: dict[str, Any]) -> None:
    """The stored env section with the fields added since it was written, so it compares equal to
    a spec that means the same env."""
    env = stored.get("env")
    if isinstance(env, dict):
        for key, value in ENV_FIELDS_ADDED.items():
            env.setdefault(key, value)


def checkpoint_spec(checkpoint: Checkpoint, *, trust_code: bool) -> ExperimentSpec:
    """The spec stored in a checkpoint, validated. Validating imports the code it names, so a spec
    that names any is refused first (`spec.trust.UntrustedCodeError`) unless `trust_code`: the
    caller says whether the checkpoint is the user's own (a run reading its own checkpoints) or a
    file the user merely passed."""
    refuse_untrusted_code(checkpoint.spec, f"checkpoint {checkpoint.folder}", trust_code, instead=(
        "A policy can also be loaded with your own env: load_policy(checkpoint, env_creator=...)."))
    try:
        return validate_spec(checkpoint.spec, source=f"stored in checkpoint {checkpoint.folder}")
    except SpecError as err:
        raise CheckpointError(str(err)) from None


def checkpoint_policy(checkpoint: Checkpoint, *, trust_code: bool) -> tuple[ExperimentSpec, dict[str, torch.Tensor]]:
    """The spec a checkpoint was trained with and its acting policy's weights (CheckpointError if
    it holds none; UntrustedCodeError as `checkpoint_spec`)."""
    trained = checkpoint_spec(checkpoint, trust_code=trust_code)
    return trained, checkpoint_weights(checkpoint)


def checkpoint_weights(checkpoint: Checkpoint) -> dict[str, torch.Tensor]:
    """A checkpoint's acting policy's weights, checked finite, without reading its stored spec
    (CheckpointError if it holds none)."""
    state = checkpoint.learner.algo.get("policy") if checkpoint.learner is not None else None
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {checkpoint.folder} holds no policy weights.")
    _refuse_non_finite_weights(checkpoint.folder, state)
    return state


def _refuse_non_finite_weights(folder: Path, state: dict[str, Any]) -> None:
    """A policy with a NaN or infinite weight or buffer acts NaN (or its normalizer turns every
    observation into one): evaluating it would report numbers that mean nothing, exporting it would
    ship it. CheckpointError naming the first such tensor."""
    bad = [(name, tensor) for name, tensor in state.items()
           if isinstance(tensor, torch.Tensor) and tensor.is_floating_point() and not torch.isfinite(tensor).all()]
    if bad:
        name, tensor = bad[0]
        count = int((~torch.isfinite(tensor)).sum())
        others = f" (and {len(bad) - 1} more of its tensors)" if len(bad) > 1 else ""
        raise CheckpointError(
            f"checkpoint {folder}: its policy is not finite: tensor {name} holds {count} NaN or infinite values of "
            f"{tensor.numel()}{others}. The run had diverged when it wrote this checkpoint; evaluate or export an "
            "earlier checkpoint of the run (its checkpoints/step_* folders)."
        )


def env_algo_differences(spec: ExperimentSpec, checkpoint: Checkpoint) -> dict[str, tuple[Any, Any]]:
    """The env and algo fields whose values differ between a checkpoint and a spec: dotted key ->
    (the checkpoint's value, the spec's). CheckpointError if the checkpoint holds no readable spec."""
    stored = checkpoint.spec
    if not all(isinstance(stored.get(k), dict) for k in _MUST_MATCH):
        raise CheckpointError(f"checkpoint {checkpoint.folder} holds no readable spec; it cannot be resumed.")
    saved = flatten({k: stored[k] for k in _MUST_MATCH})
    wanted = flatten({k: spec_to_dict(spec)[k] for k in _MUST_MATCH})
    return {key: (saved.get(key), wanted.get(key)) for key in sorted(set(saved) | set(wanted))
            if saved.get(key) != wanted.get(key) and not (key not in saved and _is_default(spec, key, wanted[key]))}


def _is_default(spec: ExperimentSpec, key: str, value: Any) -> bool:
    """Whether `value` is the default of the spec field `key` (section.field): a field added after a
    checkpoint was written (env.batched, env.device) is absent from it, and its default changes nothing."""
    section, _, name = key.partition(".")
    field = type(getattr(spec, section)).model_fields.get(name)
    if field is None or field.is_required():
        return False
    return value == field.get_default(call_default_factory=True)


def check_compatible(spec: ExperimentSpec, checkpoint: Checkpoint) -> None:
    """Refuse to resume a checkpoint into a spec whose env or algorithm differ."""
    diffs = [f"{key}: checkpoint has {saved!r}, spec has {wanted!r}"
             for key, (saved, wanted) in env_algo_differences(spec, checkpoint).items()]
    if diffs:
        raise CheckpointError(
            f"checkpoint {checkpoint.folder} was made with a different env/algo than this spec:\n  "
            + "\n  ".join(diffs)
            + "\nResume with the spec stored beside the checkpoint (spec.yaml), or start a new run."
        )


# what to pass to resume with an empty buffer instead of the checkpoint's replay file
WITHOUT_REPLAY = "--resume-without-replay (Python: fit(..., resume_without_replay=True))"


def read_replay(checkpoint: Checkpoint, obs_dim: int, act_dim: int, without_replay: bool = False) -> pa.Table | None:
    """The checkpoint's replay table, checked against the state beside it and the env's dims; None
    when the checkpoint kept no replay or `without_replay` (the user chose an empty buffer).
    CheckpointError naming the file otherwise, also when a replay file written with the checkpoint
    is gone: a resume must not quietly start from an empty buffer."""
    file = checkpoint.folder / REPLAY_FILE
    if without_replay:
        return None
    if not file.is_file():
        rows = checkpoint.replay_rows  # None: written without one (checkpoint.save_replay: false, on-policy)
        if rows is None:
            return None
        raise CheckpointError(
            f"replay file {file} is missing: checkpoint {checkpoint.folder} was written with one ({rows:,} rows), "
            "and a run resumed without it starts from an empty buffer (it would not continue as the stopped run "
            "would have). Put the file back, resume from the run's newest checkpoint (checkpoint.keep_last keeps "
            f"the replay file only there), or resume with an empty buffer that refills: {WITHOUT_REPLAY}."
        )
    try:
        table = pq.read_table(file)
    except (OSError, pa.ArrowException) as err:
        raise CheckpointError(
            f"replay file {file} is truncated or corrupt ({str(err).splitlines()[0]}); resume from another "
            f"checkpoint, or resume with an empty buffer that refills: {WITHOUT_REPLAY}."
        ) from None
    dims = (table.schema.metadata or {}).get(b"aa_ray.replay", b"").decode()
    # a format-1 checkpoint did not say how many rows it wrote; its replay state did
    expected_rows = checkpoint.replay_rows if checkpoint.replay_rows is not None else checkpoint.replay.get("size")
    problem = None
    if dims != f"{obs_dim},{act_dim}":
        problem = f"it holds obs/action dims {dims or 'unknown'}, the env has {obs_dim},{act_dim}"
    elif expected_rows is not None and table.num_rows != expected_rows:
        problem = f"it holds {table.num_rows} rows, its {STATE_FILE} expects {expected_rows}"
    if problem:
        raise CheckpointError(f"replay file {file} does not belong to this checkpoint or env: {problem}.")
    # its columns are the Transitions fields (runtime/replay.py::to_table), every one float32
    bad = first_bad_value(table, table.column_names, action_columns=["action"])
    if bad is not None:
        raise CheckpointError(
            f"replay file {file}: {bad.describe()}, which a resumed run would train on; resume from another "
            f"checkpoint, or resume with an empty buffer that refills: {WITHOUT_REPLAY}."
        )
    return table


def verify_resume(checkpoint: Checkpoint, spec: ExperimentSpec, algorithm: Any, obs_dim: int, act_dim: int,
                  without_replay: bool = False) -> Any:
    """Everything a resume checks before any actor starts: the checkpoint's env and algo match the
    spec, its learner state fits `algorithm` (a freshly built one), and its replay file belongs to
    it (not read with `without_replay`). Returns the replay table (None if it has none or is not
    read). CheckpointError naming the file otherwise."""
    if checkpoint.driver is None:
        raise CheckpointError(
            f"checkpoint {checkpoint.folder} holds no run counters ({', '.join(RunCounters._fields)}), so it was not "
            "written by a training run and cannot be resumed; roll it out instead (aa-ray rollout --checkpoint)."
        )
    check_compatible(spec, checkpoint)
    check_learner_state(checkpoint, algorithm)
    return read_replay(checkpoint, obs_dim, act_dim, without_replay) if spec.algo.replay_actor else None


def check_learner_state(checkpoint: Checkpoint, algorithm: Any) -> None:
    """Load the checkpoint's learner state into a freshly built `algorithm` (on the driver, before
    any actor starts): a file whose tensors or keys do not fit the spec is named here."""
    state_file = checkpoint.folder / STATE_FILE
    if checkpoint.learner is None:
        raise CheckpointError(f"checkpoint file {state_file} lacks learner state; it cannot be resumed.")
    try:
        algorithm.load_state_dict(checkpoint.learner.algo)
    except (KeyError, TypeError) as err:
        raise CheckpointError(
            f"checkpoint file {state_file} lacks learner state ({err!r}); it cannot be resumed."
        ) from None
    except (RuntimeError, ValueError) as err:
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        telling = [line for line in lines if "size mismatch" in line or "Missing" in line]
        detail = (telling or lines or [type(err).__name__])[0]
        raise CheckpointError(
            f"checkpoint file {state_file} does not fit the spec's networks ({detail}); resume with the spec "
            "stored beside it (spec.yaml)."
        ) from None
