"""`aa-ray validate` knows every file kind the README describes: it detects an experiment spec, a
sweep, a suite or a pipeline and validates each as its command will, and a broken one gets one
message naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from aa_ray.cli import main

SPECS = Path(__file__).resolve().parents[1] / "specs"


@pytest.mark.parametrize("path", sorted(SPECS.rglob("*.yaml")), ids=lambda p: str(p.relative_to(SPECS)))
def test_every_shipped_file_validates(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(path)]) == 0, capsys.readouterr().err
    first = capsys.readouterr().out.splitlines()[0]
    kind = {"sweeps": "# sweep ", "suites": "# suite ", "pipelines": "# pipeline "}.get(path.parent.name, "# env ")
    assert first.startswith(kind), first


def broken(tmp_path: Path, name: str, text: str) -> str:
    """A file beside copies of the shipped specs it refers to (relative paths as in specs/)."""
    (tmp_path / "specs").mkdir(exist_ok=True)
    for spec in ("sac_bee.yaml", "sac.yaml", "ppo.yaml", "rlpd.yaml"):
        (tmp_path / "specs" / spec).write_text((SPECS / spec).read_text())
    path = tmp_path / "specs" / "kind" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(("name", "text", "named"), [
    ("suite.yaml", "name: s\nspecs: {sac: ../sac.yaml}\nenvs: {Pendulum-v1: {}}\nseeds: [0, 0]\nenv_steps: 1000\n",
     "seeds repeat"),
    ("suite_typo.yaml", "name: s\nspecs: {sac: ../sac.yaml}\nenvs: {Pendulum-v1: {}}\nseedz: [0]\nenv_steps: 1000\n",
     "seedz: unknown key"),
    ("sweep.yaml", "name: w\nbase: ../sac_bee.yaml\nsearch_space: {algo.bee_lambda: {grid: [0.5, 7]}}\n",
     "algo.bee_lambda"),
    ("pipeline.yaml",
     "name: p\nstages:\n  rl: {kind: train, spec: ../rlpd.yaml, inputs: {algo.prior_data: data.dataset}}\n",
     "refers to stage 'data'"),
])
def test_a_broken_sweep_suite_or_pipeline_gets_one_message_naming_its_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, text: str, named: str
) -> None:
    assert main(["validate", broken(tmp_path, name, text)]) == 2
    captured = capsys.readouterr()
    assert named in captured.err and "Traceback" not in captured.err and not captured.out, captured.err
    assert "unknown key" not in captured.err.replace("seedz: unknown key", ""), captured.err  # recognized as what it is


def test_a_file_of_no_known_kind_is_named_with_what_each_kind_has(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "what.yaml"
    path.write_text("name: x\nfoo: 1\n")
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "cannot tell which kind of file" in err and "a sweep has" in err and "search_space" in err


def test_set_is_refused_for_a_sweep_naming_where_to_put_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(SPECS / "sweeps" / "utd_bee.yaml"), "--set", "seed=1"]) == 2
    assert "edit its set: section" in capsys.readouterr().err
