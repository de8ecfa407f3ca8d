"""The error every layer may raise about what the user asked for. It lives below the spec, the
envs and the algorithms so that each of them can raise it without importing the others."""

from __future__ import annotations


class SpecError(ValueError):
    """A spec (file, override or combination) that cannot run. The message is for the user."""
