"""Our Ray metrics and the Grafana dashboard over them: the dashboard asks only for metrics we
export, and a short real run exposes every one of them on Ray's metrics endpoint (scraped over
loopback)."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
import urllib.request
from pathlib import Path

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


def test_a_short_run_exposes_every_metric_on_rays_endpoint() -> None:
    """An async SAC run (policy lag exists only there) on a local Ray whose metrics agent listens
    on a known port; while it trains, the endpoint shows every aa-ray metric tagged with the run."""
    spec = load_spec(ROOT / "specs" / "sac.yaml", [
        "tracking.enabled=false", "checkpoint.save_replay=false", "runtime.mode=async", "budget.env_steps=4000",
        "algo.hidden_dims=[32,32]", "algo.batch_size=64", "algo.warm_up_steps=300", "eval.every_env_steps=500",
        "eval.episodes=2",
    ])
    port = free_port()
    ray.init(address="local", num_cpus=4, include_dashboard=False, _metrics_export_port=port,
             _system_config={"metrics_report_interval_ms": 1000})
    seen: dict[str, str] = {}
    run = threading.Thread(target=lambda: Trainer(spec, live=False).run(), daemon=True)
    try:
        run.start()
        deadline = time.monotonic() + 240
        while set(seen) != EXPORTED and time.monotonic() < deadline:
            for line in scrape(port).splitlines():
                match = re.match(r"(ray_aa_ray_[a-z_]+)\{(.*)\}", line)
                if match:
                    seen.setdefault(match.group(1), match.group(2))
            time.sleep(1)
        run.join(timeout=240)
    finally:
        ray.shutdown()
    assert set(seen) == EXPORTED, f"never exposed: {EXPORTED - set(seen)}"
    assert all(f'run="{run_tag(spec)}"' in tags for tags in seen.values())
