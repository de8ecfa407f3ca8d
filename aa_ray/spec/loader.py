"""Reading spec files, applying `--set` overrides, and turning validation failures into one
readable paragraph that names the file and the field."""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, TypeAdapter, ValidationError

from aa_ray.algos.registry import ALGORITHMS, RENAMED_KNOBS
from aa_ray.errors import SpecError, clip, echo
from aa_ray.spec import hashed_fields
from aa_ray.spec.experiment import ExperimentSpec
from aa_ray.spec.local_checks import check_here
from aa_ray.spec.yaml_files import parse_yaml, read_yaml_file

__all__ = ["load_spec", "validate_spec"]


def read_yaml(path: str | Path) -> dict[str, Any]:
    """The top-level mapping of a spec, sweep, suite or pipeline file (SpecError naming the file)."""
    raw = read_yaml_file(Path(path))
    if not isinstance(raw, dict):
        raise SpecError(f"{path}: a spec must be a YAML mapping at the top level, got {type(raw).__name__}.")
    return raw


def apply_overrides(raw: Mapping[str, Any], overrides: Iterable[str], source: str = "--set") -> dict[str, Any]:
    """Apply `dotted.key=value` overrides to a raw spec dict; values are parsed as YAML scalars."""
    values = {}
    for override in overrides:
        key, sep, text = override.partition("=")
        if not sep or not key.strip():
            raise SpecError(f"{source} {echo(override)}: expected the form dotted.key=value.")
        values[key.strip()] = parse_yaml(text, f"{source} {echo(override)}")
    return set_values(raw, values, source)


def set_values(raw: Mapping[str, Any], values: Mapping[str, Any], source: str = "--set") -> dict[str, Any]:
    """A copy of a raw spec dict with each `dotted.key` set to its value (sections made as needed)."""
    result = copy.deepcopy(dict(raw))
    for key, value in values.items():
        node = result
        parts = key.split(".")
        for depth, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                where = ".".join(parts[: depth + 1])
                raise SpecError(f"{source} {key}: {where} is a value, not a section.")
            node = child
        node[parts[-1]] = copy.deepcopy(value)
    return result


def _field_path(loc: tuple[Any, ...]) -> str:
    # A discriminated union puts the tag into the location (algo.sac.utd_ratio); users wrote algo.utd_ratio.
    parts = [str(p) for p in loc]
    if len(parts) >= 2 and parts[0] == "algo" and parts[1] in ALGORITHMS:
        del parts[1]
    return ".".join(parts) or "(top level)"


# Lines of a validation error at most: a list of thousands of bad items is the same mistake repeated.
MAX_PROBLEMS = 20


def format_validation_error(err: ValidationError, source: str) -> str:
    lines = [f"Invalid spec {clip(source, 1000)}:"]
    problems = err.errors()
    for e in problems[:MAX_PROBLEMS]:
        message = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            message = "unknown key (check the spelling; see README's spec reference)"
            renamed = RENAMED_KNOBS.get(e["loc"][1], {}) if len(e["loc"]) == 3 and e["loc"][0] == "algo" else {}
            if e["loc"][-1] in renamed:
                message = f"unknown key: it was renamed, write {renamed[e['loc'][-1]]} instead"
        path = clip(_field_path(e["loc"]))
        # a section's (or the whole spec's) check may name the exact field itself (env.imports: ...)
        named = re.match(r"[a-z_]+(\.[a-z_]+)+\b", message)
        names_field = named is not None and (not e["loc"] or message.startswith(f"{path}."))
        # a whole-file check may name a top-level field alone (search_space: ...)
        names_field = names_field or (not e["loc"] and re.match(r"[a-z_]+: ", message) is not None)
        # a whole-spec check (empty location) names its fields in the message; its input is the whole spec
        quiet = e["type"] in ("missing", "extra_forbidden") or not e["loc"] or names_field
        shown = "" if quiet else f" (got {echo(e.get('input'))})"
        message = clip(message, 1000)
        lines.append(f"  {message}{shown}" if names_field else f"  {path}: {message}{shown}")
    if len(problems) > MAX_PROBLEMS:
        lines.append(f"  ... and {len(problems) - MAX_PROBLEMS} more problems like these.")
    lines.append("Fix the field(s) named above in the file or the --set override.")
    return "\n".join(lines)


def validate_spec(raw: Mapping[str, Any], source: str = "<spec>", here: bool = False) -> ExperimentSpec:
    """The validated spec, or SpecError in one paragraph. `here`: the spec was just written on this
    machine (a file, an override, a sweep's or suite's or pipeline's spec), so also check what the run
    would fail on before starting anything (`experiment.check_here`: local package folders, the stop
    metric, the mirror's size); a spec revalidated in a worker, a trial or from a checkpoint leaves it."""
    try:
        spec = ExperimentSpec.model_validate(raw)
    except ValidationError as err:
        raise SpecError(format_validation_error(err, source)) from None
    if here:
        try:
            check_here(spec)
        except ValueError as err:  # SpecError included: the env layer's checks raise it
            raise SpecError(
                f"Invalid spec {clip(source, 1000)}:\n  {clip(str(err), 1000)}\n"
                "Fix the field(s) named above in the file or the --set override."
            ) from None
    return spec


def load_spec(path: str | Path, overrides: Iterable[str] = ()) -> ExperimentSpec:
    """Read, override and validate a spec file, and check it as `aa-ray run` would before starting
    anything (`validate_spec(..., here=True)`). Raises SpecError with a user-facing message."""
    overrides = list(overrides)
    raw = apply_overrides(read_yaml(path), overrides)
    source = str(path) + (f" with --set {' '.join(overrides)}" if overrides else "")
    return validate_spec(raw, source, here=True)


def spec_to_dict(spec: ExperimentSpec) -> dict[str, Any]:
    return spec.model_dump(mode="json")


def spec_hash(spec: ExperimentSpec) -> str:
    """A stable content hash of the resolved spec (defaults included, key order irrelevant). A field
    outside `hashed_fields` (every knob added since hashes were first written) counts only when it
    differs from its default, so a new knob never re-keys a finished suite cell or a run name."""
    tree = spec_to_dict(spec)
    for section, values in tree.items():
        if not isinstance(values, dict):
            continue
        model = getattr(spec, section)
        hashed = hashed_fields.ALGORITHMS.get(values.get("name"), frozenset({"name"})) if section == "algo" else (
            hashed_fields.SECTIONS.get(section, frozenset())
        )
        for key in [key for key in values if key not in hashed]:
            if values[key] == _default(type(model), key):
                del values[key]
    canonical = json.dumps(tree, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


def _default(model: type[BaseModel], key: str) -> Any:
    """A field's default in the form `spec_to_dict` writes values (JSON: tuples as lists, models as dicts)."""
    default = model.model_fields[key].get_default(call_default_factory=True)
    return TypeAdapter(model.model_fields[key].annotation).dump_python(default, mode="json")


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"algo": {"gamma": 0.99}}` -> `{"algo.gamma": 0.99}` (lists stay values)."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def spec_yaml(spec: ExperimentSpec) -> str:
    return yaml.safe_dump(spec_to_dict(spec), sort_keys=False)
