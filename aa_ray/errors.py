"""The errors every layer may raise about what the user asked for or set up. They live below the
spec, the envs and the algorithms so that each of them can raise one without importing the others;
the commands report any `UserError` as one paragraph."""

from __future__ import annotations

from pathlib import Path
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


def what_user_code_did(err: BaseException) -> str:
    """How the user's code (a module imported, a function called) failed, for a message: it exited
    (`sys.exit` raises SystemExit, which `except Exception` lets through) or raised."""
    if isinstance(err, SystemExit):
        return f"called sys.exit({err.code!r})"
    return f"raised {type(err).__name__}: {err}"


# below this many bytes free a failed write is put down to a full disk, whatever error the writer
# raised (torch.save and pyarrow do not pass ENOSPC on)
DISK_FULL_BELOW = 2**20


def write_failure(target: Path, err: BaseException) -> str:
    """Why writing `target` failed, for a message: its file system is full (with how full), or what
    the OS or the writer said."""
    import errno
    import shutil

    where = next((p for p in (target, *target.parents) if p.exists()), Path("/"))
    usage = shutil.disk_usage(where)
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT) or usage.free < DISK_FULL_BELOW:
        return (f"the file system holding {target.parent} is full ({usage.free / 2**20:.1f} MiB free of "
                f"{usage.total / 2**20:,.0f} MiB)")
    return str(err).splitlines()[0] if str(err) else type(err).__name__
