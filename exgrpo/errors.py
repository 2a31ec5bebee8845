"""One line for an error, wherever the project reports one: a command's stderr, a failed run's tag,
a Prefect state's message, a comparison's table, a note that MLflow went away."""

from __future__ import annotations

import re


class UserError(Exception):
    """An error phrased for the user: its message is the whole story (the field, the cause, the fix),
    so it is reported without its type's name, and never with a traceback."""


_CREDENTIALS = re.compile(
    r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s/?#@:]*:)(?P<password>\S*?)@(?=[^\s@/?#]*(?:[/?#\s]|$))")
"""``scheme://user:password@host``: the password runs to the ``@`` that a host follows (a host holds no
``@``, and ends at ``/``, ``?``, ``#`` or the end): an unescaped ``@``, ``/``, ``?`` or ``#`` in a password
is what a user types, or a generator makes."""

_QUERY_PASSWORD = re.compile(r"(?P<head>[?&](?:password|pwd)=)(?P<password>[^&#\s]*)", re.IGNORECASE)
"""A password given as a query option (libpq's ``?password=``)."""

REDACTED = "***"


def redact_uri(text: str) -> str:
    """``text`` with the password of every URI in it replaced by ``***``: a store or storage URI
    (``http://user:pw@host``, ``postgresql+psycopg2://user:pw@host/db``, ``...?password=pw``) or a line
    that holds some (an error naming the URL it requested). The user is kept, so the line still says who;
    paths, sqlite and file URIs and URIs without a password are returned as they are. Every URI the
    project prints, logs or records where others read it goes through here."""
    text = _CREDENTIALS.sub(lambda m: m["head"] + (REDACTED if m["password"] else "") + "@", text)
    return _QUERY_PASSWORD.sub(lambda m: m["head"] + (REDACTED if m["password"] else ""), text)


def one_line(error: BaseException, limit: int | None = 300) -> str:
    """``error`` on one line: ``Type: message`` (a :class:`UserError`'s message alone); a header line
    ending in ":" runs into the line under it, other lines are joined by "; ", and the line is cut at
    ``limit`` characters (None: never). A Ray task's error, whose message is the remote traceback, is
    told by the exception that ended the task (its ``cause``). A URI's password in it is hidden
    (:func:`redact_uri`: MLflow's errors name the URL they requested, credentials included)."""
    cause = getattr(error, "cause", None)
    if isinstance(cause, BaseException) and cause is not error:
        error = cause
    lines = [line.strip() for line in redact_uri(str(error)).splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    text = lines[0]
    for line in lines[1:]:
        text += (" " if text.endswith(":") else "; ") + line
    if not isinstance(error, UserError):
        text = f"{type(error).__name__}: {text}"
    return text if limit is None or len(text) <= limit else text[: limit - 1] + "…"
