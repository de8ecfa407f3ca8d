"""Checkpoint folders: `state.pt` (torch, loaded with weights_only=True), `spec.yaml`, and
optionally `replay.parquet`."""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch

from aa_ray.spec.experiment import ExperimentSpec
from aa_ray.spec.loader import SpecError, flatten, spec_to_dict, spec_yaml, validate_spec

FORMAT_VERSION = 1
STATE_FILE, SPEC_FILE, REPLAY_FILE = "state.pt", "spec.yaml", "replay.parquet"

# Sections that define what the networks and their data mean. A resumed run may change the
# budget, eval cadence, fleet size or tracking, but not these.
_MUST_MATCH = ("env", "algo")


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message names the file and what is wrong."""


def save_checkpoint(folder: Path, spec: ExperimentSpec, state: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    payload = {"format_version": FORMAT_VERSION, "spec": spec_to_dict(spec), **state}
    tmp = folder / (STATE_FILE + ".tmp")
    torch.save(payload, tmp)
    tmp.replace(folder / STATE_FILE)  # a crash mid-write never leaves a half checkpoint behind
    (folder / SPEC_FILE).write_text(spec_yaml(spec))
    return folder


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint folder (or its state.pt). Raises CheckpointError with a clear message."""
    path = Path(path)
    state_file = path / STATE_FILE if path.is_dir() else path
    if not state_file.is_file():
        raise CheckpointError(
            f"checkpoint {str(path)!r} not found: pass a checkpoint folder (it holds {STATE_FILE})."
        )
    try:
        payload = torch.load(state_file, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, zipfile.BadZipFile, pickle.UnpicklingError, ValueError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise CheckpointError(
            f"checkpoint file {state_file} is corrupt or not an aa-ray checkpoint ({reason}); "
            "use another checkpoint of the run."
        ) from None
    if not isinstance(payload, dict) or "format_version" not in payload:
        raise CheckpointError(f"checkpoint file {state_file} is not an aa-ray checkpoint.")
    if payload["format_version"] != FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint file {state_file} has format version {payload['format_version']}, "
            f"this aa-ray reads version {FORMAT_VERSION}."
        )
    payload["folder"] = state_file.parent
    return payload


def checkpoint_spec(payload: dict[str, Any]) -> ExperimentSpec:
    try:
        return validate_spec(payload["spec"], source=f"stored in checkpoint {payload['folder']}")
    except SpecError as err:
        raise CheckpointError(str(err)) from None


def check_compatible(spec: ExperimentSpec, payload: dict[str, Any]) -> None:
    """Refuse to resume a checkpoint into a spec whose env or algorithm differ."""
    saved = flatten({k: payload["spec"][k] for k in _MUST_MATCH})
    wanted = flatten({k: spec_to_dict(spec)[k] for k in _MUST_MATCH})
    diffs = [
        f"{key}: checkpoint has {saved.get(key)!r}, spec has {wanted.get(key)!r}"
        for key in sorted(set(saved) | set(wanted))
        if saved.get(key) != wanted.get(key)
    ]
    if diffs:
        raise CheckpointError(
            f"checkpoint {payload['folder']} was made with a different env/algo than this spec:\n  "
            + "\n  ".join(diffs)
            + "\nResume with the spec stored beside the checkpoint (spec.yaml), or start a new run."
        )
