"""Prefect flows (thin: parse config, call exgrpo, report). Deployments: ../prefect.yaml."""

from __future__ import annotations

from exgrpo.cluster import ClusterError
from exgrpo.config import ConfigError
from exgrpo.tracking import TrackingError


def user_errors() -> tuple[type[BaseException], ...]:
    """Errors phrased for the user in one line (a config, an unreachable store, a cluster that refuses
    us): a flow run ends Failed with that line, and no traceback in its log."""
    return ConfigError, ClusterError, TrackingError


def failed(error: BaseException):
    """The Failed state of a flow run stopped by ``error``; a direct caller of the flow gets ``error`` raised."""
    from prefect.states import Failed

    return Failed(message=str(error).splitlines()[0], data=error)
