"""A run's writes to MLflow, delivered by a thread of their own in the order they were made.

The training loop hands its metrics, artifacts and the run's end to the `Outbox` and goes on; a
sender thread delivers them. While the store does not answer (a tracking server restarting, or
down for minutes; a network outage) they wait in memory, and the sender looks again every few
seconds (`RETRY_EVERY_S`), with no deadline, for as long as the run lasts. Once the store answers,
what waited is sent oldest first, metrics with the time and step they were logged at, so the
run's curves come out as if nothing had happened. Training never waits for the store: only
`flush` (after a checkpoint) waits, for a store that answers; one still busy after `STALL_S` asks
the store itself whether it answers (MLflow's client retries a call to a server that went away for
about four minutes before it gives up), and while the store is known to be down, or is still being
sent an outage's backlog, a flush returns at once. `close` (the run's end) waits longer
(`FINISH_WAIT_S`) before giving up on what is left.

The one bound is memory: at most `MAX_QUEUED_METRICS` metrics wait (about 10 bytes each: the
values of one `log_metrics` call share one tuple of names). That holds five minutes of a run that
logs 16,000 metrics a second (400 iterations a second of 40 metrics); past it the oldest metrics
are dropped and an event says how many.

What is an outage and what is a refusal: a store that cannot be reached, times out, or answers
with a server error (5xx, 429) is retried; a write the store refuses (an invalid value, a
missing run: any other 4xx) or that cannot be made here (a missing file) is dropped with an event
naming it, since no retry would change the answer.
"""

from __future__ import annotations

import threading
import time
from array import array
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import requests
from mlflow.entities import Metric
from mlflow.exceptions import MlflowException
from sqlalchemy.exc import OperationalError

from aa_ray.tracking.credentials import scrub_uris, without_credentials

MAX_QUEUED_METRICS = 5_000_000
MAX_BATCH = 1000  # MLflow's limit of metrics per log_batch call
RETRY_EVERY_S = 5.0  # while the store is down, look again this often (the first looks come sooner)
HEALTH_TIMEOUT_S = 3.0  # a tracking server that takes longer to answer its health check counts as down
FLUSH_WAIT_S = 30.0  # the most a checkpoint's flush waits for a store that answers
STALL_S = 2.0  # a flush still waiting after this long asks the store whether it answers at all
FINISH_WAIT_S = 600.0  # the most the end of a run waits for a store that does not


@dataclass(frozen=True)
class Notice:
    """Something about the store the run should record as an event (`kind`, with its details)."""

    kind: str
    details: dict[str, Any]


@dataclass
class _Metrics:
    """The metrics of one `log_metrics` call, compactly: names shared with other calls', values
    in an array."""

    names: tuple[str, ...]
    values: array
    timestamp_ms: int
    step: int

    def split(self, count: int) -> tuple[_Metrics, _Metrics]:
        """The first `count` metrics, and the rest (a batch may end inside one call's metrics)."""
        head = _Metrics(self.names[:count], self.values[:count], self.timestamp_ms, self.step)
        return head, _Metrics(self.names[count:], self.values[count:], self.timestamp_ms, self.step)

    def entities(self) -> list[Metric]:
        return [Metric(name, value, self.timestamp_ms, self.step)
                for name, value in zip(self.names, self.values, strict=True)]


@dataclass
class _Call:
    """Any other write (an artifact, the run's end): `what` names it in events."""

    what: str
    send: Callable[[], Any]


_Write = _Metrics | _Call


def is_outage(err: BaseException) -> bool:
    """Whether `err` says the store does not answer now (try again later), not that it refuses
    this write."""
    if isinstance(err, MlflowException):  # MLflow reports a connection it could not make as a 500 too
        status = err.get_http_status_code()
        return status >= 500 or status == 429
    if isinstance(err, requests.HTTPError) and err.response is not None:
        return err.response.status_code >= 500 or err.response.status_code == 429
    if isinstance(err, (requests.ConnectionError, requests.Timeout, ConnectionError, TimeoutError)):
        return True
    return isinstance(err, OperationalError)  # a SQLite store locked past retry_locked, or on a failing disk


def first_line(err: BaseException) -> str:
    """An error in one line, URIs scrubbed (MLflow's messages repeat the request's URL, credentials included)."""
    text = str(err).strip().splitlines()
    return scrub_uris(f"{type(err).__name__}: {text[0][:300]}" if text else type(err).__name__)


def store_answers(uri: str, timeout_s: float = HEALTH_TIMEOUT_S) -> str | None:
    """None if the store at `uri` answers (any HTTP response from a tracking server, whatever its
    status: the connection is what is asked); else why not, in a few words. Stores that are not
    servers (SQLite, files) always answer here: their errors come with the write itself."""
    if not uri.startswith(("http://", "https://")):
        return None
    try:  # requests: what MLflow's client uses, so proxies and the URI's credentials apply alike
        requests.get(f"{uri.rstrip('/')}/health", timeout=timeout_s)
    except requests.RequestException as err:
        cause: BaseException = err
        while cause.__context__ is not None or cause.__cause__ is not None:  # the OS's own words
            cause = cause.__cause__ or cause.__context__
        reason = cause.strerror if isinstance(cause, OSError) and cause.strerror else type(err).__name__
        return scrub_uris(str(reason))
    return None


