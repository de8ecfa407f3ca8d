"""Every test runs in its own temporary folder with its own MLflow store (SQLite, as a user's)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# MuJoCo picks its GL backend at import; EGL renders offscreen without a display.
os.environ.setdefault("MUJOCO_GL", "egl")


@pytest.fixture(autouse=True)
def isolated_workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return tmp_path
