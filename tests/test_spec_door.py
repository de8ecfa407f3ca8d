"""What a spec may hold, checked at the door: names that become folders are a safe, bounded set of
characters; numbers are finite; counts and switches are numbers and booleans of their own kind; and
a hostile or mistaken file (alias bombs, deep nesting, other encodings, huge files, folders,
duplicate keys) ends in one bounded SpecError naming the file, never a traceback."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from aa_ray.errors import SpecError
from aa_ray.spec.base import SpecModel
from aa_ray.spec.loader import load_spec, read_yaml
from aa_ray.spec.yaml_files import MAX_FILE_BYTES
from aa_ray.tune.specs import load_pipeline, load_suite, load_sweep

MINIMAL = """\
name: t
env: {id: Pendulum-v1}
algo: {name: sac, warm_up_steps: 100}
budget: {env_steps: 1000}
"""
# A message is one paragraph a person reads: whatever the file holds, it stays this short.
MESSAGE_LIMIT = 4000


def write(folder: Path, text: str | bytes, name: str = "spec.yaml") -> Path:
    path = folder / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def refused(load, *args) -> str:
    with pytest.raises(SpecError) as err:
        load(*args)
    message = str(err.value)
    assert len(message) < MESSAGE_LIMIT, message[:300]
    return message


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "aa_ray.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


# ---- names ----------------------------------------------------------------------------------------

BAD_NAMES = ["../../x", "/etc/x", "a[bold]b", "x" * 101, ".hidden", "-rf", "two words", "", "naïve", "a/b", "tab\tx"]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_an_unsafe_run_name_is_refused_naming_the_field_and_the_rule(tmp_path: Path, name: str) -> None:
    message = refused(load_spec, write(tmp_path, MINIMAL), [f"name={yaml.safe_dump(name).splitlines()[0]}"])
    assert "\n  name: must be 1 to 100 characters: ASCII letters, digits, '_', '.' and '-'" in message


@pytest.mark.parametrize("name", ["t", "x" * 100, "sac_pusher-v2.1", "_private", "0day"])
def test_safe_run_names_pass(tmp_path: Path, name: str) -> None:
    assert load_spec(write(tmp_path, MINIMAL), [f"name={name}"]).name == name


@pytest.mark.fresh_store  # it checks what its folder holds
def test_the_cli_refuses_a_name_that_climbs_out_of_the_output_folder(tmp_path: Path) -> None:
    spec = write(tmp_path, MINIMAL)
    result = cli("run", str(spec), "--set", "name=../../escaped", "--set", "tracking.enabled=false", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "name: must be 1 to 100 characters" in result.stderr and "Traceback" not in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.yaml"]  # nothing written anywhere
    assert not (tmp_path.parent.parent / "escaped").exists()


def tune_files(folder: Path) -> dict[str, Path]:
    """A valid sweep, suite and pipeline over MINIMAL, to break one field at a time."""
    write(folder, MINIMAL, "base.yaml")
    return {
        "sweep": write(folder, "name: lr\nbase: base.yaml\nsearch_space:\n  algo.actor_lr: {grid: [0.001, 0.0003]}\n",
                       "sweep.yaml"),
        "suite": write(folder, "name: bench\nspecs: {sac: base.yaml}\nenvs: {Pendulum-v1: {}}\nseeds: [0]\n"
                       "env_steps: 1000\n", "suite.yaml"),
        "pipeline": write(folder, "name: chain\nstages:\n  first: {kind: train, spec: base.yaml}\n", "pipeline.yaml"),
    }


LOADERS = {"sweep": load_sweep, "suite": load_suite, "pipeline": load_pipeline}
TUNE_BREAKS = [
    ("sweep", "name: lr", "name: ../lr", "name: must be 1 to 100 characters"),
    ("sweep", "name: lr", "name: '[red]lr'", "name: must be 1 to 100 characters"),
    ("suite", "name: bench", f"name: {'b' * 101}", "name: must be 1 to 100 characters"),
    ("suite", "specs: {sac: base.yaml}", "specs: {'sac/../..': base.yaml}", "must be 1 to 100 characters"),
    ("suite", "envs: {Pendulum-v1: {}}", "envs: {'Pendulum v1': {}}", "part of its cells' folder names"),
    ("pipeline", "name: chain", "name: /chain", "name: must be 1 to 100 characters"),
    ("pipeline", "  first:", "  '../first':", "must be 1 to 100 characters"),
]


@pytest.mark.parametrize(("kind", "good", "bad", "says"), TUNE_BREAKS)
def test_sweep_suite_and_pipeline_names_are_checked_the_same_way(
    tmp_path: Path, kind: str, good: str, bad: str, says: str
) -> None:
    path = tune_files(tmp_path)[kind]
    LOADERS[kind](path)  # the unbroken file loads
    path.write_text(path.read_text().replace(good, bad, 1))
    message = refused(LOADERS[kind], path)
    assert str(path) in message and says in message, message


# ---- values ---------------------------------------------------------------------------------------

NON_FINITE = [("algo.actor_lr=.inf", "algo.actor_lr"), ("algo.gamma=.nan", "algo.gamma"),
              ("budget.stop_at_eval_return=-.inf", "budget.stop_at_eval_return"),
              ("runtime.q_warning_bound=1e999", "runtime.q_warning_bound"),  # a string YAML leaves, inf as a float
              ("budget.stop_at={metric: eval/return, above: .nan}", "budget.stop_at.above"),
              ("learners.cpus_per_learner=inf", "learners.cpus_per_learner")]


@pytest.mark.parametrize(("override", "field"), NON_FINITE)
def test_non_finite_numbers_are_refused_naming_the_field(tmp_path: Path, override: str, field: str) -> None:
    message = refused(load_spec, write(tmp_path, MINIMAL), [override])
    assert f"\n  {field}: Input should be a finite number" in message, message


def test_every_spec_model_refuses_non_finite_numbers() -> None:
    """The shared config reaches each section and algorithm config, and the sweep/suite/pipeline
    models; none opts out (no knob may be infinite)."""
    import aa_ray.tune.specs  # noqa: F401  (its models are SpecModels too)

    models, todo = [], [SpecModel]
    while todo:
        model = todo.pop()
        models.append(model)
        todo.extend(model.__subclasses__())
    assert len(models) > 30
    assert [m.__name__ for m in models if m.model_config.get("allow_inf_nan") is not False] == []


def test_a_sweep_range_must_be_finite(tmp_path: Path) -> None:
    path = tune_files(tmp_path)["sweep"]
    path.write_text(path.read_text().replace("{grid: [0.001, 0.0003]}", "{uniform: [0.0001, .inf]}"))
    assert "search_space.algo.actor_lr.uniform.1: Input should be a finite number" in refused(load_sweep, path)


STRICT = [
    ("algo.batch_size=true", "algo.batch_size: Input should be a valid integer (got True)"),
    ("seed=false", "seed: Input should be a valid integer (got False)"),
    ("algo.utd_ratio=2.5", "algo.utd_ratio: Input should be a valid integer (got 2.5)"),
    ("budget.env_steps='1000'", "budget.env_steps: Input should be a valid integer (got '1000')"),
    ("algo.actor_hidden_dims=[true, 64]", "algo.actor_hidden_dims.0: Input should be a valid integer (got True)"),
    ("tracking.enabled='yes'", "tracking.enabled: Input should be a valid boolean (got 'yes')"),
    ("tracking.enabled=1", "tracking.enabled: Input should be a valid boolean (got 1)"),
    ("algo.normalize_obs=0", "algo.normalize_obs: Input should be a valid boolean (got 0)"),
    ("algo.actor_lr=true", "algo.actor_lr: must be a number, not true or false (got True)"),
]


@pytest.mark.parametrize(("override", "says"), STRICT)
def test_counts_and_switches_take_only_their_own_kind(tmp_path: Path, override: str, says: str) -> None:
    assert says in refused(load_spec, write(tmp_path, MINIMAL), [override])


def test_floats_still_take_ints_and_yaml_exponents_and_tuples_still_take_lists(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, MINIMAL), ["algo.actor_lr=1", "algo.critic_lr=1e-3", "tracking.enabled=yes"])
    assert (spec.algo.actor_lr, spec.algo.critic_lr, spec.tracking.enabled) == (1.0, 0.001, True)
    ppo = load_spec(write(tmp_path, MINIMAL.replace("name: sac, warm_up_steps: 100", "name: ppo")),
                    ["algo.lr_bounds=[0.0001, 0.01]", "algo.clip_param=[0.1, 0.3]"])
    assert (ppo.algo.lr_bounds, ppo.algo.clip_param) == ((0.0001, 0.01), (0.1, 0.3))
    path = tune_files(tmp_path)["sweep"]
    path.write_text(path.read_text().replace("{grid: [0.001, 0.0003]}", "{loguniform: [0.0001, 1]}"))
    assert load_sweep(path).spec.search_space["algo.actor_lr"].loguniform == (0.0001, 1.0)


# ---- hostile files --------------------------------------------------------------------------------

def alias_bomb(levels: int = 9) -> str:
    """Each level lists the one before nine times: 9**levels values from a few hundred bytes."""
    lines = ["    l0: &l0 [x, x, x, x, x, x, x, x, x]"]
    for level in range(1, levels):
        lines.append(f"    l{level}: &l{level} [{', '.join([f'*l{level - 1}'] * 9)}]")
    return MINIMAL.replace("env: {id: Pendulum-v1}", "env:\n  id: Pendulum-v1\n  kwargs:\n" + "\n".join(lines))


def test_an_alias_bomb_is_refused_quickly_naming_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, alias_bomb())
    assert path.stat().st_size < 700
    started = time.perf_counter()
    message = refused(load_spec, path)
    assert time.perf_counter() - started < 5
    assert message.startswith(f"{path}: holds more than 100,000 values once its aliases (*name) are expanded")


def test_an_alias_bomb_in_a_set_value_is_refused(tmp_path: Path) -> None:
    bomb = "[" + ", ".join(["&a [x, x, x, x, x, x, x, x, x, x]"] + ["*a"] * 9) + "]"
    for level in "bcdef":
        bomb = f"[&{level} {bomb}, " + ", ".join([f"*{level}"] * 9) + "]"
    message = refused(load_spec, write(tmp_path, MINIMAL), [f"env.kwargs.x={bomb}"])
    assert message.startswith("--set 'env.kwargs.x=[&f [&e [&d") and "holds more than 100,000 values" in message


def test_aliases_and_merge_keys_of_ordinary_size_still_work(tmp_path: Path) -> None:
    text = MINIMAL.replace("algo: {name: sac, warm_up_steps: 100}",
                           "algo: {name: sac, warm_up_steps: 100, actor_lr: &lr 0.002, critic_lr: *lr}")
    text += "eval: {<<: {every_env_steps: 500, episodes: 2}, episodes: 3}\n"  # a merge key may be overridden
    spec = load_spec(write(tmp_path, text))
    assert (spec.algo.actor_lr, spec.algo.critic_lr, spec.eval.every_env_steps, spec.eval.episodes) == (
        0.002, 0.002, 500, 3)


@pytest.mark.parametrize("kwargs", ["&k {me: *k}", "[" * 100 + "]" * 100, "[" * 20000 + "]" * 20000])
def test_self_reference_and_deep_nesting_are_one_message(tmp_path: Path, kwargs: str) -> None:
    path = write(tmp_path, MINIMAL.replace("env: {id: Pendulum-v1}", f"env: {{id: Pendulum-v1, kwargs: {kwargs}}}"))
    message = refused(load_spec, path)
    assert message.startswith(f"{path}: nested ") and "Traceback" not in message


def test_a_long_bad_value_and_many_bad_items_give_a_short_message(tmp_path: Path) -> None:
    long_value = "x" * 500_000
    message = refused(load_spec, write(tmp_path, MINIMAL + f"runners: {{num_runners: {long_value}}}\n"))
    assert "runners.num_runners: Input should be a valid integer (got 'xxxx" in message
    assert "(500,002 characters in all)" in message
    many = refused(load_spec, write(tmp_path, MINIMAL), [f"algo.actor_hidden_dims={[-1] * 5000}"])
    assert many.count("\n  algo.actor_hidden_dims.") == 20 and "... and 4980 more problems" in many


def test_a_file_that_is_not_utf8_is_one_message_naming_it(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL.encode().replace(b"name: t", b"name: caf\xe9"))
    assert refused(load_spec, path) == f"{path}: not UTF-8 text (byte 0xe9 at offset 9); save it as UTF-8."


def test_a_file_too_large_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "#" * MAX_FILE_BYTES + "\n")
    assert refused(load_spec, path).startswith(f"{path}: larger than 1 MiB")


def test_a_folder_given_as_the_spec_is_called_a_folder(tmp_path: Path) -> None:
    message = refused(load_spec, tmp_path)
    assert message == f"{tmp_path} is a folder, not a spec file; pass the path of a YAML file in it."
    assert "does not exist" in refused(load_spec, tmp_path / "nope.yaml")


@pytest.mark.parametrize(("text", "key", "lines"), [
    (MINIMAL + "budget: {env_steps: 2000}\n", "'budget'", "line 4 and line 5"),
    (MINIMAL.replace("warm_up_steps: 100", "warm_up_steps: 100, warm_up_steps: 200"), "'warm_up_steps'",
     "line 3 and line 3"),
    (MINIMAL + "runners:\n  num_runners: 2\n  envs_per_runner: 2\n  num_runners: 4\n", "'num_runners'",
     "line 6 and line 8"),
])
def test_a_key_given_twice_is_refused_naming_it_and_its_lines(tmp_path: Path, text: str, key: str, lines: str) -> None:
    path = write(tmp_path, text)
    assert refused(load_spec, path) == (
        f"{path}: key {key} is given twice in one mapping ({lines}); YAML would keep only the last, so give it once."
    )


def test_sweeps_suites_and_pipelines_share_the_reader(tmp_path: Path) -> None:
    for kind, path in tune_files(tmp_path).items():
        text = path.read_text()
        path.write_text(text + text.splitlines()[0] + "\n")  # its name, twice
        assert f"{path}: key 'name' is given twice" in refused(LOADERS[kind], path)
        path.write_text(text)
    for kind, path in tune_files(tmp_path).items():
        (tmp_path / "base.yaml").write_text(alias_bomb())  # the experiment spec each of them reads
        assert f"{tmp_path / 'base.yaml'}: holds more than 100,000 values" in refused(LOADERS[kind], path), kind
    assert read_yaml(write(tmp_path, MINIMAL))["name"] == "t"


@pytest.mark.parametrize("case", ["bomb", "latin1", "folder", "duplicate", "deep"])
def test_the_cli_prints_one_paragraph_for_a_hostile_file(tmp_path: Path, case: str) -> None:
    path = {
        "bomb": lambda: write(tmp_path, alias_bomb()),
        "latin1": lambda: write(tmp_path, "name: caf\xe9\n".encode("latin-1")),
        "folder": lambda: tmp_path,
        "duplicate": lambda: write(tmp_path, MINIMAL + "name: u\n"),
        "deep": lambda: write(tmp_path, MINIMAL.replace("{id: Pendulum-v1}", "{id: Pendulum-v1, kwargs: {x: "
                                                        + "[" * 50000 + "]" * 50000 + "}}")),
    }[case]()
    result = cli("validate", str(path), cwd=tmp_path)
    assert result.returncode == 2
    assert result.stdout == "" and "Traceback" not in result.stderr and len(result.stderr) < MESSAGE_LIMIT
    assert result.stderr.startswith("aa-ray: error: ") and str(path) in result.stderr, result.stderr
