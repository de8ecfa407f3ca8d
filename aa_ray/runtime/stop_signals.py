"""SIGTERM and SIGINT as a request to stop, not a crash.

Kubernetes, SLURM, spot VMs and `ray job stop` send SIGTERM and wait a grace period before SIGKILL;
Ctrl-C sends SIGINT. The first signal asks the driver to stop at the end of its current iteration,
writing a checkpoint (the trainer polls `received`). A later SIGINT (Ctrl-C pressed again: someone
at the terminal who does not want to wait), or the grace period running out before the driver got
there, interrupts it at once (KeyboardInterrupt: the run ends KILLED and keeps the checkpoints it
already wrote). A repeated SIGTERM does not: schedulers send it more than once (to the process and
again to its group, a wrapper script forwarding it, a second notice while the first is honoured),
and each copy means the same notice, whose grace period, and the SIGKILL after it, already bound
the wait.

An immediate stop never cuts a checkpoint write short: while one is written (`writing`), the
interrupt waits for it to be complete (its files written and renamed into place: bounded by the
disk, and the only thing that is not cut off), so the newest complete checkpoint is always whole
and a `<name>.partial/` only ever sits beside it.

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
        self._writing = 0  # checkpoint writes in progress in the main thread (nested `writing` blocks)
        self._held: str | None = None  # why the run stops at once, held until the write is complete

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

    @contextmanager
    def writing(self) -> Iterator[None]:
        """A checkpoint write that an immediate stop lets finish: the KeyboardInterrupt a second
        SIGINT or the grace period would raise inside the block is raised as it ends."""
        self._writing += 1
        try:
            yield
        finally:
            self._writing -= 1
        if self._writing == 0 and self._held is not None:
            reason, self._held = self._held, None
            raise KeyboardInterrupt(reason)

    def seconds_left(self) -> float:
        """Of the grace period (infinite before a signal arrived)."""
        if self.received_at is None:
            return float("inf")
        return self.grace_s - (time.monotonic() - self.received_at)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.grace_expired:
            self._stop_at_once(f"no checkpoint within runtime.stop_grace_s={self.grace_s:g}s of {self.received}")
            return
        if self.received is not None:
            if signum == signal.SIGINT:
                self._stop_at_once(f"a second stop signal ({name})")
            return  # a repeated SIGTERM: the same notice again (see the module docstring)
        self.received, self.received_at = name, time.monotonic()
        # straight to stderr: printing from a handler could re-enter the progress display's lock
        os.write(2, (f"\n{name}: stopping after this iteration with a checkpoint (within "
                     f"{self.grace_s:g} s); press Ctrl-C (SIGINT) to stop at once\n").encode())
        self._timer = threading.Timer(self.grace_s, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def _stop_at_once(self, reason: str) -> None:
        if self._writing:
            if self._held is None:
                self._held = reason
                os.write(2, f"\n{reason}: stopping once the checkpoint being written is complete\n".encode())
            return
        raise KeyboardInterrupt(reason)

    def _expire(self) -> None:
        self.grace_expired = True
        _thread.interrupt_main(signal.SIGINT)  # runs `_handle` in the main thread, which now raises
