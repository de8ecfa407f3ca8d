"""Spec loading: bad input is rejected with a message naming the field, and nothing starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import ray
import yaml

from aa_ray.algos.registry import ALGORITHMS
from aa_ray.cli import main
from aa_ray.errors import SpecError
from aa_ray.spec import hashed_fields
from aa_ray.spec.experiment import ExperimentSpec
from aa_ray.spec.loader import apply_overrides, load_spec, spec_hash, validate_spec

SPECS = Path(__file__).resolve().parents[1] / "specs"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    return path


MINIMAL = """
name: t
env: {id: Pendulum-v1}
algo: {name: sac, warm_up_steps: 100}
budget: {env_steps: 1000}
"""


@pytest.mark.parametrize("spec_file", sorted([*SPECS.glob("*.yaml"), *SPECS.glob("mujoco/*.yaml")]),
                         ids=lambda p: str(p.relative_to(SPECS)))
def test_shipped_specs_validate(spec_file: Path) -> None:
    spec = load_spec(spec_file)
    assert spec.name


# (file contents or overrides, text the error must contain)
BAD_FILES = [
    ("name: t\nenv: {id: Pendulum-v1}\nalgo: {name: sac}\nbudget: {env_steps: 1000}\nbogus: 1\n", "bogus: unknown key"),
    (MINIMAL + "runners: {num_runnerz: 2}\n", "runners.num_runnerz: unknown key"),
    (MINIMAL.replace("warm_up_steps: 100", "warm_up_steps: many"), "algo.warm_up_steps"),
    (MINIMAL.replace("env_steps: 1000", "env_steps: -5"), "budget.env_steps"),
    (MINIMAL.replace("name: sac,", "name: ddpg,"), "algo"),
    (MINIMAL.replace("Pendulum-v1", "Pendulm-v1"), "env.id: unknown gymnasium env id 'Pendulm-v1'"),
    (MINIMAL.replace("budget: {env_steps: 1000}", ""), "budget: Field required"),
    (MINIMAL.replace("warm_up_steps: 100", "warm_up_steps: 5000"), "algo.warm_up_steps (5000) must be below budget"),
    ("- just\n- a list\n", "must be a YAML mapping"),
    ("name: [unclosed\n", "not valid YAML"),
    (MINIMAL + "learners: {num_learners: 3}\n", "algo.batch_size (256) must be divisible by learners.num_learners (3)"),
    (MINIMAL + "learners: {backend: nccl}\n", "backend nccl needs GPUs"),
    (MINIMAL + "runtime: {mode: turbo}\n", "runtime.mode"),
    (MINIMAL.replace("name: sac,", "name: sac_simba, lr_end_fraction: 1.5,"), "algo.lr_end_fraction"),
    # a knob renamed by the redesign says what it is called now
    (MINIMAL.replace("name: sac,", "name: sac, hidden_dims: [64],"),
     "algo.hidden_dims: unknown key: it was renamed, write actor_hidden_dims and critic_hidden_dims instead"),
    (MINIMAL.replace("name: sac,", "name: sac_simba, learning_rate: 0.001,"), "write actor_lr, critic_lr and alpha_lr"),
    # the early stop names an eval metric and exactly one bound; task metrics are simple identifiers
    (MINIMAL.replace("env_steps: 1000}", "env_steps: 1000, stop_at: {metric: train/episode_return, above: 0}}"),
     "budget.stop_at.metric: must name an eval metric, eval/<name>"),
    (MINIMAL.replace("env_steps: 1000}", "env_steps: 1000, stop_at: {metric: eval/return}}"),
     "budget.stop_at: give exactly one of below, above"),
    (MINIMAL.replace("env_steps: 1000}", "env_steps: 1000, stop_at: {metric: eval/return, below: 1, above: 2}}"),
     "budget.stop_at: give exactly one of below, above"),
    (MINIMAL.replace("env_steps: 1000}", "env_steps: 1000, stop_at_eval_return: 1, stop_at: {metric: eval/return, "
                     "above: 2}}"), "budget.stop_at and the shorthands"),
    (MINIMAL + "eval: {info_metrics: [distance, tip-error]}\n",
     "eval.info_metrics: each name must be an info key that is a simple identifier"),
    (MINIMAL + "eval: {info_metrics: [return]}\n", "eval.info_metrics: 'return' would clash"),
]


@pytest.mark.parametrize(("text", "expected"), BAD_FILES)
def test_bad_spec_files_name_the_field(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(SpecError) as err:
        load_spec(write(tmp_path, text))
    assert expected in str(err.value)
    assert str(tmp_path / "spec.yaml") in str(err.value)  # the file is named too


BAD_OVERRIDES = [
    (["algo.utd_ratio=-1"], "algo.utd_ratio"),
    (["algo.utd_ratio=fast"], "algo.utd_ratio"),
    (["algo.batch_size=0"], "algo.batch_size"),
    (["algo.critic_hidden_dims=[]"], "algo.critic_hidden_dims"),
    (["algo.gamma=1.5"], "algo.gamma"),
    (["env.idd=Pendulum-v1"], "env.idd: unknown key"),
    (["seed=-3"], "seed"),
    (["algo.batch_size=4096", "algo.buffer_size=1000"], "exceeds algo.buffer_size"),
    (["budget.env_steps.x=1"], "budget.env_steps is a value, not a section"),
    (["no_equals_sign"], "expected the form dotted.key=value"),
]


@pytest.mark.parametrize(("overrides", "expected"), BAD_OVERRIDES)
def test_bad_overrides_name_the_field(tmp_path: Path, overrides: list[str], expected: str) -> None:
    with pytest.raises(SpecError) as err:
        load_spec(write(tmp_path, MINIMAL), overrides)
    assert expected in str(err.value)


def test_overrides_are_typed_like_the_file(tmp_path: Path) -> None:
    spec = load_spec(
        write(tmp_path, MINIMAL), ["algo.utd_ratio=4", "algo.actor_hidden_dims=[64, 64]",
            "algo.critic_hidden_dims=[64, 64]", "tracking.enabled=false"]
    )
    assert spec.algo.utd_ratio == 4
    assert spec.algo.actor_hidden_dims == spec.algo.critic_hidden_dims == [64, 64]
    assert spec.tracking.enabled is False


def test_spec_hash_is_stable_and_content_addressed(tmp_path: Path) -> None:
    raw = yaml.safe_load(MINIMAL)
    reordered = dict(reversed(list(raw.items())))
    assert spec_hash(validate_spec(raw)) == spec_hash(validate_spec(reordered))
    # spelling out a default does not change what the spec means
    assert spec_hash(validate_spec(raw)) == spec_hash(validate_spec(apply_overrides(raw, ["algo.gamma=0.99"])))
    assert spec_hash(validate_spec(raw)) != spec_hash(validate_spec(apply_overrides(raw, ["algo.gamma=0.9"])))


def test_new_knobs_left_at_their_defaults_keep_the_hashes_of_shipped_specs() -> None:
    """Finished suite cells and reusable pipeline stages are keyed by these hashes (from before
    budget.stop_at and eval.info_metrics existed)."""
    assert spec_hash(load_spec(SPECS / "sac_simba.yaml")) == "c7574ac5f92a"  # uses stop_at_eval_distance
    assert spec_hash(load_spec(SPECS / "sac.yaml")) == "53e856b8ac63"
    assert spec_hash(load_spec(SPECS / "rlpd.yaml", ["budget.stop_at_eval_distance=0.05"])) == "3b5823f10df3"
    spelled_out = load_spec(SPECS / "sac.yaml", ["eval.info_metrics=[]", "budget.stop_at=null"])
    assert spec_hash(spelled_out) == "53e856b8ac63"
    listed = load_spec(SPECS / "sac.yaml", ["eval.info_metrics=[distance]"])
    assert spec_hash(listed) != "53e856b8ac63"  # a knob that is set is part of the content


def test_a_knob_added_later_keeps_the_hashes_without_being_listed() -> None:
    """`hashed_fields` is frozen: a field outside it (algo.plugin, env.imports, every knob of an
    algorithm added since, as CrossQ's) changes a spec's hash only when it is set away from its
    default. An algorithm's name always counts."""
    for section, fields in hashed_fields.SECTIONS.items():
        assert fields <= set(ExperimentSpec.model_fields[section].annotation.model_fields), section
    for name, fields in hashed_fields.ALGORITHMS.items():
        assert fields <= set(ALGORITHMS[name].config.model_fields), name
    base = spec_hash(load_spec(SPECS / "crossq.yaml"))
    assert spec_hash(load_spec(SPECS / "crossq.yaml", ["algo.adam_beta1=0.5", "algo.plugin=null"])) == base
    assert spec_hash(load_spec(SPECS / "crossq.yaml", ["algo.adam_beta1=0.9"])) != base
    assert spec_hash(load_spec(SPECS / "sac.yaml", ["env.imports=[]"])) == "53e856b8ac63"
    raw = yaml.safe_load((SPECS / "sac.yaml").read_text())
    plain = [validate_spec({**raw, "algo": {"name": name}}) for name in ("crossq", "droq")]
    assert spec_hash(plain[0]) != spec_hash(plain[1])


def test_the_stop_shorthands_are_stop_at_rules(tmp_path: Path) -> None:
    budget = load_spec(SPECS / "sac_simba.yaml").budget
    assert [(r.metric, r.below, r.above) for r in budget.stop_rules] == [("eval/distance", 0.009, None)]
    budget = load_spec(write(tmp_path, MINIMAL), ["budget.stop_at_eval_return=-200"]).budget
    assert [(r.metric, r.below, r.above) for r in budget.stop_rules] == [("eval/return", None, -200.0)]
    budget = load_spec(write(tmp_path, MINIMAL), ["budget.stop_at={metric: eval/success, above: 0.9}"]).budget
    assert [(r.metric, r.below, r.above) for r in budget.stop_rules] == [("eval/success", None, 0.9)]


def test_specs_are_frozen(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, MINIMAL))
    with pytest.raises(Exception):  # noqa: B017  (pydantic raises ValidationError for frozen models)
        spec.algo.utd_ratio = 3


