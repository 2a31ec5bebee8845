"""Completing MLflow runs that the tracking server missed: ``exgrpo sync``.

When the server is unreachable at the end of a run (it died mid-run and has not come back), the run
cannot be ended remotely. :func:`write_pending` then leaves ``mlflow_pending.json`` in the run
directory: the run id, the store, the final status and metrics. A run that could not even be
created (the store was down when it started) has no id yet; its marker carries what creates it
(experiment, name, parent, tags, params, config), and :func:`sync_run` creates it first. :func:`sync_run` replays what
MLflow lacks from ``metrics.jsonl`` (the local truth: every (metric, step) past the last step MLflow
has for it), logs the final metrics and the metrics file, records a finished run's end as any
finished run records it (the marker's ``finish``: config, checkpoint and step, handed to the caller's
``finish``, :func:`exgrpo.launch.record_finished`: the checkpoint artifact, the evaluation, the model),
sets the final status (FINISHED, FAILED or KILLED: never RUNNING) and removes the marker. It is
idempotent.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exgrpo.atomic import write_text_atomic
from exgrpo.runs import read_metrics
from exgrpo.tracking.mlflow_tracking import Tracker, sanitize_metric_name

PENDING_FILE = "mlflow_pending.json"
"""The marker of a run that MLflow has not fully received."""


def write_pending(run_dir: str | Path, tracking_uri: str, run_id: str | None, status: str,
                  final_metrics: Mapping[str, float] | None = None, error: str | None = None,
                  artifacts: Mapping[str, str] | None = None, tags: Mapping[str, str] | None = None,
                  create: Mapping[str, Any] | None = None, finish: Mapping[str, Any] | None = None) -> Path:
    """Leave the marker that ``exgrpo sync`` completes; returns its path. ``artifacts``: file name in
    ``run_dir`` -> artifact directory ("" for the root); ``tags``: tags to set; ``create`` (with
    ``run_id`` None): experiment, run_name, parent_run_id, tags, params and config of the run to create;
    ``finish``: what records a finished training run's end (its config, checkpoint, step), for
    :func:`sync_run`'s ``finish``."""
    record = {"tracking_uri": tracking_uri, "run_id": run_id, "status": status,
              "final_metrics": dict(final_metrics or {}), "error": error, "written": time.time(),
              "artifacts": dict(artifacts or {}), "tags": dict(tags or {}), "create": dict(create or {}),
              "finish": dict(finish or {})}
    return write_text_atomic(Path(run_dir) / PENDING_FILE, json.dumps(record, indent=1, default=str))


@dataclass(frozen=True)
class Synced:
    """A run :func:`sync_run` ended."""

    status: str
    run_id: str
    experiment_id: str

    def __str__(self) -> str:
        return f"{self.status} (run {self.run_id})"


def _created(marker: Path, record: dict[str, Any], tracker: Any) -> str:
    """The run's id: the marker's, or a run created now from its ``create`` record (the id is written
    back at once, so a sync that fails later does not create a second run)."""
    if record.get("run_id"):
        return record["run_id"]
    create = record["create"]
    run_id = tracker.start_run(create["experiment"], create["run_name"], create.get("tags"), create.get("parent_run_id"))
    record["run_id"] = run_id
    write_text_atomic(marker, json.dumps(record, indent=1, default=str))
    tracker.log_identity(run_id, create.get("params") or {}, create.get("config") or {})
    return run_id


def pending_runs(root: str | Path) -> list[Path]:
    """Run directories under ``root`` (or ``root`` itself) that hold a marker."""
    root = Path(root)
    if (root / PENDING_FILE).is_file():
        return [root]
    return sorted(p.parent for p in root.rglob(PENDING_FILE))


def _rows(metrics_file: Path) -> list[dict[str, Any]]:
    """Every record of ``metrics.jsonl`` (a torn last line dropped), as resume reads it."""
    return read_metrics(metrics_file, up_to_step=float("inf"), warn=lambda _msg: None)


Finisher = Callable[[Tracker, str, Path, dict[str, Any]], None]
"""``finish(tracker, run_id, run_dir, record)``: record a finished run's end from the marker's ``finish``."""


def sync_run(run_dir: str | Path, finish: Finisher | None = None) -> Synced:
    """Deliver what MLflow lacks of the run in ``run_dir`` (creating the run if it never was) and end it;
    a finished training run's end (checkpoint, evaluation, model) is recorded by ``finish``."""
    from mlflow.entities import Metric

    run_dir = Path(run_dir)
    marker = run_dir / PENDING_FILE
    record = json.loads(marker.read_text())
    tracker = Tracker(record["tracking_uri"])
    client = tracker.client
    run_id = _created(marker, record, tracker)
    rows = _rows(run_dir / "metrics.jsonl")
    keys = sorted({k for r in rows for k, v in r.items() if k != "step" and isinstance(v, (int, float))})
    last: dict[str, int] = {}
    for k in keys:
        steps = [m.step for m in client.get_metric_history(run_id, sanitize_metric_name(k))]
        last[k] = max(steps) if steps else -1
    ts = int(time.time() * 1000)
    missing = [Metric(sanitize_metric_name(k), float(r[k]), ts, int(r["step"]))
               for r in rows for k in keys if k in r and isinstance(r[k], (int, float)) and int(r["step"]) > last[k]]
    step = int(max((r.get("step", 0) for r in rows), default=0))
    missing += [Metric(sanitize_metric_name(k), float(v), ts, step) for k, v in record["final_metrics"].items()]
    for i in range(0, len(missing), 1000):
        client.log_batch(run_id, metrics=missing[i:i + 1000])
    if (run_dir / "metrics.jsonl").is_file():
        client.log_artifact(run_id, str(run_dir / "metrics.jsonl"), "metrics")
    for name, artifact_dir in record.get("artifacts", {}).items():
        client.log_artifact(run_id, str(run_dir / name), artifact_dir or None)
    for key, value in record.get("tags", {}).items():
        client.set_tag(run_id, key, value)
    if record.get("error"):
        client.set_tag(run_id, "error", record["error"][:5000])
    if record.get("finish") and finish is not None:
        finish(tracker, run_id, run_dir, record["finish"])
        record["finish"] = {}  # recorded: a sync that fails after this does not log the model twice
        write_text_atomic(marker, json.dumps(record, indent=1, default=str))
    client.set_tag(run_id, "synced_after_outage", "true")
    experiment_id = client.get_run(run_id).info.experiment_id
    client.set_terminated(run_id, record["status"])
    marker.unlink()
    return Synced(record["status"], run_id, experiment_id)
