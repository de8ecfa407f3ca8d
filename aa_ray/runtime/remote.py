"""Waiting on actors: `ray.get` (or, for inline actors, reading their ready results) that turns an
actor's failure into one readable error.

Used by every driver that calls actors (the trainer, `aa_ray.rollout.job`). An actor that raised
surfaces as `TrainingError` with its own exception's message; an actor that is gone (killed, out
of memory, its node lost) as `ActorLost`, which the trainer recovers from; a call whose argument was
lost with its node's object store as `ObjectLost` (an `ActorLost`).

A call on an inline actor (`runtime.backend: inline`, `aa_ray.runtime.inline`) runs when it is
submitted and returns a `Ready` where a Ray actor returns an object ref; Ray is imported only to
wait on real refs, so the inline path runs where Ray is not installed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any


class TrainingError(RuntimeError):
    """A run that failed inside an actor; the message is the actor's own error."""


class ActorLost(TrainingError):
    """An actor died (killed, out of memory, its node lost) rather than raising an exception."""


class ObjectLost(ActorLost):
    """An object a call needed (a runner's transitions, a learner's weights) was lost with the node whose
    object store held it: the call never ran. Recovered from like a dead actor, unless the caller can
    do without the object (a chunk of transitions is dropped)."""


class ActorStartFailed(TrainingError):
    """An actor raised in its constructor (e.g. an env runner whose env cannot be made in its process):
    the same actor would fail the same way again, so nothing retries it."""


class LearnerFailed(TrainingError):
    """A learner raised: the run cannot go on (the trainer adds where to resume from)."""


@dataclass(frozen=True)
class Ready:
    """An inline actor call's outcome, computed when the call was submitted: its return value, or
    the exception it raised (`error`) and which method raised it (`call`, e.g. "EnvRunner.sample")."""

    value: Any = None
    error: Exception | None = None
    call: str = ""

    def failure(self) -> str:
        return f"{self.call} raised {type(self.error).__name__}: {self.error}"


def creation_failure(error_msg: str) -> str:
    """Which actor raised in its constructor, where, and its exception (type and message), out of the
    text Ray gives a creation task's failure: the exception object itself does not reach the driver."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", error_msg)  # Ray colours the actor's name
    header = re.search(r"ray::(\w+)\.__init__\(\) \(pid=(\d+), ip=([^,)]+)", text)
    where = f"{header[1]} (pid {header[2]} on {header[3]})" if header else "an actor"
    lines = text.splitlines()
    # the last unindented "package.module.SomeError: message" line starts the exception that ended it
    starts = [i for i, line in enumerate(lines) if re.match(r"^[A-Za-z_][\w.]*: ", line)]
    if not starts:
        return f"{where} could not start: {text.strip()}"
    name, _, message = "\n".join(lines[starts[-1]:]).strip().partition(": ")
    return f"{where} could not start: {name.rsplit('.', 1)[-1]}: {message}"


def memory_kill(message: str) -> str:
    """One line for Ray's memory monitor killing an actor: the node, its memory, the actor and what
    it held, and what to change; `message` is Ray's own report (forty lines of object store stats)."""
    node = re.search(r"Memory on the node \(IP: ([^,]+), ID: [^)]*\) was ([\d.]+)GB used / ([\d.]+)GB limit", message)
    killed = re.search(r"Selected to kill: \((?:Task|Actor)[^:]*: .*?task name=([^,]+),.*?pid=(\d+), "
                       r"actual memory used=([\d.]+)GB", message)
    where = f"node {node[1]} was using {node[2]} GB of {node[3]} GB" if node else "its node ran low on memory"
    who = (f"; it killed {killed[1].removesuffix('.__init__')} (pid {killed[2]}), which held {killed[3]} GB"
           if killed else "")
    return (f"killed by Ray's memory monitor: {where}{who}. Each env copy holds its simulator (a robot task's "
            "about 55 MiB on EnvPool: benchmarks/robot_memory.py), so lower runners.envs_per_runner or "
            "runners.num_runners, run on a node with more memory, or stop what else uses it")


