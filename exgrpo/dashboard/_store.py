"""Reading the MLflow store: runs by id, the children of a parent run, metric histories."""

from __future__ import annotations

from typing import Any

from exgrpo.errors import redact_uri
from exgrpo.sqlite_wal import sqlite_file
from exgrpo.tracking.mlflow_tracking import TrackingError, check_reachable, resolve_tracking_uri, run_url, search_all


class DashboardError(RuntimeError):
    """A report cannot be built (unknown run, not a compare/sweep parent, unreadable store...)."""


def open_client(tracking_uri: str | None = None) -> tuple[Any, str]:
    """An :class:`mlflow.MlflowClient` on the resolved store; a sqlite store must already exist
    (reading must not create an empty database)."""
    uri = resolve_tracking_uri(tracking_uri)
    db = sqlite_file(uri)
    if db is not None and not db.is_file():
        raise DashboardError(f"no MLflow store at {db} (tracking URI {uri}); pass --tracking-uri or set "
                             "MLFLOW_TRACKING_URI")
    try:
        check_reachable(uri)
    except TrackingError as e:
        raise DashboardError(str(e)) from None
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri), uri


def get_run(client: Any, run_id: str) -> Any:
    from mlflow.exceptions import MlflowException

    try:
        return client.get_run(run_id)
    except MlflowException as e:
        first = e.message.splitlines()[0] if e.message else ""
        raise DashboardError(f"run {run_id!r} not found in {redact_uri(client.tracking_uri)}: {first}") from None


def children(client: Any, parent: Any) -> list[Any]:
    """Runs of the parent's experiment tagged ``mlflow.parentRunId = <parent>``."""
    return search_all(client, [parent.info.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")


def latest_parent(client: Any, experiment: str, kind: str) -> Any:
    """The most recently started run of experiment ``experiment`` tagged ``kind=<kind>``."""
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise DashboardError(f"no MLflow experiment named {experiment!r} in {redact_uri(client.tracking_uri)}")
    runs = client.search_runs([exp.experiment_id], filter_string=f"tags.kind = '{kind}'",
                              order_by=["attributes.start_time DESC"], max_results=1)
    if not runs:
        raise DashboardError(f"experiment {experiment!r} has no run tagged kind={kind}")
    return runs[0]


def history(client: Any, run_id: str, key: str) -> dict[int, float]:
    """step -> value of one metric (the last logged value wins when a step was logged twice, e.g.
    after a resume)."""
    out: dict[int, float] = {}
    for m in sorted(client.get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp)):
        out[int(m.step)] = float(m.value)
    return out


def run_link(run: Any, tracking_uri: str) -> str:
    return run_url(run.info.experiment_id, run.info.run_id, tracking_uri)
