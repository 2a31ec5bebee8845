"""Prefect flows (thin: parse config, call exgrpo, report). Deployments: ../prefect.yaml."""

from __future__ import annotations

from exgrpo.cluster import ClusterError
from exgrpo.config import ConfigError
from exgrpo.tracking import TrackingError


def user_errors() -> tuple[type[BaseException], ...]:
    """Errors phrased for the user in one line (a config, an unreachable store, a cluster that refuses
    us): a flow run ends Failed with that line, and no traceback in its log."""
    return ConfigError, ClusterError, TrackingError


def one_line(error: BaseException) -> str:
    """``error``'s message on one line: a header ending in ":" runs into the lines under it, the rest
    are joined by "; " (a config error names its source first and each bad field on a line of its
    own: "invalid config (x.yaml): train.lr: Input should be a valid number ...")."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()] or [type(error).__name__]
    out = lines[0]
    for line in lines[1:]:
        out += (" " if out.endswith(":") else "; ") + line
    return out


def failed(error: BaseException):
    """The Failed state of a flow run stopped by ``error``, with its whole message on one line; a direct
    caller of the flow gets ``error`` raised."""
    from prefect.states import Failed

    return Failed(message=one_line(error), data=error)
