"""Which MLflow run a run directory is, so that one (config, seed) run is one MLflow run.

As soon as its MLflow run exists, :func:`exgrpo.tracking.tracked_train` writes ``mlflow_run.json``
into the run directory (a comparison's parent run: into ``<output_dir>/<name>/``): the store, the run
id, and the process recording it (host, pid and the process's start time, so a reused pid is not
taken for it). Then

* a resume continues that MLflow run (MLflow resumes a run by id) instead of making a second run
  of the same name (:func:`continuable`);
* a run MLflow still shows RUNNING whose process is gone (SIGKILL, out of memory, a reboot) is ended
  KILLED by the next command that touches the directory, and by ``exgrpo sync``
  (:func:`end_if_orphaned`). A run whose record waits for ``exgrpo sync`` (the store was down at its
  end) is left to it. A process on another host cannot be checked from here: its run is left alone.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Collection
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from exgrpo.atomic import write_text_atomic
from exgrpo.paths import process_alive, process_started
from exgrpo.runs import RECORD_FILE



@dataclass(frozen=True)
class RunRecord:
    tracking_uri: str
    run_id: str
    host: str
    pid: int
    started: float
    """The recording process's start time (seconds since the epoch)."""


def write_record(where: str | Path, tracking_uri: str, run_id: str) -> RunRecord:
    """Record that this process records ``where``'s run as MLflow run ``run_id`` of ``tracking_uri``."""
    record = RunRecord(tracking_uri, run_id, socket.gethostname(), os.getpid(), process_started(os.getpid()) or 0.0)
    Path(where).mkdir(parents=True, exist_ok=True)
    # the store's URI as given, a password included (a resume and `exgrpo sync` reach the store with it):
    # its owner's alone
    write_text_atomic(Path(where) / RECORD_FILE, json.dumps(asdict(record)), mode=0o600)
    return record


def read_record(where: str | Path) -> RunRecord | None:
    """The record in ``where``, or None (none, or unreadable)."""
    try:
        return RunRecord(**json.loads((Path(where) / RECORD_FILE).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def process_gone(record: RunRecord) -> bool | None:
    """Whether the process that recorded ``record`` has ended; None when it ran on another host."""
    if record.host != socket.gethostname():
        return None
    return not process_alive(record.pid, record.started)


def _last_activity_ms(where: Path) -> int | None:
    """When the run last wrote its metrics (or its record): the end time of a killed run."""
    for name in ("metrics.jsonl", RECORD_FILE):
        if (where / name).is_file():
            return int((where / name).stat().st_mtime * 1000)
    return None


def end_if_orphaned(where: str | Path, client: Any = None) -> str | None:
    """End KILLED the MLflow run recorded in ``where`` if MLflow shows it RUNNING and its process is
    gone; returns the line that says so, else None. ``client``: an MlflowClient of the record's store."""
    from exgrpo.tracking.sync import PENDING_FILE

    where = Path(where)
    record = read_record(where)
    if record is None or (where / PENDING_FILE).is_file() or not process_gone(record):
        return None
    if client is None:
        from exgrpo.tracking.mlflow_tracking import Tracker

        client = Tracker(record.tracking_uri).client
    run = _run(client, record.run_id)
    if run is None or run.info.status != "RUNNING":
        return None
    why = f"its process (pid {record.pid} on {record.host}) ended without ending it"
    client.set_tag(record.run_id, "killed", why)
    client.set_terminated(record.run_id, "KILLED", end_time=_last_activity_ms(where))
    return f"MLflow run {record.run_id} ({run.info.run_name}) was left RUNNING: {why}; marked KILLED"


def continuable(where: str | Path, client: Any, tracking_uri: str, params: dict[str, str] | None = None,
                at_default: Collection[str] = ()) -> str | None:
    """The MLflow run a resume of ``where`` continues: its recorded run, if it is in this store and
    either did not finish, or finished with exactly these ``params`` (a finished run that a resumed
    comparison reuses, or trains on at the same settings, stays one run). A param the finished run
    lacks counts as equal when its key is in ``at_default`` (the field holds its default: the run was
    recorded before the field existed, and a new field's default is the behaviour before it). A finished
    run whose params differ (e.g. a larger budget) gets a new run that holds its whole history (MLflow
    keeps a param's first value); None then, and when there is no such run."""
    record = read_record(where)
    if record is None or record.tracking_uri != tracking_uri:
        return None
    run = _run(client, record.run_id)
    if run is None or run.info.lifecycle_stage == "deleted":
        return None
    if run.info.status == "FINISHED" and (params is None or any(
            run.data.params.get(k) != str(v) and not (k not in run.data.params and k in at_default)
            for k, v in params.items())):
        return None
    return record.run_id


def finished_before(client: Any, run_id: str) -> bool:
    """Whether MLflow run ``run_id`` had ended FINISHED (a reused run: nothing of its record to redo)."""
    run = _run(client, run_id)
    return run is not None and run.info.status == "FINISHED"


def _run(client: Any, run_id: str) -> Any:
    """The MLflow run ``run_id``, or None if the store has no such run (deleted for good)."""
    from mlflow.exceptions import MlflowException

    try:
        return client.get_run(run_id)
    except MlflowException as e:
        if e.error_code == "RESOURCE_DOES_NOT_EXIST":
            return None
        raise


def recorded_runs(root: str | Path) -> list[Path]:
    """Directories under ``root`` (or ``root`` itself) that hold a run record."""
    root = Path(root)
    if (root / RECORD_FILE).is_file():
        return [root]
    return sorted(p.parent for p in root.rglob(RECORD_FILE))
