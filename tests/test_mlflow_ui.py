"""MLflow, against real stores: a store that cannot be used is one paragraph naming its URI; a
reused pipeline result copies every metric; and the MLflow UI, served locally on 127.0.0.1, shows
a finished run's metrics: headless Chromium (Debian's, installed by `.ci/run`) loads the run page,
the test finds the metric names in the rendered page, and the screenshot is kept as a CI artifact
(ci-artifacts/mlflow_run_page.png)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from aa_ray.spec.loader import SpecError, load_spec
from aa_ray.tracking.mlflow_tracker import MlflowTracker, RunContext, TrackingError, log_in_batches, start_run
from aa_ray.tune.parent import ParentRun

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "ci-artifacts"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
METRICS = {"eval/return": -7.5, "eval/distance": 0.042, "critic/q_loss": 0.013, "actor/alpha": 0.21}


def read_only_store(tmp_path: Path) -> str:
    """A real SQLite store this process may read but not write (root ignores file modes, SQLite's
    read-only mode does not)."""
    path = tmp_path / "read_only.db"
    MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()  # creates the tables
    return f"sqlite:///file:{path}?mode=ro&uri=true"


@pytest.mark.parametrize("store", ["unsupported scheme", "read-only"])
def test_a_store_that_cannot_be_used_is_one_paragraph_naming_the_uri(tmp_path: Path, store: str) -> None:
    uri = "nosuchscheme://store" if store == "unsupported scheme" else read_only_store(tmp_path)
    spec = load_spec(ROOT / "specs" / "sac.yaml")
    with pytest.raises(TrackingError) as caught:
        MlflowTracker(spec, context=RunContext(tracking_uri=uri))
    message = str(caught.value)
    assert f"MLflow tracking URI {uri!r}" in message and "MLFLOW_TRACKING_URI" in message and "--no-track" in message
    assert "\n" not in message and "AttributeError" not in message
    assert isinstance(caught.value, SpecError)  # what the commands print as one paragraph
    assert caught.value.__cause__ is not None  # the store's own error, for a developer


def test_a_sweep_parent_on_an_unusable_store_is_one_paragraph(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "nosuchscheme://store")
    with pytest.raises(TrackingError, match="MLflow tracking URI 'nosuchscheme://store'"):
        ParentRun("aa-ray", "sweep", "s", "s-run")


def test_a_reused_result_copies_every_metric_not_the_first_1000() -> None:
    parent = ParentRun("aa-ray", "pipeline", "p", "p-run")
    source = start_run(parent.client, "aa-ray", {})
    values = {f"stage/metric_{i:04d}": float(i) for i in range(1234)}
    log_in_batches(parent.client, source, metrics=[Metric(k, v, 0, 0) for k, v in values.items()])
    copy = parent.copy_child(source, "reused", {"aa_ray.stage": "train"})
    assert parent.client.get_run(copy).data.metrics == values


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def mlflow_ui(tmp_path: Path):
    """`mlflow ui` on loopback over the test's SQLite store, with one finished run in it."""
    spec = load_spec(ROOT / "specs" / "sac.yaml")
    tracker = MlflowTracker(spec)
    for step in (1000, 2000):
        tracker.log_metrics({key: value * step / 2000 for key, value in METRICS.items()}, step)
    tracker.finish("FINISHED")
    experiment_id = tracker.client.get_run(tracker.run_id).info.experiment_id
    port = free_port()
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "mlflow"), "ui", "--backend-store-uri", os.environ["MLFLOW_TRACKING_URI"],
         "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError("mlflow ui did not come up") from None
                time.sleep(0.5)
        yield f"http://127.0.0.1:{port}/#/experiments/{experiment_id}/runs/{tracker.run_id}"
    finally:
        server.terminate()
        server.wait(timeout=30)


def chromium(*args: str) -> subprocess.CompletedProcess:
    profile = tempfile.mkdtemp(prefix="chromium_")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", "--window-size=1400,1000", "--virtual-time-budget=20000"]
    try:
        return subprocess.run([CHROMIUM, *flags, *args], capture_output=True, text=True, timeout=180)
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def test_mlflow_ui_shows_the_runs_metrics(mlflow_ui: str) -> None:
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("CI must have Debian's chromium (.ci/run installs it)")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    page = chromium("--dump-dom", mlflow_ui)
    assert page.returncode == 0, page.stderr[-2000:]
    missing = [name for name in METRICS if name not in page.stdout]
    assert not missing, f"the run page does not show {missing}"
    ARTIFACTS.mkdir(exist_ok=True)
    screenshot = ARTIFACTS / "mlflow_run_page.png"
    shot = chromium(f"--screenshot={screenshot}", mlflow_ui)
    assert shot.returncode == 0 and screenshot.stat().st_size > 10_000, shot.stderr[-2000:]
