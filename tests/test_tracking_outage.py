"""A real MLflow tracking server (`mlflow server` on 127.0.0.1, its own SQLite store) taken away:
killed in the middle of a run and started again, the run trains on, loses no metric and says what
happened in its events; down when a run starts, the run is one line saying what to do, and nothing
is written. The URI carries credentials throughout, and nothing the run prints or records shows them.

The outage here is short (CI time), but nothing in the mechanism depends on its length: the
outbox retries without a deadline while the run goes on, and its one bound (the queued metrics) is
checked against this run's own logging rate to hold five minutes and more. RESULTS.md section 19
has a five-minute outage run by hand.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from aa_ray import metric_names as m
from aa_ray.tracking.outbox import FINISH_WAIT_S, MAX_QUEUED_METRICS, Outbox

ROOT = Path(__file__).resolve().parents[1]
SECRET = "s3cr3t-Pa55"  # the password in every tracking URI of this file: it must never be shown
SMALL = [
    "runtime.backend=inline", "algo.actor_hidden_dims=[32,32]", "algo.critic_hidden_dims=[32,32]",
    "algo.batch_size=64", "algo.warm_up_steps=200", "algo.train_every=5", "runners.num_runners=2",
    "runners.envs_per_runner=2", "eval.episodes=2",
]
STEPS_PER_ITERATION = 5 * 2 * 2  # train_every x runners x envs: at most this many env steps per iteration
# short for CI; RESULTS.md section 19 ran AA_RAY_TEST_OUTAGE_S=300 with a budget that trains through it
OUTAGE_S = float(os.environ.get("AA_RAY_TEST_OUTAGE_S", "20"))
OUTAGE_RUN_BUDGET = int(os.environ.get("AA_RAY_TEST_OUTAGE_BUDGET", "16000"))  # a multiple of 2000 (evaluations)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class TrackingServer:
    """`mlflow server` on 127.0.0.1 over a SQLite store of its own, stopped and started at will
    (killed with its process group, as a machine taken away would end it)."""

    def __init__(self, folder: Path):
        self.folder, self.port = folder, free_port()
        self.folder.mkdir(parents=True, exist_ok=True)
        self.process: subprocess.Popen | None = None

    @property
    def plain_uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def uri_with_credentials(self) -> str:
        return f"http://alice:{SECRET}@127.0.0.1:{self.port}"

    def start(self) -> None:
        log = open(self.folder / "server.log", "a")  # noqa: SIM115 - the server's, closed with it
        self.process = subprocess.Popen(
            [str(Path(sys.executable).parent / "mlflow"), "server", "--backend-store-uri",
             f"sqlite:///{self.folder / 'store.db'}", "--host", "127.0.0.1", "--port", str(self.port),
             "--workers", "1"],
            stdout=log, stderr=subprocess.STDOUT, cwd=self.folder, start_new_session=True,
        )
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"{self.plain_uri}/health", timeout=2)
                return
            except OSError:
                assert self.process.poll() is None, (self.folder / "server.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "mlflow server did not come up"
                time.sleep(0.3)

    def answers(self) -> bool:
        if self.process is None or self.process.poll() is not None:
            return False
        try:
            urllib.request.urlopen(f"{self.plain_uri}/health", timeout=5)
            return True
        except OSError:
            return False

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)  # its own session: the server and its workers
            self.process.wait(timeout=30)
        self.process = None


@pytest.fixture(scope="module")
def module_tracking_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TrackingServer]:
    """One server for the file: a start is 8-9 s of CPU on 2 cores. The tests share its store, each
    in an experiment of its own and reading back only its own run."""
    server = TrackingServer(tmp_path_factory.mktemp("server"))
    server.start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def tracking_server(module_tracking_server: TrackingServer) -> TrackingServer:
    """The file's server, answering: a test that took it away and failed before bringing it back
    leaves it down, and the next test must not inherit that outage."""
    if not module_tracking_server.answers():
        module_tracking_server.kill()
        module_tracking_server.start()
    return module_tracking_server


def aa_ray_run(uri: str, *settings: str) -> subprocess.Popen:
    overrides = [arg for item in [*SMALL, *settings] for arg in ("--set", item)]
    return subprocess.Popen(
        [sys.executable, "-m", "aa_ray.cli", "run", str(ROOT / "specs" / "sac.yaml"), "--plain", *overrides],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "MLFLOW_TRACKING_URI": uri},
    )


def newest_checkpoint(tmp_path: Path) -> str:
    """The newest complete checkpoint's name ('' before the first): step_<env steps, zero-padded>."""
    return max((p.name for p in tmp_path.glob("runs/*/checkpoints/step_*") if "." not in p.name), default="")