def describe_failure(err: Exception) -> str:
    """One line for a Ray actor's failure: its own exception, or why the actor is gone."""
    import ray

    if isinstance(err, ray.exceptions.OutOfMemoryError):
        return memory_kill(str(err))
    if isinstance(err, ray.exceptions.RayActorError) and err.actor_init_failed:
        return creation_failure(err.error_msg)
    if isinstance(err, ray.exceptions.ObjectLostError):  # also RayTaskError(ObjectLostError): an argument's
        lost = err.cause if isinstance(err, ray.exceptions.RayTaskError) and err.cause is not None else err
        return (f"an object it needed was lost ({type(lost).__name__}: object "
                f"{getattr(lost, 'object_ref_hex', '?')}, gone with its node or its owner)")
    if isinstance(err, ray.exceptions.RayTaskError):
        cause = err.cause if getattr(err, "cause", None) is not None else err
        return f"{type(cause).__name__}: {cause}"
    if isinstance(err, ray.exceptions.ActorUnavailableError):  # its node may be gone: Ray has not decided yet
        return f"the actor could not be reached ({err.error_msg.splitlines()[0]})"
    if isinstance(err, ray.exceptions.RayActorError):
        return "the actor died" + (f" ({err.error_msg.splitlines()[0]})" if getattr(err, "error_msg", "") else "")
    return f"{type(err).__name__}: {err}"


def get_results(refs: Any) -> Any:
    """ray.get that surfaces the actor's exception message instead of a Ray traceback. For a list,
    the first failure is raised as soon as it happens, not after the refs before it finish (a dead
    learner must not leave the driver waiting on its peers' collective timeout). Inline results are
    read without Ray; a failed one raises with the actor's own exception (and traceback) as cause."""
    if isinstance(refs, Ready) or (isinstance(refs, list) and all(isinstance(ref, Ready) for ref in refs)):
        return _read_ready(refs)  # also an empty list: nothing to wait on
    import ray

    try:
        if isinstance(refs, list) and len(refs) > 1:
            pending = list(refs)
            while pending:
                ready, pending = ray.wait(pending, num_returns=1)
                ray.get(ready)
        return ray.get(refs)
    except ray.exceptions.RayActorError as err:  # also a task whose input came from a dead actor
        if err.actor_init_failed:
            raise ActorStartFailed(describe_failure(err)) from None
        raise ActorLost(describe_failure(err)) from None
    except ray.exceptions.OutOfMemoryError as err:  # the actor was killed: lost, as one that died
        raise ActorLost(describe_failure(err)) from None
    except ray.exceptions.ObjectLostError as err:  # before RayTaskError: a task whose argument was lost is both
        raise ObjectLost(describe_failure(err)) from None
    except ray.exceptions.RayTaskError as err:
        raise TrainingError(describe_failure(err)) from None


def _read_ready(refs: Ready | list[Ready]) -> Any:
    for ref in refs if isinstance(refs, list) else [refs]:
        if ref.error is not None:
            raise TrainingError(ref.failure()) from ref.error
    return [ref.value for ref in refs] if isinstance(refs, list) else refs.value


def get_or_failure(ref: Any) -> tuple[Any, str | None]:
    """(the result, None), or (None, why) when the actor behind `ref` raised or died: for actors
    the driver replaces rather than stopping the run for (env runners). Inline actors are never
    replaced: a failed inline result raises TrainingError, which ends the run."""
    if isinstance(ref, Ready):
        if ref.error is not None:
            raise TrainingError(
                f"{ref.failure()}; runtime.backend inline restarts no actor, so the run stopped: fix the cause, "
                "or use runtime.backend: ray, which replaces a failed env runner up to runtime.max_runner_restarts "
                "times"
            ) from ref.error
        return ref.value, None
    import ray

    try:
        return ray.get(ref), None
    except ray.exceptions.RayActorError as err:
        if err.actor_init_failed:  # a replacement that cannot start either: replacing it again would not help
            raise ActorStartFailed(describe_failure(err)) from None
        return None, describe_failure(err)
    except (ray.exceptions.RayTaskError, ray.exceptions.ObjectLostError, ray.exceptions.OutOfMemoryError) as err:
        return None, describe_failure(err)


def wait_done(refs: list[Any]) -> None:
    """Return once every call behind `refs` has ended (or failed), without fetching its result to this
    process (inline results are done when submitted)."""
    pending = [ref for ref in refs if not isinstance(ref, Ready)]
    if pending:
        import ray

        ray.wait(pending, num_returns=len(pending), fetch_local=False)


def get_each(refs: list[Any]) -> list[tuple[Any, str | None]]:
    """`get_or_failure` of every ref, with one wait for all of them where none failed (a driver's
    cost per runner is then the result alone, not a call into Ray per runner)."""
    if refs and not any(isinstance(ref, Ready) for ref in refs):
        import ray

        try:
            return [(value, None) for value in ray.get(refs)]
        except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError, ray.exceptions.ObjectLostError,
                ray.exceptions.OutOfMemoryError):
            pass  # one by one, to tell which failed and why
    return [get_or_failure(ref) for ref in refs]

