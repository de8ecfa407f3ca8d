"""Every test runs in its own temporary folder with its own MLflow store (SQLite, as a user's)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import ray
import torch

# Two pytest workers share two cores: one torch thread each, the actors' own default
# (`learners.torch_threads`, `runners.torch_threads`), so in-process learners run as in their actors.
torch.set_num_threads(1)

# MuJoCo picks its GL backend at import; EGL renders offscreen without a display.
os.environ.setdefault("MUJOCO_GL", "egl")
# Ray starts its workers (aa-ray's actors, Tune's trials) at nice 15, below everything else. Beside
# the other pytest worker's in-process training (nice 0) on 2 cores they got almost no CPU: the async
# killed-runner test took 128 s there against 72 s with its workers at nice 0. Every Ray the tests
# start, in this process or in a command's, inherits this.
os.environ.setdefault("RAY_worker_niceness", "0")
# What aa_ray.runtime.cluster.connect asks of an embedded Ray, for the Rays the tests start themselves
# (fixtures, `ray start` clusters): no idle worker per CPU started ahead of the actors.
os.environ.setdefault("RAY_prestart_worker_first_driver", "0")
# The MLflow servers the tests start (`mlflow server`, `mlflow ui`) would each also start MLflow 3's
# job runner: a runner and three Huey consumers, about 20 CPU-s per server on 2 cores, for jobs no
# test submits (benchmarks/RESULTS.md section 32).
os.environ.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")


# Each of the two workers takes whole files from one queue, in this order (pyproject's addopts turn
# off xdist's own, by tests per file, which put the files of one or two long learning runs last): a
# long file started last keeps one core busy while the other has nothing left. The long ones go first,
# the in-process learning runs mostly between files whose work is in processes of their own; then the
# files over 20 s that were left off until one of them started last (benchmarks/RESULTS.md section 36),
# longest first; the many short files after them even out the end.
LONG_FILES_FIRST = [
    "test_benchmarks_run.py", "test_scale_out.py", "test_learning_rlpd.py", "test_tune.py", "test_learning.py",
    "test_suite.py", "test_learning_crossq_droq.py", "test_run_and_tracking.py", "test_cluster.py",
    "test_plugins.py", "test_suite_pipeline_resume.py", "test_api.py", "test_learning_fast_recipes.py",
    "test_learning_td3.py", "test_learning_ppo.py", "test_learning_sac_dist.py", "test_sweep_resume.py",
    "test_observability.py", "test_reliability.py", "test_node_loss.py", "test_user_envs.py", "test_datasets.py",
    "test_tracking_outage.py", "test_resume_edges.py", "test_playground.py", "test_mlflow_ui.py",
    "test_replay_shards.py", "test_gpu_check.py", "test_scale_harness.py", "test_disks.py", "test_trackers.py",
    "test_bad_data.py", "test_inline_backend.py", "test_old_checkpoints.py",
]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONG_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file's tests keep their order


@pytest.fixture(scope="session")
def migrated_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty MLflow SQLite store with MLflow's schema migrations applied, made once per worker in a
    process of its own. A new store runs them all on first open: about 1 CPU-s in each test's
    process or command that tracked; a user's store pays that once, at its first run."""
    store = tmp_path_factory.mktemp("template") / "mlflow.db"
    subprocess.run([sys.executable, "-c", "import sys; from mlflow.tracking import MlflowClient; "
                    "MlflowClient(sys.argv[1]).search_experiments()", f"sqlite:///{store}"],
                   check=True, capture_output=True, timeout=300)
    return store


@pytest.fixture(autouse=True)
def isolated_workdir(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test's own folder and MLflow store: a copy of `migrated_store`, or none yet for tests
    marked `fresh_store` (those that check that no store is made). Runs whose store is elsewhere,
    such as the README command's in tests/test_run_and_tracking.py, still create theirs from nothing."""
    monkeypatch.chdir(tmp_path)
    if request.node.get_closest_marker("fresh_store") is None:
        shutil.copyfile(request.getfixturevalue("migrated_store"), tmp_path / "mlflow.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return tmp_path


@pytest.fixture(scope="module")
def one_ray():
    """One Ray for a file's runs that kill nothing, joined as a cluster would be, instead of each run
    starting and stopping its own (about 5 s of start-up each on 2 cores). Runs that kill an actor or
    ship their own py_modules start their own."""
    ray.init(address="local", num_cpus=4, include_dashboard=False)  # never a cluster another test started
    yield
    ray.shutdown()


# Ray's driver-side daemon threads (log and error listeners, gRPC) can outlive `ray.shutdown()` and
# crash the interpreter's own teardown after every result has been reported: CI once printed
# "144 passed" and then died of a segfault. The results are final by then, so leave with pytest's
# exit status and skip that teardown.
_exit_status: list[int] = []


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _exit_status.append(int(exitstatus))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    if _exit_status:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_exit_status[-1])
