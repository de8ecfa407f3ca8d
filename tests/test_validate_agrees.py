"""`aa-ray validate` refuses what `aa-ray run` would fail on (issue 34, item 4): each spec below used to
validate and then fail, hang or lose data once it ran. Now the spec is refused before anything starts,
by `validate` and `run` alike (both read it through `load_spec`), in one paragraph naming the field.
Validation only: nothing here trains."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from aa_ray.cli import main
from aa_ray.errors import SpecError
from aa_ray.spec.loader import load_spec, validate_spec

USER_ENVS = Path(__file__).resolve().parent / "user_envs"
AA_RAY = str(Path(sys.executable).parent / "aa-ray")  # the installed command, as a user runs it
MINIMAL = """\
name: t
env: {id: Pendulum-v1}
algo: {name: sac, warm_up_steps: 100}
budget: {env_steps: 1000}
tracking: {enabled: false}
"""
MESSAGE_LIMIT = 4000  # one paragraph a person reads


def write(folder: Path, text: str, name: str = "spec.yaml") -> Path:
    path = folder / name
    path.write_text(text)
    return path


def assert_one_paragraph(message: str, field: str) -> None:
    assert field in message, message
    assert "Traceback" not in message and "\n\n" not in message and len(message) < MESSAGE_LIMIT, message


# ---- experiment specs, through the loader `run` and `validate` share ----------------------------------

# (case, --set overrides, the field the message names, what it says)
SPEC_CASES = [
    ("wrong-length mirror", [f"env.py_modules=[{USER_ENVS / 'myenvs'}]", "env.mirror=myenvs.point:MIRROR",
                             "algo.sym_aug=true"], "algo.sym_aug", "is for 4 observation and 2 action features"),
    ("stop_at on a missing metric", ["budget.stop_at={metric: eval/distance, below: 0.01}"],
     "budget.stop_at.metric", "never produce eval/distance"),
    ("plugin beside a built-in name", ["algo.plugin=myalgos.fixed_alpha_sac"], "algo.plugin", "aa-ray's own"),
    ("empty actor_obs", ["algo.actor_obs=[]"], "algo.actor_obs", "no observation at all"),
    ("missing py_modules folder", ["env.py_modules=[no/such/package]"], "env.py_modules.0", "does not exist"),
    ("py_modules at the root", ["env.py_modules=[/]"], "env.py_modules.0", "a file system root"),
    ("py_modules at home", ["env.py_modules=['~']"], "env.py_modules.0", "your home folder"),
    ("py_modules too large", ["env.py_modules=[/usr]"], "env.py_modules.0", "Ray would zip and upload"),
    ("nan in env.kwargs", ["env.kwargs={g: .nan}"], "env.kwargs", "kwargs['g'] is nan"),
    ("inf deep in env.kwargs", ["env.kwargs={g: [1, {x: -.inf}]}"], "env.kwargs", "kwargs['g'][1]['x'] is -inf"),
    ("NUL in output_dir", ['runtime.output_dir="runs\\0x"'], "runtime.output_dir", "NUL byte"),
    ("~user that names nobody", ["runtime.output_dir=~no_such_user_here/runs"], "runtime.output_dir",
     "names no home folder"),
    ("NUL in prior_data", ['algo.prior_data="data\\0x"'], "algo.prior_data", "NUL byte"),
    ("seed past 2^63 - 1", [f"seed={2**63}"], "seed", "0 to 2^63 - 1"),
    ("flush_every_s of 1e10", ["tracking.flush_every_s=1e10"], "tracking.flush_every_s", "at most 3600 seconds"),
    ("stop_grace_s of 1e10", ["runtime.stop_grace_s=1e10"], "runtime.stop_grace_s", "at most 3600 seconds"),
]


@pytest.mark.parametrize(("overrides", "field", "says"), [case[1:] for case in SPEC_CASES],
                         ids=[case[0] for case in SPEC_CASES])
def test_a_spec_run_would_fail_on_is_refused_naming_the_field(
    tmp_path: Path, overrides: list[str], field: str, says: str
) -> None:
    with pytest.raises(SpecError) as err:
        load_spec(write(tmp_path, MINIMAL), overrides)
    message = str(err.value)
    assert_one_paragraph(message, f"\n  {field}: ")
    assert says in message, message


def test_bounds_leave_the_largest_good_values(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, MINIMAL), [f"seed={2**63 - 1}", "tracking.flush_every_s=3600",
                                                "runtime.stop_grace_s=3600", "env.kwargs={g: 9.81}"])
    assert spec.seed == 2**63 - 1 and spec.tracking.flush_every_s == spec.runtime.stop_grace_s == 3600


def test_a_leading_tilde_is_the_home_folder(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, MINIMAL), ["runtime.output_dir=~/runs"])
    assert spec.runtime.output_dir == str(Path.home() / "runs")  # never a folder named '~' in the current one
    raw = {**yaml.safe_load(MINIMAL), "runtime": {"output_dir": "./~"}}
    assert validate_spec(raw).runtime.output_dir == "./~"  # ... unless it is written as one


# ---- through the command line: validate and run refuse alike, exit code 2 -----------------------------

def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([AA_RAY, *args], capture_output=True, text=True, cwd=cwd, timeout=300)


@pytest.mark.parametrize(("command", "overrides", "field"), [
    ("validate", ["budget.stop_at={metric: eval/distance, below: 0.01}"], "budget.stop_at.metric"),
    ("validate", ["tracking.flush_every_s=1e10"], "tracking.flush_every_s"),
    ("run", [f"env.py_modules=[{USER_ENVS / 'myenvs'}]", "env.mirror=myenvs.point:MIRROR", "algo.sym_aug=true"],
     "algo.sym_aug"),
    ("run", ["env.kwargs={g: .inf}"], "env.kwargs"),
])
@pytest.mark.fresh_store  # it checks what its folder holds
def test_the_cli_refuses_before_starting_anything(tmp_path: Path, command: str, overrides: list[str],
                                                  field: str) -> None:
    spec = write(tmp_path, MINIMAL)
    result = cli(command, str(spec), *(arg for value in overrides for arg in ("--set", value)), cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("aa-ray: error: Invalid spec") and not result.stdout, result.stderr
    assert_one_paragraph(result.stderr, f"\n  {field}: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.yaml"]  # no run folder, nothing started


# ---- sweeps, suites and pipelines: `aa-ray validate` of the file -----------------------------------------

def tune_file(folder: Path, name: str, text: str) -> str:
    write(folder, MINIMAL, "base.yaml")
    return str(write(folder, text, name))


TUNE_CASES = [
    ("stop_at in a sweep's base", "sweep.yaml",
     "name: w\nbase: base.yaml\nset: {budget.stop_at: {metric: eval/distance, below: 0.01}}\n"
     "search_space: {algo.actor_lr: {grid: [0.001, 0.0003]}}\n", "budget.stop_at.metric"),
    ("nan in a sweep's search space", "sweep.yaml",
     "name: w\nbase: base.yaml\nsearch_space: {env.kwargs.g: {grid: [9.81, .nan]}}\n", "env.kwargs"),
    ("a grid of a million trials", "sweep.yaml",
     "name: w\nbase: base.yaml\nsearch_space:\n"
     + "".join(f"  algo.k{i}: {{grid: [{', '.join(str(v) for v in range(10))}]}}\n" for i in range(6)),
     "\n  search_space: the grids cross to 1,000,000 trials"),
    ("NUL in a sweep's storage", "sweep.yaml",
     'name: w\nbase: base.yaml\nstorage: "tune\\0x"\nsearch_space: {algo.actor_lr: {grid: [0.001]}}\n',
     "storage: contains a NUL byte"),
    ("an optuna sweep's seed past 2^32 - 1", "sweep.yaml",
     f"name: w\nbase: base.yaml\nsearcher: optuna\nset: {{seed: {2**32}}}\n"
     "search_space: {algo.actor_lr: {choice: [0.001]}}\n", "Optuna takes seeds of 0 to 2^32 - 1"),
    ("inf in a suite's per-env overrides", "suite.yaml",
     "name: s\nspecs: {sac: base.yaml}\nenvs: {Pendulum-v1: {env.kwargs.g: .inf}}\nseeds: [0]\nenv_steps: 1000\n",
     "env.kwargs"),
    ("two suite env ids, one cell", "suite.yaml",
     "name: s\nspecs: {sac: base.yaml}\nenvs: {'aa_ray/PusherReach-v0': {}, 'aa_ray_PusherReach-v0': {}}\n"
     "seeds: [0]\nenv_steps: 1000\n", "make the same cell folder 'sac-aa_ray_PusherReach-v0-s0'"),
    ("a suite seed past 2^63 - 1", "suite.yaml",
     f"name: s\nspecs: {{sac: base.yaml}}\nenvs: {{Pendulum-v1: {{}}}}\nseeds: [{2**63}]\nenv_steps: 1000\n",
     "seeds.0: must be 0 to 2^63 - 1"),
    ("a scripted rollout without a controller", "pipeline.yaml",
     "name: p\nstages:\n  data: {kind: rollout, scripted: true, spec: base.yaml, episodes: 2}\n",
     "and env 'Pendulum-v1' has no scripted controller"),
]


@pytest.mark.parametrize(("name", "text", "says"), [case[1:] for case in TUNE_CASES], ids=[c[0] for c in TUNE_CASES])
def test_a_sweep_suite_or_pipeline_run_would_fail_on_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, text: str, says: str
) -> None:
    started = time.monotonic()
    assert main(["validate", tune_file(tmp_path, name, text)]) == 2
    captured = capsys.readouterr()
    assert not captured.out, captured.out
    assert_one_paragraph(captured.err, says)
    assert time.monotonic() - started < 30  # a grid is counted, never expanded


def test_the_grid_bound_is_counted_with_num_samples(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = "name: w\nbase: base.yaml\nnum_samples: 101\nsearch_space: {algo.actor_lr: {grid: [" + \
        ", ".join(f"0.00{i + 1}" for i in range(100)) + "]}}\n"
    assert main(["validate", tune_file(tmp_path, "sweep.yaml", text)]) == 2
    assert "10,100 trials (num_samples 101 x 100 (algo.actor_lr))" in capsys.readouterr().err
