"""Property-based input hardening: random YAML documents, random `--set` overrides and random
sweep/pipeline files always give either a valid spec or one clear SpecError, never a traceback."""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from aa_ray.errors import SpecError
from aa_ray.spec.experiment import ExperimentSpec
from aa_ray.spec.loader import apply_overrides, flatten, load_spec, read_yaml, spec_to_dict, validate_spec
from aa_ray.tune.specs import load_pipeline, load_sweep

SPECS = Path(__file__).resolve().parents[1] / "specs"
BASES = {name: read_yaml(SPECS / name) for name in ("sac.yaml", "ppo.yaml", "sac_simba.yaml", "td3.yaml")}
DOTTED = sorted({key for raw in BASES.values() for key in flatten(spec_to_dict(validate_spec(raw)))})
SECTIONS = sorted({key.split(".")[0] for key in DOTTED})
FIELDS = sorted({part for key in DOTTED for part in key.split(".")})

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**12), 10**12), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12), st.sampled_from(["sac", "ppo", "td3", "sac_simba", "aa_ray/PusherReach-v0", "-1", "1e9"]),
)
keys = st.one_of(st.sampled_from(FIELDS), st.text(max_size=8))
values = st.recursive(
    scalars, lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=5)),
    max_leaves=25,
)
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def check(raw: object) -> None:
    try:
        spec = validate_spec(raw, source="<fuzz>")  # type: ignore[arg-type]
    except SpecError as err:
        assert str(err).startswith("Invalid spec <fuzz>") and "Traceback" not in str(err)
    else:
        assert isinstance(spec, ExperimentSpec)


@FAST
@given(st.dictionaries(st.one_of(st.sampled_from(SECTIONS), st.text(max_size=8)), values, max_size=8))
def test_random_documents_validate_or_fail_cleanly(document: dict) -> None:
    check(document)


@FAST
@example(base="ppo.yaml", overrides=[("algo.name", [])])  # a list is unhashable: once a TypeError, not a SpecError
@given(st.sampled_from(sorted(BASES)), st.lists(st.tuples(st.one_of(st.sampled_from(DOTTED), keys), values),
                                                   min_size=1, max_size=4))
def test_random_overrides_validate_or_fail_cleanly(base: str, overrides: list[tuple[str, object]]) -> None:
    texts = [f"{key}={yaml.safe_dump(value, default_flow_style=True).strip()}" for key, value in overrides]
    try:
        raw = apply_overrides(BASES[base], texts)
    except SpecError:
        return
    check(raw)


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=200))
def test_random_text_files_are_read_or_refused(text: str) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "spec.yaml"
        path.write_text(text)
        for load in (load_spec, load_sweep, load_pipeline):
            try:
                load(path)
            except SpecError as err:
                assert str(path) in str(err) or "Invalid spec" in str(err)


@settings(max_examples=80, deadline=None)
@given(st.dictionaries(st.sampled_from(["name", "base", "set", "search_space", "metric", "mode", "scheduler", "asha",
                                        "searcher", "stages", "storage", "max_failures"]), values, max_size=6))
def test_random_sweep_and_pipeline_files_fail_cleanly(document: dict) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "file.yaml"
        document = {**document, "base": str(SPECS / "sac.yaml")} if "base" in document else document
        path.write_text(yaml.safe_dump(document))
        for load in (load_sweep, load_pipeline):
            with contextlib.suppress(SpecError):
                load(path)
