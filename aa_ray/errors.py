"""The errors every layer may raise about what the user asked for or set up. They live below the
spec, the envs and the algorithms so that each of them can raise one without importing the others;
the commands report any `UserError` as one paragraph."""

from __future__ import annotations


class UserError(ValueError):
    """Something the user gave or set up cannot be used; the message is for the user and says what
    to do."""


class SpecError(UserError):
    """A spec (file, override or combination) that cannot run."""
