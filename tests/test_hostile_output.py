"""What aa-ray shows is safe to show: URIs without the credentials in them (in links, messages,
events and MLflow's own errors), and users' strings on the terminal as text, never as rich markup
or as control sequences (a run name with "[" used to crash the live panel after training began)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from rich.console import Console

from aa_ray import cli
from aa_ray.runtime.phases import Phases
from aa_ray.runtime.progress import ProgressDisplay
from aa_ray.runtime.run_files import EVENTS_FILE
from aa_ray.runtime.run_record import RunRecord
from aa_ray.spec.loader import load_spec
from aa_ray.tracking.credentials import scrub_uris, without_credentials
from aa_ray.tracking.mlflow_tracker import compare_link, experiment_link, run_link
from aa_ray.tracking.outbox import first_line

ROOT = Path(__file__).resolve().parents[1]
SECRET = "s3cr3t-Pa55"
CLEAR_SCREEN = "\x1b[2J"
HOSTILE = f"run[/]x [link=http://evil]y[/link] :smile: [bold red]{CLEAR_SCREEN}\rz"


@pytest.mark.parametrize(("given", "shown"), [
    (f"http://alice:{SECRET}@127.0.0.1:5000", "http://127.0.0.1:5000"),
    (f"https://alice:{SECRET}@mlflow.example.com/prefix/", "https://mlflow.example.com/prefix/"),
    (f"https://mlflow.example.com/?token={SECRET}&view=1", "https://mlflow.example.com/?token=***&view=1"),
    (f"https://acct.blob.core.windows.net/c?sv=2022-11-02&sig={SECRET}", "https://acct.blob.core.windows.net/c?sv=2022-11-02&sig=***"),
    (f"postgresql://mlflow:{SECRET}@db:5432/mlflow?sslmode=require", "postgresql://db:5432/mlflow?sslmode=require"),
    (f"s3://AKIA:{SECRET}@bucket/runs", "s3://bucket/runs"),
    # nothing to hide: exactly as given
    ("sqlite:///file:/tmp/mlflow.db?mode=ro&uri=true", "sqlite:///file:/tmp/mlflow.db?mode=ro&uri=true"),
    ("http://127.0.0.1:5000", "http://127.0.0.1:5000"),
    ("databricks", "databricks"),
])
def test_a_uri_is_shown_without_its_credentials(given: str, shown: str) -> None:
    assert without_credentials(given) == shown


def test_every_link_aa_ray_makes_leaves_the_credentials_out() -> None:
    uri = f"http://alice:{SECRET}@127.0.0.1:5000/"
    links = [run_link(uri, "1", "abc"), experiment_link(uri, "1"), compare_link(uri, "1", ["a", "b"])]
    assert all(link.startswith("http://127.0.0.1:5000/#/") for link in links), links


def test_mlflows_own_errors_repeat_the_credentials_and_are_scrubbed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A real MLflow client to a server that is not there: its error names the request's URL as
    given; what aa-ray shows of it does not."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    client = MlflowClient(tracking_uri=f"http://alice:{SECRET}@127.0.0.1:9/")  # the discard port: refused
    with pytest.raises(Exception) as caught:  # noqa: PT011 - whatever MLflow raises, its text is the point
        client.get_experiment_by_name("x")
    assert SECRET in str(caught.value)  # why the scrubbing is needed
    assert SECRET not in first_line(caught.value) and "http://127.0.0.1:9/api/" in first_line(caught.value)
    assert SECRET not in scrub_uris(f"during the run: {caught.value}")


def test_events_and_messages_of_a_run_carry_no_credentials(tmp_path: Path) -> None:
    record = RunRecord(load_spec(ROOT / "specs" / "sac.yaml"), tmp_path / "run", Phases(trace=False), track=False,
                       live=False, context=None)
    output = io.StringIO()
    record.progress = ProgressDisplay("run", 100, live=False, console=Console(file=output))
    reason = f"API request to http://alice:{SECRET}@h:5000/api/2.0/mlflow/runs/log-batch failed"
    record.event("runner_restart", 10, reason=reason, tried=[f"s3://k:{SECRET}@b/x"], where={"uri": reason})
    record.message(f"checkpoint stored at s3://k:{SECRET}@bucket/ckpt")
    events = (tmp_path / "run" / EVENTS_FILE).read_text()
    assert SECRET not in events + output.getvalue()
    assert json.loads(events)["reason"] == "API request to http://h:5000/api/2.0/mlflow/runs/log-batch failed"


def test_a_command_error_shows_no_credentials_and_no_control_sequences(capsys: pytest.CaptureFixture) -> None:
    assert cli._fail(f"cannot reach http://alice:{SECRET}@h:5000 for run {HOSTILE}") == 2
    err = capsys.readouterr().err
    assert SECRET not in err and CLEAR_SCREEN not in err and "\r" not in err
    assert "http://h:5000" in err and "\\x1b[2J" in err


@pytest.mark.parametrize("live", [True, False])
def test_the_progress_display_shows_users_strings_as_text(live: bool) -> None:
    """A run name, a stop metric's name and messages full of markup and control characters: shown
    as written (the panel used to raise rich's MarkupError for the "[/]"), no control sequence of
    theirs reaches the terminal."""
    output = io.StringIO()
    console = Console(file=output, force_terminal=live, width=200)
    with ProgressDisplay(HOSTILE, 1000, live=live, log_every_s=0.0, task_metric=f"eval/{HOSTILE}",
                         console=console) as progress:
        progress.update(10, {f"eval/{HOSTILE}": 0.5, "eval/return": 1.0, "env/steps_per_s": 100.0})
        progress.message(f"event: runner_restart reason={HOSTILE}")
    shown = output.getvalue()
    assert CLEAR_SCREEN not in shown and "\r" + "z" not in shown
    assert "run[/]x [link=http://evil]y[/link] :smile: [bold red]\\x1b[2J\\rz" in shown
    if not live:
        assert "\x1b" not in shown  # plain lines: no escape sequence at all
