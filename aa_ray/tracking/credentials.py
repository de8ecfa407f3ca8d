"""URIs as they may be shown: without the credentials a user put into them.

`MLFLOW_TRACKING_URI=https://user:password@host` (or a token in its query string) is how many
users reach an authenticating tracking server, and MLflow's own error messages repeat the URL of
the request they made. Whatever aa-ray prints, logs, writes into a run folder or records in MLflow
goes through `without_credentials` (one URI) or `scrub_uris` (any text that may hold URIs); what
is used to connect stays as the user gave it. Standard library only: an untracked run imports no
MLflow, and still scrubs what it prints.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

HIDDEN = "***"

# query parameters that carry a secret: tokens, keys, passwords, signatures (S3 presigned
# URLs' X-Amz-Signature and X-Amz-Credential, Azure SAS's sig), session ids
_SECRET_PARAMETER = re.compile(r"token|key|secret|pass|pwd|sig|auth|credential|session|cookie", re.IGNORECASE)
# a URI inside free text: a scheme, "://", then everything up to whitespace, a quote or a bracket
_URI_IN_TEXT = re.compile(r"""[A-Za-z][A-Za-z0-9+.\-]*://[^\s'"<>()\[\]{}]+""")


def without_credentials(uri: str) -> str:
    """`uri` without its user info (`user:password@`), and with the value of every query parameter
    whose name says it is a secret replaced by ***. Anything else, a SQLite path and its options
    included, is left as it was."""
    try:
        parts = urlsplit(uri)
    except ValueError:  # not a URI urllib can split (an unbalanced "[" in the host): hide all of it
        return HIDDEN
    netloc = parts.netloc.rpartition("@")[2]
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(_SECRET_PARAMETER.search(name) for name, _ in pairs):
            query = urlencode([(name, HIDDEN if _SECRET_PARAMETER.search(name) else value) for name, value in pairs],
                              safe="*/:")
    if netloc == parts.netloc and query == parts.query:
        return uri  # nothing to hide: exactly as given (urlunsplit would normalise it)
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def scrub_uris(text: str) -> str:
    """`text` with every URI in it shown `without_credentials` (error messages, event details)."""
    return _URI_IN_TEXT.sub(lambda found: without_credentials(found.group(0)), text)


def scrubbed(value: Any) -> Any:
    """A value for a record (an event's details, a param): its strings scrubbed, in lists, tuples
    (as lists, which is what JSON makes of them) and dicts too; everything else as it was."""
    if isinstance(value, str):
        return scrub_uris(value)
    if isinstance(value, dict):
        return {key: scrubbed(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [scrubbed(item) for item in value]
    return value
