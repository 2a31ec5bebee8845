"""Completing MLflow runs that the tracking server missed: ``exgrpo sync``.

When the server is unreachable at the end of a run (it died mid-run and has not come back), the run
cannot be ended remotely. :func:`write_pending` then leaves ``mlflow_pending.json`` in the run
directory: the run id, the store, the final status and metrics. A run that could not even be
created (the store was down when it started) has no id yet; its marker carries what creates it
(experiment, name, parent, tags, params, config), and :func:`sync_run` creates it first. :func:`sync_run` replays what
MLflow lacks from ``metrics.jsonl`` (the local truth: every (metric, step) past the last step MLflow
has for it), logs the final metrics (at the marker's step: a batch's summary names its own) and the
metrics file, records a finished run's end as any finished run records it (the marker's ``finish``:
config, checkpoint and step, handed to the caller's ``finish``, :func:`exgrpo.launch.record_finished`:
the checkpoint artifact, the evaluation, the model), sets the final status (FINISHED, FAILED or KILLED:
never RUNNING) and removes the marker. It is idempotent: a value MLflow holds already at its step is
not logged again. What MLflow refuses while it is up (a tag key it does not accept) would be refused
by every sync: it is kept in ``mlflow_refused.json`` beside the marker and named, and the run ends all
the same.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exgrpo.atomic import write_text_atomic
from exgrpo.errors import one_line
from exgrpo.runs import read_metrics
from exgrpo.tracking.mlflow_tracking import Tracker, is_reachable, sanitize_metric_name

PENDING_FILE = "mlflow_pending.json"
"""The marker of a run that MLflow has not fully received."""
REFUSED_FILE = "mlflow_refused.json"
"""What ``exgrpo sync`` could not deliver because MLflow, up, refused it: each value and MLflow's answer."""


def write_pending(run_dir: str | Path, tracking_uri: str, run_id: str | None, status: str | None,
                  final_metrics: Mapping[str, float] | None = None, error: str | None = None,
                  artifacts: Mapping[str, str] | None = None, tags: Mapping[str, str] | None = None,
                  create: Mapping[str, Any] | None = None, finish: Mapping[str, Any] | None = None,
                  step: int | None = None, evaluations: list[Mapping[str, Any]] | None = None) -> Path:
    """Leave the marker that ``exgrpo sync`` completes; returns its path. ``artifacts``: file name in
    ``run_dir`` -> artifact directory ("" for the root); ``tags``: tags to set; ``create`` (with
    ``run_id`` None): experiment, run_name, parent_run_id, tags, params and config of the run to create;
    ``finish``: what records a finished training run's end (its config, checkpoint, step), for
    :func:`sync_run`'s ``finish``; ``step``: the step of ``final_metrics`` (None: the last step of the
    run directory's ``metrics.jsonl``); ``evaluations``: ``exgrpo eval``'s scores to log
    (:func:`exgrpo.tracking.eval_record.pending_evaluation`); ``status`` None: the run's status is left as
    it is (an evaluation of a run that ended, or still trains)."""
    record = {"tracking_uri": tracking_uri, "run_id": run_id, "status": status,
              "final_metrics": dict(final_metrics or {}), "error": error, "written": time.time(),
              "artifacts": dict(artifacts or {}), "tags": dict(tags or {}), "create": dict(create or {}),
              "finish": dict(finish or {}), "step": step, "evaluations": list(evaluations or [])}
    # it holds the store's URI as given, a password included (sync reaches the store with it): the owner's alone
    return write_text_atomic(Path(run_dir) / PENDING_FILE, json.dumps(record, indent=1, default=str), mode=0o600)


