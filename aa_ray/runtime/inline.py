"""The inline backend (`runtime.backend: inline`): the run's actors as plain objects in the
driver's process, driven by the same `ActorGraph` and loops as Ray actors, with no Ray at all.

`InlineActors` takes the place of `cluster.RayActors` in the graph: it wraps each plain class
(`Learner`, `EnvRunner`, `ReplayBuffer`) in an `InlineActor` shell. `shell.method.remote(*args)`
(and `shell.method.options(num_returns=n).remote(...)`) runs the method at once and returns
`remote.Ready` results where Ray returns object refs; a `Ready` given as an argument is passed on
as its value, and `remote.get_results` / `get_or_failure` read them without Ray.

Why this gives the Ray backend's sync-mode numbers exactly: Ray runs each actor's calls in the
order they were submitted, and running every call when it is submitted keeps that order. The
actors draw their random numbers from generators of their own (the learner's, each runner's), so
sharing one process changes none of them. What the actors' separate processes still kept apart,
each shell keeps apart: its torch thread count (`learners.torch_threads`, `runners.torch_threads`),
a setting of the whole process, swapped in around its constructor and each of its calls (the plain
classes set no process-wide state themselves; a Ray actor's shell sets it once in its own process).

Results are handed on by reference, not copied through an object store; that is safe because
the plain classes return fresh objects (policy weights are copies) and take copies of what they
keep.

Faults: a method that raises yields a failed `Ready` (a call given one fails the same way, as
with Ray); reading it raises `TrainingError` with the actor's exception as its cause. Nothing is
restarted: an env runner's failure ends the run like a learner's.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from aa_ray.runtime.remote import Ready, TrainingError


class InlineActor:
    """A plain object behind an actor handle's interface; `instance` is the object itself (to look
    into from a debugger or a notebook)."""

    def __init__(self, cls: type, args: tuple, kwargs: dict[str, Any], torch_threads: int | None = None):
        self._torch_threads = torch_threads or torch.get_num_threads()
        try:
            with self._own_threads():
                self.instance = cls(*args, **kwargs)
        except Exception as err:
            raise TrainingError(f"{cls.__name__} could not start: {type(err).__name__}: {err}") from err

    def __getattr__(self, name: str) -> InlineMethod:
        if name.startswith("_") or name == "instance":  # not set yet (a failed __init__), or private
            raise AttributeError(name)
        getattr(self.instance, name)  # an unknown method fails here, as it does on a Ray actor handle
        return InlineMethod(self, name)

    def call(self, method: str, args: tuple, kwargs: dict[str, Any]) -> Ready:
        """Run `instance.method` now; a failed `Ready` among the arguments fails the call unrun."""
        where = f"{type(self.instance).__name__}.{method}"
        for given in (*args, *kwargs.values()):
            if isinstance(given, Ready) and given.error is not None:
                return given
        args = tuple(_value(given) for given in args)
        kwargs = {key: _value(given) for key, given in kwargs.items()}
        try:
            with self._own_threads():
                return Ready(getattr(self.instance, method)(*args, **kwargs), call=where)
        except Exception as err:
            return Ready(error=err, call=where)

    @contextmanager
    def _own_threads(self) -> Iterator[None]:
        """This actor's torch thread count for the duration of one call; the driver's after it."""
        driver_threads = torch.get_num_threads()
        torch.set_num_threads(self._torch_threads)
        try:
            yield
        finally:
            torch.set_num_threads(driver_threads)


class InlineMethod:
    """`shell.method`: `.remote(...)` runs it, `.options(num_returns=n)` splits a tuple result."""

    def __init__(self, actor: InlineActor, name: str, num_returns: int = 1):
        self.actor, self.name, self.num_returns = actor, name, num_returns

    def options(self, *, num_returns: int = 1) -> InlineMethod:
        return InlineMethod(self.actor, self.name, num_returns)

    def remote(self, *args: Any, **kwargs: Any) -> Ready | tuple[Ready, ...]:
        outcome = self.actor.call(self.name, args, kwargs)
        if self.num_returns == 1:
            return outcome
        if outcome.error is not None:
            return (outcome,) * self.num_returns
        return tuple(Ready(value, call=outcome.call) for value in outcome.value)


class InlineActors:
    """Makes a run's actors as `InlineActor`s in this process; the placement arguments the graph
    gives Ray (bundle, CPUs, GPUs) mean nothing here. An inline actor cannot die apart from the
    driver, so nothing is ever lost, killed or given back."""

    def start(self, cls: type, *args: Any, bundle: int, num_cpus: float, num_gpus: float = 0.0,
              torch_threads: int | None = None, **kwargs: Any) -> InlineActor:
        return InlineActor(cls, args, kwargs, torch_threads)

    def kill(self, actor: InlineActor) -> None:
        """Nothing to end: the object goes when the graph lets go of it."""

    def wait_briefly(self, refs: list[Any], timeout_s: float) -> None:
        """Inline calls ran when they were submitted."""

    def dead(self, named: list[tuple[str, Any]]) -> list[str]:
        return []

    def lost_nodes(self, gone: list[Any], named: list[tuple[str, Any]]) -> list[Any]:
        return []  # one process, no nodes

    def await_placement(self, timeout_s: float) -> None:
        """No placement group: nothing to wait for."""

    def close(self) -> None:
        """No placement group to give back."""


def _value(given: Any) -> Any:
    return given.value if isinstance(given, Ready) else given
