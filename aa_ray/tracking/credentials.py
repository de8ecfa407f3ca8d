"""URIs as they may be shown: without the credentials a user put into them.

`MLFLOW_TRACKING_URI=https://user:password@host` (or a token in its query string) is how many
users reach an authenticating tracking server, and MLflow's own error messages repeat the URL of
the request they made. Whatever aa-ray prints, logs, writes into a run folder or records in MLflow
goes through `without_credentials` (one URI) or `scrub_uris` (any text that may hold URIs); what
is used to connect stays as the user gave it. Standard library only: an untracked run imports no
MLflow, and still scrubs what it prints.

What is hidden, and why:

- The whole user info (everything before the authority's last "@"), for any scheme
  (RFC 3986: ALPHA *( ALPHA / DIGIT / "+" / "-" / "." ) then "://"), whatever it holds: every
  character RFC 3986 allows there (unreserved, sub-delims such as "(" "'" "!" "$", ":",
  percent-encoded octets) and a raw "@" in a password too. A user name alone goes as well: a bare
  user info is how tokens travel (`https://ghp_…@github.com/…`, an API key as the Basic-auth user,
  a Sentry DSN's key), and no rule tells a name from a token, so no guess is made. It is removed,
  not masked: what is left is a working link to the host (the UI links start from it).
- A password with a raw "/", "?" or "#" (not a valid URI, but URI parsers echo it in their errors)
  cuts the authority short and leaves something that is no host[:port], such as `user:pa`; when an
  "@" follows later, everything up to that "@" is taken for user info and removed too. A password of
  digits only before such a character, or a bare token with one, looks like host:port/path and
  cannot be told apart: percent-encode those characters.
- The value of every query parameter whose name says it is a secret (token, key, secret, pass, pwd,
  sig, auth, credential, session, cookie; anywhere in the name, raw or percent-decoded), and the
  same in the fragment (`#access_token=…`, an OAuth implicit grant) and in path parameters
  (`;jsessionid=…`). Parameters are split at "&", and a ";" also starts one; a secret's value runs
  to the next "&" (or the end of its part): a "; ..." inside it stays hidden. An empty value is
  shown empty; a value already `***` is left as it is, so scrubbing twice changes nothing.
- URIs inside other URIs (`?next=https://user:pw@host/`) are scrubbed the same way.

Everything else (scheme, host, port, path, other parameters) stays exactly as given: a URI with
nothing to hide comes back unchanged, never re-encoded.

In text, a URI starts at a scheme and "://" and runs to whitespace or a character that no URI may
hold (`"` `<` `>` `\\` `^` backquote `{` `|` `}`). Quotes, brackets, commas and periods right after a
URI are characters a URI may hold, so they are taken as part of it: that changes nothing where
nothing is hidden, and where a secret value ends the URI they are hidden along with it (a missing
closing quote is the price of never showing a password's last characters).
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import unquote_plus

HIDDEN = "***"

# query parameters that carry a secret: tokens, keys, passwords, signatures (S3 presigned
# URLs' X-Amz-Signature and X-Amz-Credential, Azure SAS's sig), session ids
_SECRET_PARAMETER = re.compile(r"token|key|secret|pass|pwd|sig|auth|credential|session|cookie", re.IGNORECASE)
_SCHEME = r"[A-Za-z][A-Za-z0-9+.\-]*"
_WITH_AUTHORITY = re.compile(rf"{_SCHEME}://")
# RFC 3986 admits none of these anywhere in a URI: in free text they (and whitespace) end one
_URI_IN_TEXT = re.compile(rf"""{_SCHEME}://[^\s"<>\\^`{{|}}]*""")
_PORT = re.compile(r"[0-9]*")
# a value hidden before, and the punctuation of the text around it that a second pass took along
_ALREADY_HIDDEN = re.compile(r"\*\*\*[)\]}'.,;:!?]*")


def without_credentials(uri: str) -> str:
    """`uri` without its user info (`user:password@`, `token@`), and with the value of every query,
    fragment or path parameter whose name says it is a secret replaced by ***. Anything else, a
    SQLite path and its options included, is left exactly as it was."""
    start = _WITH_AUTHORITY.match(uri)
    if start is None:  # no authority ("databricks", "file:/x"): only parameters can hold a secret
        return _without_secret_values(uri)
    return start.group(0) + _without_secret_values(_without_userinfo(uri[start.end():]))


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


def _without_userinfo(rest: str) -> str:
    """`rest` (what follows "://") without the user info of its authority."""
    end = next((at for at, char in enumerate(rest) if char in "/?#"), len(rest))
    authority = rest[:end]
    if "@" in authority:  # the last "@": a raw "@" in a password is still user info
        return authority.rpartition("@")[2] + rest[end:]
    later = rest.find("@", end)
    if later != -1 and not _is_host_port(authority):
        # `user:pa/ss@host`: a "/", "?" or "#" in the password ended the authority early
        return _without_userinfo(rest[later + 1:])
    return rest


def _is_host_port(authority: str) -> bool:
    """Whether `authority` (no "@" in it) reads as host[:port]: an IP literal in brackets or a
    name, then at most digits after a ":"."""
    if authority.startswith("["):
        closing = authority.find("]")
        after = authority[closing + 1:] if closing != -1 else "?"
        return after == "" or (after[0] == ":" and _PORT.fullmatch(after[1:]) is not None)
    return _PORT.fullmatch(authority.partition(":")[2]) is not None


def _without_secret_values(tail: str) -> str:
    """`tail` (path, query, fragment) with its secret parameters' values hidden, and any URI inside
    it scrubbed as well."""
    before, hash_sign, fragment = tail.partition("#")
    path, question_mark, query = before.partition("?")
    path = "/".join(_hidden_field(segment, first=1) for segment in path.split("/"))
    query = "&".join(_hidden_field(field, first=0) for field in query.split("&"))
    fragment = "&".join(_hidden_field(field, first=0) for field in fragment.split("&"))
    shown = path + question_mark + query + hash_sign + fragment
    # a URI in a parameter (`?next=http://user:pw@host`): its start lies past this URI's, so this ends
    return _URI_IN_TEXT.sub(lambda found: without_credentials(found.group(0)), shown)


def _hidden_field(field: str, first: int) -> str:
    """`field` (one "&"-separated query or fragment parameter, or one path segment) with everything
    after the "=" of its first secret-named ";"-part hidden. Parts before `first` are not
    parameters (a path segment's name)."""
    offset = 0
    for index, part in enumerate(field.split(";")):
        name, equals, _ = part.partition("=")
        if index >= first and equals and _is_secret_name(name):
            value_at = offset + len(name) + 1
            value = field[value_at:]
            if not value or _ALREADY_HIDDEN.fullmatch(value):
                return field
            return field[:value_at] + HIDDEN
        offset += len(part) + 1
    return field


def _is_secret_name(name: str) -> bool:
    return bool(_SECRET_PARAMETER.search(name) or _SECRET_PARAMETER.search(unquote_plus(name)))
