"""MLflow tracking of exgrpo runs (see :mod:`exgrpo.tracking.mlflow_tracking` and METRICS.md)."""

from exgrpo.tracking.mlflow_tracking import (
    MLflowStepLogger,
    TrackedRun,
    Tracker,
    TrackingError,
    algo_tag,
    artifact_root,
    check_reachable,
    curated_params,
    default_tracking_uri,
    experiment_url,
    project_root,
    resolve_tracking_uri,
    run_tags,
    run_url,
    sanitize_metric_name,
    tracked_train,
)
from exgrpo.tracking.sync import pending_runs, sync_run

__all__ = [
    "MLflowStepLogger", "TrackedRun", "Tracker", "TrackingError", "algo_tag", "artifact_root",
    "check_reachable", "curated_params", "default_tracking_uri", "experiment_url", "project_root", "resolve_tracking_uri",
    "pending_runs", "run_tags", "run_url", "sanitize_metric_name", "sync_run", "tracked_train",
]
