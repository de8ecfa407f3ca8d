"""A researcher's own env, as they would bring it: the package `tests/user_envs/myenvs` lives outside
aa_ray, is importable only by path, and registers `myenvs/PointReach-v0` when imported. It trains
through `aa-ray run` inline, and through the Python API with a creator function on Ray and inline;
each mistake a user makes with it is one paragraph naming what to fix, before Ray starts, with
nothing written. (`tests/test_cluster.py` trains it with two runners on Ray, as a `ray job submit`
job on a two-node cluster, to the same return as the inline run here.)

Every command runs in a process of its own, from the console script (whose import path does not
hold the current folder): importing the package into the test process would hide the mistakes."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tests" / "user_envs" / "myenvs"
SPEC = ROOT / "tests" / "user_envs" / "point_reach.yaml"
AA_RAY = str(Path(sys.executable).parent / "aa-ray")
SHORT = ["--set", "budget.env_steps=3000", "--set", "eval.every_env_steps=1500", "--plain"]


def aa_ray(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([AA_RAY, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A user's folder: their env package and the spec that names it (env.py_modules: [myenvs])."""
    shutil.copytree(PACKAGE, tmp_path / "myenvs", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "spec.yaml").write_text(SPEC.read_text().replace("tests/user_envs/myenvs", "myenvs"))
    return tmp_path