@dataclass(frozen=True)
class Synced:
    """A run :func:`sync_run` ended."""

    status: str
    run_id: str
    experiment_id: str
    refused: str | None = None
    """What MLflow refused and where it is kept, as a clause; None when it took everything."""

    def __str__(self) -> str:
        return f"{self.status} (run {self.run_id})" + (f"; {self.refused}" if self.refused else "")


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def unlogged(client: Any, run_id: str, metrics: list[Any]) -> list[Any]:
    """``metrics`` (``mlflow.entities.Metric``) less those run ``run_id`` holds already (same key, step
    and value): a delivery made again (a second sync, a summary written again) logs nothing twice."""
    held: dict[str, list[tuple[int, float]]] = {}
    out = []
    for m in metrics:
        if m.key not in held:
            held[m.key] = [(h.step, h.value) for h in client.get_metric_history(run_id, m.key)]
        if not any(step == m.step and _same(value, m.value) for step, value in held[m.key]):
            out.append(m)
    return out


def log_once(client: Any, run_id: str, metrics: Mapping[str, float], step: int) -> None:
    """Log ``metrics`` at ``step`` on run ``run_id``, each value that the run does not hold already there."""
    from mlflow.entities import Metric

    ts = int(time.time() * 1000)
    items = unlogged(client, run_id, [Metric(sanitize_metric_name(k), float(v), ts, int(step))
                                      for k, v in metrics.items() if isinstance(v, (int, float))])
    for i in range(0, len(items), 1000):
        client.log_batch(run_id, metrics=items[i:i + 1000])


REFUSED_CODES = ("INVALID_PARAMETER_VALUE", "RESOURCE_ALREADY_EXISTS", "BAD_REQUEST")
"""MLflow's answers to a request it will never take (a key or value it does not accept)."""


def is_refusal(error: BaseException) -> bool:
    """Whether ``error`` rejects the request itself, so every later sync would meet it again: one of
    :data:`REFUSED_CODES` (but not a database error that passes, such as a closed connection, which the
    SQL store reports as a bad request too), an HTTP 400 or 413 from the artifact proxy, or a file the
    marker names and the disk no longer holds. Anything else (an authentication or server error, a
    dropped connection) may pass, and is tried again by the next sync."""
    import requests
    from mlflow.exceptions import MlflowException

    if isinstance(error, MlflowException):
        if error.error_code not in REFUSED_CODES:
            return False
        cause = error.__cause__
        if cause is not None and type(cause).__module__.startswith("sqlalchemy"):
            import sqlalchemy.exc

            return isinstance(cause, (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.DataError))
        return True
    if isinstance(error, requests.HTTPError):
        return error.response is not None and error.response.status_code in (400, 413)
    return isinstance(error, FileNotFoundError)


