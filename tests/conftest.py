"""Every test runs in its own temporary folder with its own MLflow store (SQLite, as a user's)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

# Two pytest workers share two cores: one torch thread each, the actors' own default
# (`learners.torch_threads`, `runners.torch_threads`), so in-process learners run as in their actors.
torch.set_num_threads(1)

# MuJoCo picks its GL backend at import; EGL renders offscreen without a display.
os.environ.setdefault("MUJOCO_GL", "egl")


@pytest.fixture(autouse=True)
def isolated_workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return tmp_path


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
