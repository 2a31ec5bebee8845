"""One line for an error, wherever the project reports one: a command's stderr, a failed run's tag,
a Prefect state's message, a comparison's table, a note that MLflow went away."""

from __future__ import annotations


class UserError(Exception):
    """An error phrased for the user: its message is the whole story (the field, the cause, the fix),
    so it is reported without its type's name, and never with a traceback."""


def one_line(error: BaseException, limit: int | None = 300) -> str:
    """``error`` on one line: ``Type: message`` (a :class:`UserError`'s message alone); a header line
    ending in ":" runs into the line under it, other lines are joined by "; ", and the line is cut at
    ``limit`` characters (None: never). A Ray task's error, whose message is the remote traceback, is
    told by the exception that ended the task (its ``cause``)."""
    cause = getattr(error, "cause", None)
    if isinstance(cause, BaseException) and cause is not error:
        error = cause
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    text = lines[0]
    for line in lines[1:]:
        text += (" " if text.endswith(":") else "; ") + line
    if not isinstance(error, UserError):
        text = f"{type(error).__name__}: {text}"
    return text if limit is None or len(text) <= limit else text[: limit - 1] + "…"
