"""What the preemption tests share: a real command stopped by SIGTERM, as a batch scheduler stops a job."""

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
