"""A researcher's own algorithm, as they would bring it: the package `tests/user_envs/myalgos` lives
outside aa_ray and defines `fixed_alpha_sac` (`ALGORITHM = Registered(...)`); the spec names it with
`algo.plugin` and ships its folder with `env.py_modules`. Nothing in aa_ray is edited or told about
it. It trains through `aa-ray run` inline, resumes from that checkpoint on Ray with two runners,
and runs as the trials of a sweep; each mistake in naming it is one paragraph.

Every command runs in a process of its own from the console script, in a folder holding only the
user's packages and specs (as `tests/test_user_envs.py` does for an env)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from aa_ray.errors import SpecError
from aa_ray.spec.loader import load_spec

ROOT = Path(__file__).resolve().parents[1]
USER = ROOT / "tests" / "user_envs"
AA_RAY = str(Path(sys.executable).parent / "aa-ray")


def aa_ray(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([AA_RAY, *args], cwd=cwd, capture_output=True, text=True, timeout=600)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    for package in ("myenvs", "myalgos"):
        shutil.copytree(USER / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    spec = (USER / "point_reach_own_algo.yaml").read_text().replace("tests/user_envs/", "")
    (tmp_path / "spec.yaml").write_text(spec)
    return tmp_path


def runs(project: Path, experiment: str = "aa-ray") -> list:
    client = MlflowClient(f"sqlite:///{project / 'mlflow.db'}")
    return client.search_runs([client.get_experiment_by_name(experiment).experiment_id])


def test_own_algorithm_trains_inline_resumes_on_ray_and_sweeps(project: Path) -> None:
    """Inline to 1,500 env steps, then resumed on Ray (two runners import the plugin from the shipped
    folder) to 3,000: the point mass reaches its target (a random policy's return is about -40;
    -5.7 measured at 3,000 steps)."""
    first = aa_ray("run", "spec.yaml", "--set", "runtime.backend=inline", "--set", "budget.env_steps=1500",
                   "--set", "eval.every_env_steps=1500", "--plain", cwd=project)
    assert first.returncode == 0, (first.stdout + first.stderr)[-4000:]
    (checkpoint,) = project.glob("runs/point_reach_own_algo-*/checkpoints/final")
    resumed = aa_ray("run", "spec.yaml", "--resume", str(checkpoint), "--set", "budget.env_steps=3000",
                     "--set", "eval.every_env_steps=1500", "--set", "runners.num_runners=2", "--plain", cwd=project)
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-4000:]
    (run,) = runs(project)
    params = run.data.params
    assert (params["algo.name"], params["algo.plugin"]) == ("fixed_alpha_sac", "myalgos.fixed_alpha_sac")
    assert run.data.metrics["env/steps"] >= 3000 and run.data.metrics["eval/return"] > -25.0, run.data.metrics

    (project / "sweep.yaml").write_text(yaml.safe_dump({
        "name": "own_algo", "base": "spec.yaml", "metric": "eval/return", "mode": "max",
        # each trial's actors in its own process (a Ray worker, which imports the plugin from
        # env.py_modules as the resumed run's runners did), three fewer processes per trial to start
        # no MLflow Model of the final policy: none is read here (benchmarks/RESULTS.md section 35)
        "set": {"budget.env_steps": 1000, "eval.every_env_steps": 1000, "algo.warm_up_steps": 300,
                "runtime.backend": "inline", "tracking.log_model": False},
        "search_space": {"algo.alpha": {"grid": [0.02, 0.05]}}, "max_concurrent_trials": 2,
    }))
    sweep = aa_ray("sweep", "sweep.yaml", cwd=project)
    assert sweep.returncode == 0, (sweep.stdout + sweep.stderr)[-4000:]
    trials = [r for r in runs(project) if "mlflow.parentRunId" in r.data.tags]  # the sweep's trials
    assert sorted(float(r.data.params["algo.alpha"]) for r in trials) == [0.02, 0.05]
    assert all(r.info.status == "FINISHED" and r.data.metrics["env/steps"] >= 1000 for r in trials)


@pytest.mark.parametrize(("algo", "expected"), [
    ({"name": "nope"}, "algo.name: unknown algorithm 'nope' (aa-ray's own: sac,"),
    ({"name": "fixed_alpha_sac", "plugin": "myalgos.missing"}, "algo.plugin: cannot import 'myalgos.missing'"),
    ({"name": "fixed_alpha_sac", "plugin": "myalgos"}, "algo.plugin: module myalgos defines no ALGORITHM"),
    ({"name": "other", "plugin": "myalgos.fixed_alpha_sac"}, "defines the algorithm 'fixed_alpha_sac'; set algo.name"),
    ({"name": "fixed_alpha_sac", "plugin": "myalgos.fixed_alpha_sac", "alpha": -1}, "algo.alpha: Input should be"),
    ({"name": "fixed_alpha_sac", "plugin": "myalgos.fixed_alpha_sac", "tau2": 1}, "algo.tau2: unknown key"),
])
def test_each_mistake_naming_a_plugin_is_one_paragraph(project: Path, monkeypatch: pytest.MonkeyPatch,
                                                      algo: dict, expected: str) -> None:
    monkeypatch.chdir(project)
    monkeypatch.setattr(sys, "path", list(sys.path))  # env.py_modules puts the user's folder on it
    raw = yaml.safe_load((project / "spec.yaml").read_text())
    (project / "bad.yaml").write_text(yaml.safe_dump({**raw, "algo": {**raw["algo"], **algo} if "plugin" in algo
                                                      else algo}))
    with pytest.raises(SpecError) as caught:
        load_spec(project / "bad.yaml")
    assert expected in str(caught.value), str(caught.value)
    assert "Traceback" not in str(caught.value)
