"""SIGTERM and SIGINT as a request to stop, not a crash.

Kubernetes, SLURM, spot VMs and `ray job stop` send SIGTERM and wait a grace period before SIGKILL;
Ctrl-C sends SIGINT. The first signal asks the driver to stop at the end of its current iteration,
writing a checkpoint (the trainer polls `received`); a second signal, or the grace period running
out before the driver got there, interrupts it at once (KeyboardInterrupt: the run ends KILLED and
keeps the checkpoints it already wrote, each written whole or not at all).

Only the main thread may own signal handlers: elsewhere (a Tune trial's thread) nothing is installed
and the caller that owns the process decides when the run stops.
"""

from __future__ import annotations

import _thread
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopSignals:
    def __init__(self, grace_s: float):
        self.grace_s = grace_s
        self.received: str | None = None  # the first signal's name, once one arrived
        self.received_at: float | None = None
        self.grace_expired = False
        self._timer: threading.Timer | None = None

    @contextmanager
    def installed(self) -> Iterator[StopSignals]:
        """Handle the stop signals while the block runs; the handlers that were there before after it."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous: dict[int, Any] = {sig: signal.signal(sig, self._handle) for sig in STOP_SIGNALS}
        try:
            yield self
        finally:
            if self._timer is not None:
                self._timer.cancel()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def seconds_left(self) -> float:
        """Of the grace period (infinite before a signal arrived)."""
        if self.received_at is None:
            return float("inf")
        return self.grace_s - (time.monotonic() - self.received_at)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.grace_expired:
            raise KeyboardInterrupt(f"no checkpoint within runtime.stop_grace_s={self.grace_s:g}s of {self.received}")
        if self.received is not None:
            raise KeyboardInterrupt(f"a second stop signal ({name})")
        self.received, self.received_at = name, time.monotonic()
        # straight to stderr: printing from a handler could re-enter the progress display's lock
        os.write(2, (f"\n{name}: stopping after this iteration with a checkpoint (within "
                     f"{self.grace_s:g} s); send it again to stop at once\n").encode())
        self._timer = threading.Timer(self.grace_s, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def _expire(self) -> None:
        self.grace_expired = True
        _thread.interrupt_main(signal.SIGINT)  # runs `_handle` in the main thread, which now raises
