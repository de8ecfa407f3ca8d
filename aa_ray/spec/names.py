"""Names a spec gives that become folder and file names (runs/<name>-<hash>-<time>/, suites/<name>/,
a suite cell's or a pipeline stage's folder, Tune's experiment) and are printed in the progress
panel: a bounded set of characters that no file system, shell or terminal reads as anything else."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator

MAX_NAME_LENGTH = 100  # a run folder adds a hash and a time stamp, and file names stop at 255 bytes
_SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
NAME_RULE = (
    f"1 to {MAX_NAME_LENGTH} characters: ASCII letters, digits, '_', '.' and '-', not starting with '.' or '-' "
    "(it names folders and files and is printed as given)"
)


def check_name(name: str) -> str:
    if len(name) > MAX_NAME_LENGTH or not _SAFE_NAME.fullmatch(name):
        raise ValueError(f"must be {NAME_RULE}")
    return name


SafeName = Annotated[str, AfterValidator(check_name)]
