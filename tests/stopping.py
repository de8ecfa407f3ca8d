"""What the preemption tests share: a real command stopped by SIGTERM, as a batch scheduler stops a job, and
what they read of a Tune job's console and run folders."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from aa_ray.cli import PREEMPTED_EXIT_CODE


def wait_for(condition: Callable[[], bool], process: subprocess.Popen, what: str, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert process.poll() is None, f"the command ended before {what}"
        assert time.monotonic() < deadline, f"no {what} within {timeout_s:g} s"
        time.sleep(0.2)


def stop_with_sigterm(command: list[str], log: Path, cwd: Path, ready: Callable[[], bool], what: str) -> str:
    """Start the command, SIGTERM its driver once `ready`, and check it stopped as a preempted job
    should: exit 75, no traceback nor Ray's signal dump, the hint to resume. Returns its console."""
    with log.open("w") as out:
        process = subprocess.Popen(command, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_for(ready, process, what)
            process.send_signal(signal.SIGTERM)  # to the driver alone, as `kill -TERM` and Kubernetes send it
            process.wait(timeout=180)
        finally:
            if process.poll() is None:
                process.kill()
    console = log.read_text()
    assert process.returncode == PREEMPTED_EXIT_CODE, console[-4000:]
    for crash in ("Traceback", "Fatal Python error", "Stack (most recent call first)"):
        assert crash not in console, console[-4000:]
    assert "SIGTERM: stopping the" in console and "--resume latest" in console, console[-4000:]
    return console


def has_step_checkpoint(run_dir: Path) -> bool:
    """A complete step checkpoint (not a .partial) and no final one: the run is mid-way."""
    steps = [c for c in run_dir.glob("checkpoints/step_*") if "." not in c.name and (c / "state.pt").is_file()]
    return bool(steps) and not (run_dir / "checkpoints" / "final").exists()


def assert_event_lines(console: str, labels: list[str]) -> None:
    """Tune's status table and a line per trial event, without colour codes; no trial's own output."""
    assert "\x1b[" not in console, console[max(0, console.find("\x1b[") - 1000):][:2000]
    assert "== Status ==" in console, console[-4000:]
    assert "tensorboard" not in console.lower() and "repeated" not in console
    for label in labels:
        assert f" started [{label}], its log: " in console, (label, console[-4000:])
