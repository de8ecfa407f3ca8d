"""Waiting on actors: `ray.get` that turns an actor's failure into one readable error.

Used by every driver that calls actors (the trainer, `aa_ray.data.rollout`). An actor that raised
surfaces as `TrainingError` with its own exception's message; an actor that is gone (killed, out
of memory, its node lost) as `ActorLost`, which the trainer recovers from.
"""

from __future__ import annotations

from typing import Any

import ray


class TrainingError(RuntimeError):
    """A run that failed inside an actor; the message is the actor's own error."""


class ActorLost(TrainingError):
    """An actor died (killed, out of memory, its node lost) rather than raising an exception."""


class LearnerFailed(TrainingError):
    """A learner raised: the run cannot go on (the trainer adds where to resume from)."""


def describe_failure(err: Exception) -> str:
    """One line for an actor's failure: its own exception, or why the actor is gone."""
    if isinstance(err, ray.exceptions.RayTaskError):
        cause = err.cause if getattr(err, "cause", None) is not None else err
        return f"{type(cause).__name__}: {cause}"
    if isinstance(err, ray.exceptions.RayActorError):
        return "the actor died" + (f" ({err.error_msg.splitlines()[0]})" if getattr(err, "error_msg", "") else "")
    return f"{type(err).__name__}: {err}"


def get_results(refs: Any) -> Any:
    """ray.get that surfaces the actor's exception message instead of a Ray traceback. For a list,
    the first failure is raised as soon as it happens, not after the refs before it finish (a dead
    learner must not leave the driver waiting on its peers' collective timeout)."""
    try:
        if isinstance(refs, list) and len(refs) > 1:
            pending = list(refs)
            while pending:
                ready, pending = ray.wait(pending, num_returns=1)
                ray.get(ready)
        return ray.get(refs)
    except ray.exceptions.RayActorError as err:  # also a task whose input came from a dead actor
        raise ActorLost(describe_failure(err)) from None
    except ray.exceptions.RayTaskError as err:
        raise TrainingError(describe_failure(err)) from None


def get_or_failure(ref: Any) -> tuple[Any, str | None]:
    """(the result, None), or (None, why) when the actor behind `ref` raised or died: for actors
    the driver replaces rather than stopping the run for (env runners)."""
    try:
        return ray.get(ref), None
    except (ray.exceptions.RayTaskError, ray.exceptions.RayActorError) as err:
        return None, describe_failure(err)