def wait_for(condition, what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_a_tracking_server_killed_mid_run_loses_no_metric_and_training_goes_on(
    tmp_path: Path, tracking_server: TrackingServer
) -> None:
    budget = OUTAGE_RUN_BUDGET
    run = aa_ray_run(tracking_server.uri_with_credentials, f"budget.env_steps={budget}",
                     f"checkpoint.every_env_steps={max(1000, budget // 16)}", "eval.every_env_steps=2000",
                     "tracking.flush_every_s=1")
    started = time.monotonic()
    try:
        wait_for(lambda: newest_checkpoint(tmp_path) or run.poll() is not None, "the first checkpoint")
        tracking_server.kill()
        before = newest_checkpoint(tmp_path)
        time.sleep(OUTAGE_S)
        during = newest_checkpoint(tmp_path)
        tracking_server.start()
        stdout, stderr = run.communicate(timeout=FINISH_WAIT_S + 300)
    finally:
        if run.poll() is None:
            run.kill()
    wall_s = time.monotonic() - started
    assert run.returncode == 0, stderr[-3000:]
    assert during > before, "no checkpoint was written while the tracking server was down: training waited for it"

    print(f"outage {OUTAGE_S:.0f} s; newest checkpoint before it {before}, at its end {during}; run {wall_s:.0f} s")
    (run_dir,) = tmp_path.glob("runs/*")
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    kinds = [event["event"] for event in events]
    assert "tracking_unreachable" in kinds and "tracking_restored" in kinds, kinds
    assert kinds.index("tracking_unreachable") < kinds.index("tracking_restored")
    restored = events[kinds.index("tracking_restored")]
    assert restored["metrics_replayed"] > 0 and restored["metrics_dropped"] == 0, restored

    client = MlflowClient(tracking_uri=tracking_server.plain_uri)
    run_id = stdout.split("mlflow run: ")[1].split()[0]
    record = client.get_run(run_id)
    assert record.info.status == "FINISHED"
    # every iteration's point, those logged while the server was down included: no step further from
    # the one before than one iteration collects (a lost batch of 1000 metrics would be 25 iterations)
    steps = sorted(point.step for point in client.get_metric_history(run_id, m.ENV_STEPS))
    gaps = [after - before for before, after in zip([0, *steps], steps, strict=False)]
    assert steps[-1] == budget and max(gaps) <= STEPS_PER_ITERATION and min(gaps) > 0, gaps
    evaluated = sorted(point.step for point in client.get_metric_history(run_id, m.EVAL_RETURN))
    assert evaluated == list(range(2000, budget + 1, 2000))
    # the training loop never waited for MLflow: handing an iteration's metrics over takes no time
    tracking_s = [point.value for point in client.get_metric_history(run_id, f"time/{m.PHASE_TRACKING}_s")]
    assert max(tracking_s) < 0.5, max(tracking_s)
    artifacts = {a.path for a in client.list_artifacts(run_id)} | {
        a.path for a in client.list_artifacts(run_id, "checkpoints/final")}
    assert {"spec", "events.jsonl", "checkpoints/final/state.pt"} <= artifacts, artifacts

    # the bound on queued metrics holds five minutes of this run's logging (and more: see the module)
    logged = sum(len(client.get_metric_history(run_id, key)) for key in record.data.metrics)
    print(f"{logged:,} metric points, {logged / wall_s:.0f} a second")
    assert logged / wall_s * 300 < MAX_QUEUED_METRICS, f"{logged / wall_s:.0f} metrics/s"

    # the credentials in the URI are in nothing the run showed or recorded
    shown = [stdout, stderr, (run_dir / "events.jsonl").read_text(), json.dumps(record.data.params),
             json.dumps(record.data.tags)]
    assert not [text for text in shown if SECRET in text or "alice" in text]
    assert f"{tracking_server.plain_uri}/#/experiments/" in stdout  # the run's link, without them


def test_a_tracking_server_down_at_start_is_one_line_saying_what_to_do(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    started = time.monotonic()
    run = aa_ray_run(f"http://alice:{SECRET}@127.0.0.1:{port}", "budget.env_steps=1000")
    stdout, stderr = run.communicate(timeout=300)
    assert run.returncode == 2, stderr[-3000:]
    assert time.monotonic() - started < 60, "the run waited for the server (MLflow's own retries take minutes)"
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    (line,) = lines
    assert f"MLflow tracking server http://127.0.0.1:{port} does not answer (Connection refused)" in line
    assert "mlflow server" in line and "--no-track" in line and "tracking.enabled: false" in line
    assert SECRET not in stdout + stderr and "alice" not in stdout + stderr
    assert not (tmp_path / "runs").exists(), "the run started writing before it found the server down"


def test_the_outbox_replays_in_order_and_drops_the_oldest_past_its_bound(tracking_server: TrackingServer) -> None:
    """While the server is down the queue stays within its bound (the oldest metrics go first, and
    an event says so); once it is back, what waited is stored, the newest metrics all there."""
    client = MlflowClient(tracking_uri=tracking_server.uri_with_credentials)
    run_id = client.create_run(client.create_experiment("outbox")).info.run_id
    outbox = Outbox(tracking_server.uri_with_credentials, lambda metrics: client.log_batch(run_id, metrics=metrics),
                    flush_every_s=0.2, retry_every_s=0.5, max_queued_metrics=2500)
    tracking_server.kill()
    for step in range(400):  # 4000 metrics: 1500 past the bound
        outbox.put_metrics({f"m/{i}": float(step * 10 + i) for i in range(10)}, step, timestamp_ms=1000 + step)
    assert outbox.queued_metrics <= 2500 + 1000  # the bound, plus at most the batch that is being sent
    wait_for(lambda: outbox.store_down, "the outage noticed", 30)
    tracking_server.start()
    assert outbox.close(wait_s=120) == 0
    kinds = [notice.kind for notice in outbox.take_notices()]
    assert {"tracking_unreachable", "tracking_metrics_dropped", "tracking_restored"} <= set(kinds), kinds
    assert kinds.index("tracking_unreachable") < kinds.index("tracking_restored")
    history = MlflowClient(tracking_uri=tracking_server.plain_uri).get_metric_history(run_id, "m/3")
    steps = [point.step for point in history]
    assert steps == sorted(steps) and steps[-1] == 399 and len(steps) >= 250  # the newest kept, in order
    assert all(point.value == point.step * 10 + 3 and point.timestamp == 1000 + point.step for point in history)


def test_a_refused_write_is_dropped_with_an_event_and_the_rest_goes_on(tracking_server: TrackingServer) -> None:
    """A write the store refuses (a run it does not have) is no outage: it is not retried forever."""
    client = MlflowClient(tracking_uri=tracking_server.plain_uri)
    run_id = client.create_run(client.create_experiment("refused")).info.run_id
    targets = iter(["no-such-run", run_id])
    outbox = Outbox(tracking_server.plain_uri,
                    lambda metrics: client.log_batch(next(targets), metrics=metrics), flush_every_s=0.1)
    outbox.put_metrics({"a": 1.0}, 1, 1000)
    outbox.flush(wait_s=60)
    outbox.put_metrics({"a": 2.0}, 2, 2000)
    assert outbox.close(wait_s=60) == 0
    (refused,) = outbox.take_notices()
    assert refused.kind == "tracking_refused" and "1 metrics" in refused.details["what"]
    assert [p.value for p in client.get_metric_history(run_id, "a")] == [2.0]
