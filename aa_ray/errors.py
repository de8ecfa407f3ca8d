"""The errors every layer may raise about what the user asked for or set up. They live below the
spec, the envs and the algorithms so that each of them can raise one without importing the others;
the commands report any `UserError` as one paragraph."""

from __future__ import annotations

from typing import Any

# An error echoes what the user gave so that they can find it, but a value from a hostile or mistaken
# file can be megabytes long: a message shows this much of it.
ECHO_LIMIT = 200


class UserError(ValueError):
    """Something the user gave or set up cannot be used; the message is for the user and says what
    to do."""


class SpecError(UserError):
    """A spec (file, override or combination) that cannot run."""


def clip(text: str, limit: int = ECHO_LIMIT) -> str:
    """`text`, cut to `limit` characters with a note of how long it was."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters in all)"


def echo(value: Any, limit: int = ECHO_LIMIT) -> str:
    """A user's value as an error message quotes it: its repr, bounded in size."""
    return clip(repr(value), limit)