class _Delivery:
    """Each part of a marker delivered on its own: one that MLflow refuses while it is up (:func:`is_refusal`)
    is noted (it would be refused again by every sync) and the rest goes on; any other failure is raised,
    and the marker stays for the next sync."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.refused: list[dict[str, Any]] = []

    def __call__(self, kind: str, key: str, value: Any, send: Callable[[], None]) -> None:
        try:
            send()
        except Exception as e:
            if not is_refusal(e) or not is_reachable(self.uri):
                raise
            self.refused.append({"kind": kind, "key": key, "value": value, "error": one_line(e, 500)})

    def metrics(self, client: Any, run_id: str, metrics: list[Any]) -> None:
        """``metrics`` in batches; a refused batch is sent value by value, to keep only the refused ones."""
        for i in range(0, len(metrics), 1000):
            batch = metrics[i:i + 1000]
            try:
                client.log_batch(run_id, metrics=batch)
            except Exception as e:
                if not is_refusal(e) or not is_reachable(self.uri):
                    raise
                for m in batch:
                    self("metric", m.key, {"step": m.step, "value": m.value},
                         lambda m=m: client.log_batch(run_id, metrics=[m]))

    def keep(self, run_dir: Path) -> str | None:
        """The refused values written to :data:`REFUSED_FILE` in ``run_dir``; the clause that names them."""
        if not self.refused:
            return None
        path = write_text_atomic(run_dir / REFUSED_FILE, json.dumps(self.refused, indent=1, default=str))
        names = ", ".join(f"{r['kind']} {r['key']!r}" for r in self.refused[:5])
        more = f" and {len(self.refused) - 5} more" if len(self.refused) > 5 else ""
        return f"MLflow refused {names}{more} ({self.refused[0]['error']}); kept in {path}"


def _created(marker: Path, record: dict[str, Any], tracker: Any) -> str:
    """The run's id: the marker's, or a run created now from its ``create`` record (the id is written
    back at once, so a sync that fails later does not create a second run)."""
    if record.get("run_id"):
        return record["run_id"]
    create = record["create"]
    run_id = tracker.start_run(create["experiment"], create["run_name"], create.get("tags"), create.get("parent_run_id"))
    record["run_id"] = run_id
    write_text_atomic(marker, json.dumps(record, indent=1, default=str), mode=0o600)
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
    deliver = _Delivery(tracker.uri)
    rows = _rows(run_dir / "metrics.jsonl")
    keys = sorted({k for r in rows for k, v in r.items() if k != "step" and isinstance(v, (int, float))})
    last: dict[str, int] = {}
    for k in keys:
        steps = [m.step for m in client.get_metric_history(run_id, sanitize_metric_name(k))]
        last[k] = max(steps) if steps else -1
    ts = int(time.time() * 1000)
    missing = [Metric(sanitize_metric_name(k), float(r[k]), ts, int(r["step"]))
               for r in rows for k in keys if k in r and isinstance(r[k], (int, float)) and int(r["step"]) > last[k]]
    step = record.get("step")
    if step is None:
        step = int(max((r.get("step", 0) for r in rows), default=0))
    missing += unlogged(client, run_id, [Metric(sanitize_metric_name(k), float(v), ts, int(step))
                                         for k, v in record["final_metrics"].items()])
    deliver.metrics(client, run_id, missing)
    if (run_dir / "metrics.jsonl").is_file():
        deliver("artifact", "metrics.jsonl", "metrics",
                lambda: client.log_artifact(run_id, str(run_dir / "metrics.jsonl"), "metrics"))
    for name, artifact_dir in record.get("artifacts", {}).items():
        deliver("artifact", name, artifact_dir,
                lambda name=name, d=artifact_dir: client.log_artifact(run_id, str(run_dir / name), d or None))
    for key, value in record.get("tags", {}).items():
        deliver("tag", key, value, lambda key=key, value=value: client.set_tag(run_id, key, value))
    if record.get("error"):
        deliver("tag", "error", record["error"], lambda: client.set_tag(run_id, "error", record["error"][:5000]))
    if record.get("finish") and finish is not None:
        finish(tracker, run_id, run_dir, record["finish"])
        record["finish"] = {}  # recorded: a sync that fails after this does not log the model twice
        write_text_atomic(marker, json.dumps(record, indent=1, default=str), mode=0o600)
    evaluations = record.get("evaluations") or []
    if evaluations:
        from exgrpo.tracking.eval_record import log_pending

        for entry in evaluations:
            log_pending(tracker, run_id, entry)
        record["evaluations"] = []  # logged: a sync that fails after this does not record them twice
        write_text_atomic(marker, json.dumps(record, indent=1, default=str), mode=0o600)
    refused = deliver.keep(run_dir)
    if record["status"]:
        client.set_tag(run_id, "synced_after_outage", "true")
    if refused:
        client.set_tag(run_id, "sync_refused", refused[:5000])
    experiment_id = client.get_run(run_id).info.experiment_id
    if record["status"]:
        client.set_terminated(run_id, record["status"])
    marker.unlink()
    if evaluations:  # an evaluation's own directory (exgrpo.recorded_eval): nothing else is in it
        with contextlib.suppress(OSError):
            run_dir.rmdir()
    return Synced(record["status"] or "LOGGED", run_id, experiment_id, refused)
