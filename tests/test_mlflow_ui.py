"""MLflow, against real stores: a store that cannot be used is one paragraph naming its URI; a
reused pipeline result copies every metric; and the MLflow UI, served locally on 127.0.0.1, shows
a finished run's metrics: headless Chromium (Debian's, installed by `.ci/run`) loads the run page,
the test finds the metric names in the rendered page, and the screenshot is kept as a CI artifact
(ci-artifacts/mlflow_run_page.png)."""

from __future__ import annotations

import contextlib
import html
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from aa_ray.errors import UserError
from aa_ray.spec.loader import load_spec
from aa_ray.tracking.mlflow_tracker import (
    EXPERIMENT_KIND_TAG,
    MODEL_TRAINING,
    MlflowTracker,
    RunContext,
    TrackingError,
    compare_link,
    experiment_link,
    log_in_batches,
    start_run,
)
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
    assert isinstance(caught.value, UserError)  # what the commands print as one paragraph
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


@contextlib.contextmanager
def serving_ui(folder: Path, store_uri: str) -> Iterator[str]:
    """`mlflow ui` on loopback over a SQLite store; yields its base URL."""
    port = free_port()
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "mlflow"), "ui", "--backend-store-uri", store_uri,
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],  # one browser: one worker
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=folder,
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
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=30)


def served(link: str, base: str) -> str:
    """A link aa-ray prints (for `mlflow ui`'s default address) on this test's server."""
    return link.replace("http://127.0.0.1:5000", base)


@pytest.fixture(scope="module")
def ui_server(tmp_path_factory: pytest.TempPathFactory, migrated_store: Path) -> Iterator[tuple[str, str]]:
    """One `mlflow ui` for the file's UI checks (a start costs seconds of CPU on 2 cores), over a
    store of its own: (its URI, the UI's base URL). Each check records into an experiment no other
    one uses, so neither sees, nor depends on, what the other recorded, in whichever order they run."""
    need_chromium()  # nothing to serve to
    folder = tmp_path_factory.mktemp("ui")
    shutil.copyfile(migrated_store, folder / "mlflow.db")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    with serving_ui(folder, uri) as base:
        yield uri, base


@pytest.fixture
def ui_store(ui_server: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> str:
    """The test records into the served store (as into its own, through MLFLOW_TRACKING_URI); the
    UI's base URL."""
    uri, base = ui_server
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return base


@pytest.fixture
def mlflow_ui(ui_store: str) -> str:
    """The page of one finished run, as `aa-ray run` prints its link. Its experiment is not the
    sweep's: that test checks the experiment its sweep parent creates."""
    spec = load_spec(ROOT / "specs" / "sac.yaml", ["tracking.experiment=run-page"])
    tracker = MlflowTracker(spec)
    for step in (1000, 2000):
        tracker.log_metrics({key: value * step / 2000 for key, value in METRICS.items()}, step)
    tracker.finish("FINISHED")
    return served(tracker.url, ui_store)


def chromium(*args: str) -> subprocess.CompletedProcess:
    profile = tempfile.mkdtemp(prefix="chromium_")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", "--window-size=1400,1000", "--virtual-time-budget=20000"]
    try:
        return subprocess.run([CHROMIUM, *flags, *args], capture_output=True, text=True, timeout=180)
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def need_chromium() -> None:
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("CI must have Debian's chromium (.ci/run installs it)")
        pytest.skip("chromium is not installed (apt-get install chromium)")


def test_mlflow_ui_shows_the_runs_metrics(mlflow_ui: str) -> None:
    need_chromium()
    page = chromium("--dump-dom", mlflow_ui)
    assert page.returncode == 0, page.stderr[-2000:]
    missing = [name for name in METRICS if name not in page.stdout]
    assert not missing, f"the run page does not show {missing}"
    ARTIFACTS.mkdir(exist_ok=True)
    screenshot = ARTIFACTS / "mlflow_run_page.png"
    shot = chromium(f"--screenshot={screenshot}", mlflow_ui)
    assert shot.returncode == 0 and screenshot.stat().st_size > 10_000, shot.stderr[-2000:]


def test_a_sweeps_children_compare_side_by_side_in_the_model_training_view(ui_store: str) -> None:
    """Two children of a sweep parent, recorded as sweep trials record themselves. The experiment
    opens in the model-training view (MLflow 3's default is its GenAI view); the compare link that
    a sweep prints shows both runs' params side by side, and its metric link draws one line per run."""
    need_chromium()
    parent = ParentRun("aa-ray", "sweep", "utd", "sweep:utd")
    children = []
    for utd, lr in ((1, 0.0003), (2, 0.001)):
        spec = load_spec(ROOT / "specs" / "sac.yaml", [f"algo.utd_ratio={utd}", f"algo.critic_lr={lr}"])
        tracker = MlflowTracker(spec, context=RunContext(parent_run_id=parent.run_id, run_name=f"utd_ratio={utd}"))
        for step in (1000, 2000, 3000):
            tracker.log_metrics({"eval/return": -20.0 + utd * step / 500}, step)
        tracker.finish("FINISHED")
        children.append(tracker.run_id)
    parent.finish("FINISHED")
    experiment = parent.client.get_experiment(parent.experiment_id)
    assert experiment.tags[EXPERIMENT_KIND_TAG] == MODEL_TRAINING

    base = ui_store
    experiment_page = served(experiment_link(parent.uri, parent.experiment_id), base)
    training_view, genai_view = (chromium("--dump-dom", url) for url in (experiment_page,
                                                                          experiment_page.split("?")[0]))
    assert "sweep:utd" in training_view.stdout and "Evaluation runs" not in training_view.stdout
    assert "Evaluation runs" in genai_view.stdout  # without the link's view parameter: why it has one

    compare = chromium("--dump-dom", served(compare_link(parent.uri, parent.experiment_id, children), base))
    assert compare.returncode == 0, compare.stderr[-2000:]
    for text in ("utd_ratio=1", "utd_ratio=2", "algo.critic_lr", "0.0003", "0.001", "algo.utd_ratio"):
        assert text in compare.stdout, f"the compare view does not show {text!r}"
    metric_href = re.search(r'href="(#/metric\?[^"]*eval%2Freturn[^"]*)"', compare.stdout)
    assert metric_href, "the compare view links no eval/return chart"
    chart = chromium("--dump-dom", f"{base}/{html.unescape(metric_href.group(1))}")
    lines = re.findall(r"utd_ratio=\d \(eval/return\)", chart.stdout)  # the chart's legend
    assert sorted(lines) == ["utd_ratio=1 (eval/return)", "utd_ratio=2 (eval/return)"], lines
    ARTIFACTS.mkdir(exist_ok=True)
    chromium(f"--screenshot={ARTIFACTS / 'mlflow_compare.png'}", served(
        compare_link(parent.uri, parent.experiment_id, children), base))
