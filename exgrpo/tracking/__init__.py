"""MLflow tracking of exgrpo runs (see :mod:`exgrpo.tracking.mlflow_tracking` and METRICS.md): it records
runs, params, metrics and artifacts, and completes what an outage left out; it never starts training
(:mod:`exgrpo.launch` does)."""

from exgrpo.tracking.mlflow_tracking import (
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
)
from exgrpo.tracking.step_logger import MLflowStepLogger
from exgrpo.tracking.sync import pending_runs, sync_run

__all__ = [
    "MLflowStepLogger", "TrackedRun", "Tracker", "TrackingError", "algo_tag", "artifact_root",
    "check_reachable", "curated_params", "default_tracking_uri", "experiment_url", "project_root", "resolve_tracking_uri",
    "pending_runs", "run_tags", "run_url", "sanitize_metric_name", "sync_run",
]