def finished_run(project: Path) -> dict[str, float]:
    client = MlflowClient(f"sqlite:///{project / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("aa-ray").experiment_id])
    assert run.info.status == "FINISHED"
    return run.data.metrics


def test_own_env_package_trains_through_aa_ray_run_with_its_declared_mirror(project: Path) -> None:
    """Inline, two runners, with symmetry augmentation by the mirror the env class declares: a run that
    imports the package, trains and learns as the plain one would. The point mass learns to move towards
    its target: a random policy's 40-step return is about -40, the trained one's better than -25 after
    3,000 env steps (-12 to -19 measured). (On Ray, shipped to the runners as Ray's runtime_env
    py_modules: tests/test_cluster.py's two-node job, with the same threshold.)"""
    result = aa_ray("run", "spec.yaml", *SHORT, "--set", "algo.sym_aug=true", "--set", "runtime.backend=inline",
                    "--set", "runners.num_runners=2", cwd=project)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    metrics = finished_run(project)
    assert metrics["env/steps"] >= 3000
    assert metrics["eval/return"] > -25.0, metrics


CREATOR_SCRIPT = """
import sys

import numpy as np

from aa_ray.api import Experiment, load_policy


def make_env(speed=0.1):  # defined in the script: reaches Ray's workers pickled by value
    from myenvs.point import PointReachEnv

    return PointReachEnv(speed=speed)


spec = {
    "name": "creator", "env": {"py_modules": ["myenvs"], "max_episode_steps": 40, "kwargs": {"speed": 0.2}},
    "algo": {"name": "sac", "warm_up_steps": 300, "batch_size": 64, "buffer_size": 5000, "train_every": 20,
             "actor_hidden_dims": [32, 32], "critic_hidden_dims": [32, 32]},
    "budget": {"env_steps": 800}, "eval": {"every_env_steps": 400, "episodes": 2},
    "runners": {"num_runners": 2}, "runtime": {"backend": sys.argv[1]},
}
result = Experiment(spec, env_creator=make_env).fit(track=False, progress="plain")
policy = load_policy(result.checkpoint, trust_code=True)  # imports __main__:make_env, this script's
assert policy.spec.env.id == "__main__:make_env", policy.spec.env.id
assert policy.evaluate(episodes=2) == {k: v for k, v in result.metrics.items() if k != "eval/at_env_steps"}
print("ACTION", policy.predict(np.zeros(4)).tolist())
print("CHECKPOINT", result.checkpoint)
"""


def test_api_trains_with_an_env_creator_on_ray_and_inline_alike(project: Path) -> None:
    """A creator function from the user's script: the same numbers on Ray (two runner processes)
    and inline, and its checkpoint evaluates in the same script. Another process, without the
    function, is told to pass it again."""
    (project / "train.py").write_text(CREATOR_SCRIPT)
    outputs = {}
    for backend in ("ray", "inline"):
        done = subprocess.run([sys.executable, "train.py", backend], cwd=project, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
        outputs[backend] = [line for line in done.stdout.splitlines() if line.startswith(("ACTION", "CHECKPOINT"))]
    assert outputs["ray"][0] == outputs["inline"][0]  # the same policy, to the last digit
    checkpoint = outputs["ray"][1].removeprefix("CHECKPOINT ")
    refused = aa_ray("eval", checkpoint, "--episodes", "1", cwd=project)  # a file that names code: no opt-in
    assert refused.returncode == 2 and "--trust-code" in refused.stderr and "__main__:make_env" in refused.stderr
    elsewhere = aa_ray("eval", checkpoint, "--episodes", "1", "--trust-code", cwd=project)
    assert elsewhere.returncode != 0 and "Traceback" not in elsewhere.stderr
    assert "env_creator" in elsewhere.stderr and "__main__" in elsewhere.stderr, elsewhere.stderr


def test_env_known_only_to_the_driver_fails_once_with_the_workers_own_error(project: Path) -> None:
    """The issue's case: `import myenvs` in the script, nothing in the spec. The runners cannot make
    the env in their processes: the run stops at once (no restart) with the runner's own error."""
    (project / "driver_only.py").write_text(textwrap.dedent("""
        import sys
        sys.path.insert(0, ".")
        import myenvs  # noqa: F401  (this process knows the id; Ray's workers do not)
        from aa_ray.api import Experiment
        from aa_ray.runtime.remote import ActorStartFailed
        spec = {"name": "driver_only", "env": {"id": "myenvs/PointReach-v0"}, "budget": {"env_steps": 1000},
                "algo": {"name": "sac", "warm_up_steps": 200}, "runners": {"num_runners": 2},
                "runtime": {"max_runner_restarts": 3}}
        try:
            Experiment(spec).fit(track=False, progress="plain")
        except ActorStartFailed as err:
            print("FAILED:", err)
    """))
    done = subprocess.run([sys.executable, "driver_only.py"], cwd=project, capture_output=True, text=True, timeout=300)
    failure = next((line for line in done.stdout.splitlines() if line.startswith("FAILED:")), None)
    assert failure is not None, (done.stdout + done.stderr)[-4000:]
    assert "EnvRunner (pid" in failure and "could not start" in failure
    assert "unknown gymnasium env id 'myenvs/PointReach-v0'" in failure and "env.imports" in failure
    assert "restart" not in failure  # not retried: the replacement would fail the same way


@pytest.mark.parametrize("overrides, expected", [
    ([], "env.id: unknown gymnasium env id 'myenvs/PointReach-v0'"),
    (["env.imports=[myenvs.broken]"], "env.imports: importing 'myenvs.broken'"),
    (["env.id=myenvs/PointReach-v9"], "after importing myenvs it is still not registered"),
    (["env.id=nowhere:myenvs/PointReach-v0", "env.imports=[]"], "No module named 'nowhere'"),
    (["env.entry_point=myenvs.point:NotAnEnv"], "is a class but not a gymnasium Env"),
    (["env.entry_point=myenvs.point:missing"], "module 'myenvs.point' has no attribute 'missing'"),
    (["env.entry_point=myenvs.point:PointReachEnv", "env.kwargs={speed: -1}"], "speed must be positive"),
    (["algo.sym_aug=true", "env.mirror=myenvs.point:NOT_AN_INVOLUTION"], "it is not an involution"),
    (["env.mirror=myenvs.point:SUCCESS_RADIUS"], "is not a mirror"),
    (["algo.sym_aug=true", "env.id=Pendulum-v1"], "name yours by import path in env.mirror"),
])
@pytest.mark.fresh_store  # it checks that no MLflow store is made
def test_each_mistake_is_one_paragraph_before_ray_starts(project: Path, overrides: list[str], expected: str) -> None:
    spec = project / "spec.yaml"
    if not overrides:  # the package is not named anywhere: nothing imports it
        spec.write_text(spec.read_text().replace("imports: [myenvs]", "imports: []").replace("py_modules: [myenvs]",
                                                                                             "py_modules: []"))
    sets = [arg for override in overrides for arg in ("--set", override)]
    result = aa_ray("run", "spec.yaml", *sets, cwd=project, timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert expected in result.stderr and "Traceback" not in result.stderr, result.stderr
    if "broken" in expected:  # the module's own error, as it raised it
        assert "RuntimeError: this env module is half-written" in result.stderr
    assert not (project / "runs").exists() and not (project / "mlflow.db").exists()
    assert "Started a local Ray" not in result.stdout + result.stderr


def test_a_mirror_comes_from_env_mirror_or_from_the_env_class(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from aa_ray.envs.symmetry import find_mirror
    from aa_ray.spec.loader import load_spec

    monkeypatch.syspath_prepend(str(project))
    declared = find_mirror(load_spec(project / "spec.yaml").env)  # PointReachEnv.metadata["mirror"]
    assert (declared.obs_sign, declared.act_sign) == ((-1.0, 1.0, -1.0, 1.0), (-1.0, 1.0))
    named = find_mirror(load_spec(project / "spec.yaml", ["env.mirror=myenvs.point:MIRROR"]).env)
    assert named == declared
    obs = np.random.default_rng(0).normal(size=(5, 4))
    np.testing.assert_array_equal(named.obs(named.obs(obs)), obs)


def test_module_colon_id_and_entry_point_validate(project: Path) -> None:
    """gymnasium's `module:EnvId` form needs no env.imports; an entry point needs no registration,
    and the env's id defaults to it."""
    spec = project / "spec.yaml"
    spec.write_text(spec.read_text().replace("imports: [myenvs]", "imports: []"))
    colon = aa_ray("validate", "spec.yaml", "--set", "env.id=myenvs:myenvs/PointReach-v0", cwd=project, timeout=120)
    assert colon.returncode == 0, colon.stderr
    assert "obs_dim 4, act_dim 2" in colon.stdout
    spec.write_text(spec.read_text().replace("id: myenvs/PointReach-v0", "entry_point: myenvs.point:make_point_reach"))
    entry = aa_ray("validate", "spec.yaml", cwd=project, timeout=120)
    assert entry.returncode == 0, entry.stderr
    assert "id: myenvs.point:make_point_reach" in entry.stdout and "obs_dim 4, act_dim 2" in entry.stdout
