"""Prefect flows (thin: parse config, call exgrpo, report). Deployments: ../prefect.yaml."""

from __future__ import annotations

from exgrpo.errors import UserError, one_line


def user_errors() -> tuple[type[BaseException], ...]:
    """Errors phrased for the user in one line (a config, an unreachable store, a cluster that refuses
    us: :class:`exgrpo.errors.UserError`): a flow run ends Failed with that line, and no traceback in its log."""
    return (UserError,)


def failed(error: BaseException):
    """The Failed state of a flow run stopped by ``error``, with its whole message on one line; a direct
    caller of the flow gets ``error`` raised."""
    from prefect.states import Failed

    return Failed(message=one_line(error, None), data=error)