@dataclass
class _State:
    """What the training thread and the sender share (under `Outbox.changed`)."""

    queue: deque[_Write] = field(default_factory=deque)
    queued_metrics: int = 0
    in_flight: list[_Write] = field(default_factory=list)  # taken by the sender, not yet stored
    flush_requested: bool = False
    closing: bool = False
    stopped: bool = False
    last_sent: float = field(default_factory=time.monotonic)  # when the queue was last emptied
    down_since: float | None = None  # monotonic time the store stopped answering, while it does not
    catching_up: bool = False  # the store answers again and the outage's backlog is being sent
    waited_metrics: int = 0  # metrics queued during the current outage (what its end replays)
    dropped: int = 0  # metrics dropped at the bound, in all
    notices: list[Notice] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.queue and not self.in_flight


class Outbox:
    """`send_metrics` stores one batch of at most MAX_BATCH metrics in the run; `uri` is the store's,
    as used to connect (its health is checked before each batch)."""

    def __init__(self, uri: str, send_metrics: Callable[[list[Metric]], Any], flush_every_s: float,
                 retry_every_s: float = RETRY_EVERY_S, max_queued_metrics: int = MAX_QUEUED_METRICS):
        self.uri, self.send_metrics = uri, send_metrics
        self.shown_uri = without_credentials(uri)
        self.flush_every_s, self.retry_every_s = flush_every_s, retry_every_s
        self.max_queued_metrics = max_queued_metrics
        self.state = _State()
        self.changed = threading.Condition()
        self._names: dict[tuple[str, ...], tuple[str, ...]] = {}  # one tuple per set of metric names
        self.sender = threading.Thread(target=self._send_forever, name="mlflow-outbox", daemon=True)
        self.sender.start()

    # ---- the training thread's side: never waits for the store ------------------------------------
    def put_metrics(self, metrics: dict[str, float], step: int, timestamp_ms: int) -> None:
        if not metrics:
            return
        names = tuple(metrics)
        names = self._names.setdefault(names, names)
        entry = _Metrics(names, array("d", (float(v) for v in metrics.values())), timestamp_ms, step)
        with self.changed:
            self.state.queue.append(entry)
            self.state.queued_metrics += len(names)
            if self.state.down_since is not None:
                self.state.waited_metrics += len(names)
            self._drop_past_the_bound()
            self.changed.notify_all()

    def put_call(self, what: str, send: Callable[[], Any]) -> None:
        with self.changed:
            self.state.queue.append(_Call(what, send))
            self.changed.notify_all()

    def flush(self, wait_s: float = FLUSH_WAIT_S) -> bool:
        """Send everything now and wait until it is stored, for at most `wait_s`, and not at all
        while the store is known to be down (it stays queued). Whether everything is stored."""
        with self.changed:
            self.state.flush_requested = True
            self.changed.notify_all()
            if self.changed.wait_for(self._settled, timeout=min(wait_s, STALL_S)):
                return self.state.empty
        # still sending: MLflow's client may be retrying a store that went down mid-call, for minutes
        problem = store_answers(self.uri)
        if problem is not None:
            self._outage(problem)
            return False
        with self.changed:  # it answers, only slowly
            self.changed.wait_for(self._settled, timeout=max(0.0, wait_s - STALL_S))
            return self.state.empty

    def close(self, wait_s: float = FINISH_WAIT_S, say: Callable[[str], None] = print) -> int:
        """Send what is left, waiting up to `wait_s` for a store that does not answer (`say`ing so
        once), then stop the sender. The number of metrics that could not be stored."""
        with self.changed:
            self.state.closing = True
            self.changed.notify_all()
            if not self.changed.wait_for(lambda: self.state.empty, timeout=min(wait_s, STALL_S)):
                say(f"MLflow at {self.shown_uri} has not stored the run's last {self._unsent_metrics():,} metrics "
                    f"yet: waiting up to {wait_s / 60:.1f} min for it (Ctrl-C gives up on them)")
                self.changed.wait_for(lambda: self.state.empty, timeout=max(0.0, wait_s - STALL_S))
            unsent = self._unsent_metrics()
            self.state.stopped = True
            self.changed.notify_all()
        return unsent

    def _settled(self) -> bool:
        """Nothing for a flush to wait for: all stored, or the store down or still sending an
        outage's backlog (minutes of metrics: they stay queued, as during the outage)."""
        return self.state.empty or self.state.down_since is not None or self.state.catching_up

    def take_notices(self) -> list[Notice]:
        with self.changed:
            notices, self.state.notices = self.state.notices, []
        return notices

    @property
    def queued_metrics(self) -> int:
        return self.state.queued_metrics

    @property
    def store_down(self) -> bool:
        """Whether the store has stopped answering (and not answered since)."""
        return self.state.down_since is not None

    def _unsent_metrics(self) -> int:
        in_flight = sum(len(w.names) for w in self.state.in_flight if isinstance(w, _Metrics))
        return self.state.queued_metrics + in_flight

    def _drop_past_the_bound(self) -> None:
        """Past the bound, drop the oldest waiting metrics (the writes that are not metrics stay)."""
        state = self.state
        if state.queued_metrics <= self.max_queued_metrics:
            return
        first_drop = state.dropped == 0
        while state.queued_metrics > self.max_queued_metrics:
            index = next(i for i, write in enumerate(state.queue) if isinstance(write, _Metrics))
            dropped = state.queue[index]
            del state.queue[index]
            state.queued_metrics -= len(dropped.names)
            state.dropped += len(dropped.names)
        if first_drop:
            state.notices.append(Notice("tracking_metrics_dropped", {
                "uri": self.shown_uri, "max_queued_metrics": self.max_queued_metrics,
                "reason": "the store has not answered for long enough to fill the queue; the oldest metrics go first",
            }))

    # ---- the sender thread --------------------------------------------------------------------------
    def _send_forever(self) -> None:
        delay = min(1.0, self.retry_every_s)
        while (writes := self._next_writes()) is not None:
            problem = store_answers(self.uri)
            if problem is None:
                try:
                    self._send(writes)
                except Exception as err:  # noqa: BLE001 - every failure is either retried or recorded
                    if not is_outage(err):
                        self._refused(writes, err)
                        continue
                    problem = first_line(err)
                else:
                    self._delivered()
                    delay = min(1.0, self.retry_every_s)
                    continue
            self._outage(problem)
            with self.changed:  # look again soon, then less often; a closing outbox wakes this early
                self.changed.wait_for(lambda: self.state.stopped, timeout=delay)
            delay = min(delay * 2, self.retry_every_s)

    def _next_writes(self) -> list[_Write] | None:
        """The next writes to send once they are due (every flush_every_s, on a flush, at close):
        one call, or up to MAX_BATCH metrics in the order they were logged. None: stop."""
        state = self.state
        with self.changed:
            while True:
                if state.stopped:
                    return None
                if state.in_flight:  # a retry of what failed
                    return state.in_flight
                since = time.monotonic() - state.last_sent
                if state.queue and (state.flush_requested or state.closing or state.down_since is not None
                                    or since >= self.flush_every_s):
                    break
                self.changed.wait(timeout=self.flush_every_s - since if state.queue else None)
            if isinstance(state.queue[0], _Call):
                state.in_flight = [state.queue.popleft()]
                return state.in_flight
            room = MAX_BATCH
            while room and state.queue and isinstance(state.queue[0], _Metrics):
                entry = state.queue.popleft()
                if len(entry.names) > room:
                    entry, rest = entry.split(room)
                    state.queue.appendleft(rest)
                state.queued_metrics -= len(entry.names)
                state.in_flight.append(entry)
                room -= len(entry.names)
            return state.in_flight

    def _send(self, writes: list[_Write]) -> None:
        if isinstance(writes[0], _Call):
            writes[0].send()
            return
        self.send_metrics([metric for entry in writes for metric in entry.entities()])

    def _delivered(self) -> None:
        state = self.state
        with self.changed:
            state.in_flight = []
            if state.down_since is not None:
                state.notices.append(Notice("tracking_restored", {
                    "uri": self.shown_uri, "down_s": round(time.monotonic() - state.down_since, 1),
                    "metrics_replayed": state.waited_metrics, "metrics_dropped": state.dropped,
                }))
                state.down_since, state.waited_metrics, state.catching_up = None, 0, True
            if state.empty:
                state.flush_requested = state.catching_up = False
                state.last_sent = time.monotonic()
            self.changed.notify_all()

    def _outage(self, problem: str) -> None:
        """The store stopped answering (seen by the sender, or by a flush while a send hangs)."""
        state = self.state
        with self.changed:
            if state.down_since is None:
                state.down_since = time.monotonic()
                state.waited_metrics = self._unsent_metrics()
                state.notices.append(Notice("tracking_unreachable", {
                    "uri": self.shown_uri, "reason": problem, "metrics_waiting": state.waited_metrics,
                    "retry_every_s": self.retry_every_s,
                }))
            self.changed.notify_all()  # a flush waiting for the store stops waiting

    def _refused(self, writes: list[_Write], err: BaseException) -> None:
        state = self.state
        count = sum(len(w.names) for w in writes if isinstance(w, _Metrics))
        what = writes[0].what if isinstance(writes[0], _Call) else f"{count} metrics"
        with self.changed:
            state.in_flight = []
            state.notices.append(Notice("tracking_refused", {"uri": self.shown_uri, "what": scrub_uris(what),
                                                             "reason": first_line(err)}))
            if state.empty:
                state.flush_requested = False
            self.changed.notify_all()
