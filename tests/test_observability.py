"""Our Ray metrics and the Grafana dashboard over them: the dashboard asks only for metrics we
export, and a short real run exposes every one of them on Ray's metrics endpoint (scraped over
loopback)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from html import unescape as html_unescape
from pathlib import Path

import numpy as np
import pytest
import ray

from aa_ray.runtime.metrics import DEFINITIONS, prometheus_name, run_tag
from aa_ray.runtime.trainer import Trainer
from aa_ray.spec.loader import load_spec

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "dashboards" / "aa_ray_grafana_dashboard.json"
EXPORTED = {prometheus_name(name) for name in DEFINITIONS}


def dashboard_metric_names() -> set[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    exprs += [variable["definition"] for variable in dashboard["templating"]["list"] if "definition" in variable]
    return {name for expr in exprs for name in re.findall(r"\bray_aa_ray_[a-z_]+", expr)}


def test_grafana_dashboard_queries_exported_metrics_only() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {variable["name"]: variable for variable in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert "SessionName" in variables
    names = dashboard_metric_names()
    assert names <= EXPORTED, f"the dashboard asks for metrics nobody exports: {names - EXPORTED}"
    assert names == EXPORTED, f"exported but on no panel: {EXPORTED - names}"
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            if "ray_aa_ray_" in target["expr"] and "label_values" not in target["expr"]:
                assert 'SessionName=~"$SessionName"' in target["expr"], target["expr"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


# before the tests that share the file's Ray (ray_with_metrics), whose idle daemons would slow this command
def test_without_a_gl_backend_videos_are_skipped_with_a_warning(tmp_path: Path) -> None:
    """No MUJOCO_GL and no display: rendering fails, the run says why once and trains on."""
    env = {k: v for k, v in os.environ.items() if k not in ("MUJOCO_GL", "DISPLAY")}
    run = subprocess.run(
        [sys.executable, "-m", "aa_ray.cli", "run", str(ROOT / "specs" / "sac.yaml"), "--no-track", "--plain",
         "--set", "runtime.backend=inline", "--set", "eval.video=true", "--set", "budget.env_steps=400",
         "--set", "algo.warm_up_steps=200", "--set", "eval.every_env_steps=200", "--set", "eval.episodes=2",
         "--set", "algo.actor_hidden_dims=[32,32]", "--set", "algo.critic_hidden_dims=[32,32]"],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path,
    )
    output = " ".join((run.stdout + run.stderr).split())  # the progress display wraps long lines
    assert run.returncode == 0, output[-3000:]
    assert output.count("event: video_unavailable") == 1 and "cannot render aa_ray/PusherReach-v0 offscreen" in output
    assert not list(tmp_path.glob("runs/*/videos/*.gif"))


def test_report_draws_the_stored_curves(tmp_path: Path) -> None:
    """Two seeds of a small run, children of one parent: `aa-ray report --parent` writes a PNG and a
    self-contained HTML page whose curve data are the stored eval metrics (median over the seeds),
    and logs them to the parent run. (The runs are inline: the report reads only what they stored.)"""
    from mlflow.tracking import MlflowClient
    from PIL import Image

    from aa_ray import cli
    from aa_ray.tracking.curves import load_curve
    from aa_ray.tracking.mlflow_tracker import RunContext
    from aa_ray.tune.parent import ParentRun

    parent = ParentRun("aa-ray", "sweep", "seeds", run_name="sweep:seeds")
    for seed in (0, 1):
        spec = load_spec(ROOT / "specs" / "sac_pendulum.yaml", [
            f"seed={seed}", "budget.env_steps=800", "algo.warm_up_steps=200", "eval.every_env_steps=200",
            "eval.episodes=2", "runtime.backend=inline",
            "algo.actor_hidden_dims=[32,32]", "algo.critic_hidden_dims=[32,32]", "checkpoint.save_replay=false",
        ])
        Trainer(spec, live=False, context=RunContext(parent_run_id=parent.run_id)).run()
    parent.finish("FINISHED")

    out = tmp_path / "report"
    assert cli.main(["report", "--parent", parent.run_id, "--out", str(out), "--threshold", "-1500"]) == 0
    with Image.open(out / "report.png") as image:
        assert image.format == "PNG" and image.size[0] > 800
    page = (out / "report.html").read_text()
    assert "data:image/png;base64," in page and "<table>" in page
    curves = json.loads(html_unescape(re.search(r'<script type="application/json" id="curves">(.*)</script>',
                                                page, re.S).group(1)))
    (group,) = curves.values()  # the two seeds are one configuration
    client = MlflowClient()
    finals, last_steps = [], []
    for run_id in group["runs"]:
        history = sorted(client.get_metric_history(run_id, "eval/return"), key=lambda m: m.step)
        finals.append(history[-1].value)
        last_steps.append(history[-1].step)
    assert len(group["runs"]) == 2
    assert group["env_steps"]["x"][-1] == max(last_steps)
    assert abs(group["env_steps"]["median"][-1] - float(np.median(finals))) < 1e-9
    assert group["env_steps"]["low"][-1] == min(finals) and group["env_steps"]["high"][-1] == max(finals)
    logged = {a.path for a in client.list_artifacts(parent.run_id, "report")}
    assert logged == {"report/report.png", "report/report.html", "report/summary.json"}
    # the report's "to reach X" starts where the learner's count, as the driver logged it, first rose:
    # once the 200 warm-up steps are stored (an iteration or two past them), after the evaluation at 200
    for run_id in group["runs"]:
        curve = load_curve(client, client.get_run(run_id), "eval/return")
        assert 200 <= curve.learning_from <= 200 + 2 * spec.algo.train_every
        assert curve.steps[0] < curve.learning_from


# a small SAC run on pusher-reach that evaluates twice or more
SHORT_EVALUATED_RUN = [
    "algo.warm_up_steps=300", "eval.every_env_steps=300", "eval.episodes=2", "algo.actor_hidden_dims=[32,32]",
    "algo.critic_hidden_dims=[32,32]", "checkpoint.save_replay=false",
]


def test_eval_video_is_logged_to_mlflow() -> None:
    """eval.video renders the first eval episode offscreen (EGL here) into a GIF artifact per evaluation
    (inline: runner 0 renders it in this process, as it does in its actor on Ray)."""
    from mlflow.tracking import MlflowClient
    from PIL import Image

    spec = load_spec(ROOT / "specs" / "sac.yaml", [
        *SHORT_EVALUATED_RUN, "eval.video=true", "eval.video_max_frames=8", "budget.env_steps=600",
        "runtime.backend=inline",
    ])
    result = Trainer(spec, live=False).run()
    client = MlflowClient()
    videos = [a.path for a in client.list_artifacts(result.mlflow_run_id, "videos")]
    assert len(videos) == len(result.evals) == 2
    local = client.download_artifacts(result.mlflow_run_id, videos[-1])
    with Image.open(local) as gif:
        assert gif.format == "GIF" and gif.n_frames == 8 and gif.size == (480, 480)


@pytest.fixture(scope="module")
def ray_with_metrics() -> Iterator[int]:
    """The file's one Ray for its Ray runs, as `one_ray` (tests/conftest.py) but with its metrics
    agent on a known port (yielded) reporting every second: one start-up, not one per test."""
    port = free_port()
    ray.init(address="local", num_cpus=4, include_dashboard=False, _metrics_export_port=port,
             _system_config={"metrics_report_interval_ms": 1000})
    yield port
    ray.shutdown()


# first on the file's Ray: a driver's gauges live in this process and stay exported, tagged with
# their own run, for as long as the Ray does, and the first line of each metric seen is the one checked
def test_a_short_run_exposes_every_metric_on_rays_endpoint(ray_with_metrics: int) -> None:
    """An async SAC run (policy lag exists only there) on a local Ray whose metrics agent listens
    on a known port; while it trains, the endpoint shows every aa-ray metric tagged with the run.
    Once every one was seen the run has nothing left to show: it stops at its next report."""
    spec = load_spec(ROOT / "specs" / "sac.yaml", [
        "tracking.enabled=false", "checkpoint.save_replay=false", "runtime.mode=async", "budget.env_steps=4000",
        "algo.actor_hidden_dims=[32,32]",
        "algo.critic_hidden_dims=[32,32]", "algo.batch_size=64", "algo.warm_up_steps=300", "eval.every_env_steps=500",
        "eval.episodes=2",
    ])
    seen: dict[str, str] = {}  # this thread's alone: the run hears only the event
    all_seen = threading.Event()
    trainer = Trainer(spec, live=False, reporter=lambda metrics, checkpoint: all_seen.is_set())
    run = threading.Thread(target=trainer.run, daemon=True)
    run.start()
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        for line in scrape(ray_with_metrics).splitlines():
            match = re.match(r"(ray_aa_ray_[a-z_]+)\{(.*)\}", line)
            if match:
                seen.setdefault(match.group(1), match.group(2))
        if set(seen) == EXPORTED:
            all_seen.set()
            break
        time.sleep(1)
    run.join(timeout=240)
    assert set(seen) == EXPORTED, f"never exposed: {EXPORTED - set(seen)}"
    assert all(f'run="{run_tag(spec)}"' in tags for tags in seen.values())
    assert not run.is_alive(), "the run went on (on the Ray the next test shares)"


@pytest.mark.usefixtures("ray_with_metrics")
def test_phase_timings_are_logged_and_the_trace_opens_as_chrome_trace_json() -> None:
    """Every phase of a tracked Ray run has its time/<phase>_s metric in MLflow, and runtime.trace
    writes one Chrome-trace JSON artifact holding the driver's phases and Ray's actor calls."""
    from mlflow.tracking import MlflowClient

    from aa_ray import metric_names as m

    spec = load_spec(ROOT / "specs" / "sac.yaml", [
        *SHORT_EVALUATED_RUN, "runtime.trace=true", "budget.env_steps=900", "checkpoint.every_env_steps=400",
    ])
    result = Trainer(spec, live=False).run()
    client = MlflowClient()
    logged = client.get_run(result.mlflow_run_id).data.metrics
    missing = [phase for phase in m.PHASES if f"time/{phase}_s" not in logged]
    assert not missing, f"no time/*_s metric for {missing}"
    updates = client.get_metric_history(result.mlflow_run_id, f"time/{m.PHASE_LEARNER_UPDATE}_s")
    assert len(updates) > 10 and all(point.value > 0 for point in updates)

    assert "trace.json" in {a.path for a in client.list_artifacts(result.mlflow_run_id)}
    events = json.loads((Path(result.run_dir) / "trace.json").read_text())["traceEvents"]
    assert all({"name", "ph", "ts", "pid"} <= event.keys() for event in events if event.get("ph") == "X")
    driver = {event["name"] for event in events if event.get("cat") == "driver"}
    assert {m.PHASE_EVAL, m.PHASE_CHECKPOINT, m.PHASE_TRACKING} <= driver
    actor_calls = {event["name"] for event in events}
    assert {"sample", "update", "sample_for_learners", "set_weights", "add"} <= actor_calls, actor_calls