@pytest.mark.fresh_store  # it checks that no MLflow store is made
def test_cli_rejects_bad_spec_without_starting_ray(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = write(tmp_path, MINIMAL)
    code = main(["run", str(path), "--set", "algo.utd_ratio=-1"])
    assert code == 2
    err = capsys.readouterr().err
    assert "algo.utd_ratio" in err and "Traceback" not in err
    assert not ray.is_initialized()
    assert not (tmp_path / "mlflow.db").exists()


def test_cli_validate_prints_resolved_spec() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "aa_ray.cli", "validate", str(SPECS / "sac_pendulum.yaml"), "--set", "algo.utd_ratio=3"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "utd_ratio: 3" in out and "spec hash" in out and "bundles" in out


def test_cli_missing_file_is_one_clear_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "aa_ray.cli", "run", str(tmp_path / "nope.yaml")], capture_output=True, text=True
    )
    assert result.returncode == 2
    assert "does not exist" in result.stderr and "Traceback" not in result.stderr


def test_env_that_cannot_be_made_stops_before_ray(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    code = main(["run", str(write(tmp_path, MINIMAL)), "--set", "env.kwargs.no_such_option=1"])
    assert code == 2
    err = capsys.readouterr().err
    assert "env.kwargs" in err and "no_such_option" in err and "Traceback" not in err
    assert not ray.is_initialized()
