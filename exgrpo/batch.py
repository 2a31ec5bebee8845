"""What a batch of runs under one MLflow parent run (a comparison's (arm, seed) runs, a sweep's
trials) does around its slot loop (:func:`exgrpo.slots.run_as_slots_free`), written once:

- :func:`start_on_ray`: Ray started or joined, the parent run told where (its ``ray`` tag) or why not
  (its ``error`` tag; the caller ends it FAILED), and the live progress board its runs report to;
- :func:`finish_parent`: the batch's summary on the parent run, which ends with its status; when MLflow
  is unreachable at that moment, the summary waits on disk beside a marker that ``exgrpo sync``
  delivers (:mod:`exgrpo.tracking.sync`), and nothing is lost.
"""

from __future__ import annotations

import contextlib
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exgrpo.atomic import write_text_atomic
from exgrpo.cluster import announce, ensure_ray
from exgrpo.errors import one_line
from exgrpo.live_progress import ProgressBoard
from exgrpo.tracking.mlflow_tracking import is_reachable
from exgrpo.tracking.sync import PENDING_FILE, log_once, write_pending


def start_on_ray(address: str | None, client: Any, parent: str) -> Any:
    """Ray for the batch whose MLflow parent run is ``parent`` (``client`` an MlflowClient): the cluster
    at ``address``, else a private local one; returns the progress board (a Ray actor). A Ray that
    cannot be joined or started is the parent's ``error`` tag (when MLflow takes it), then raised
    (:class:`exgrpo.cluster.ClusterError`, one line): the caller ends the parent FAILED."""
    import ray

    try:
        ensure_ray(address)
    except Exception as e:
        with contextlib.suppress(Exception):  # MLflow gone too: Ray's error is the one the user must see
            client.set_tag(parent, "error", one_line(e, 5000))
        raise
    announce(address, client, parent)
    return ray.remote(num_cpus=0)(ProgressBoard).remote()


@dataclass
class ParentSummary:
    """What a batch's parent run holds once the batch is over."""

    status: str
    """FINISHED, or FAILED when some run failed."""
    metrics: dict[str, float] = field(default_factory=dict)
    step: int = 0
    """The step the metrics are logged at."""
    tags: dict[str, str] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)
    """Artifacts written from text: their path on the run (``sweep/trials.csv``) -> the text."""
    files: list[str] = field(default_factory=list)
    """Artifacts that are files already (a comparison's figures), logged at the run's root."""


def finish_parent(tracker: Any, parent: str, summary: ParentSummary, where: Path, what: str) -> str | None:
    """Log ``summary`` on ``parent`` and end it with ``summary.status``; None when done. When MLflow does not
    take it (unreachable, or refusing a value), the summary is written to ``where`` with a marker that
    ``exgrpo sync <where>`` delivers (it also ends the parent), a note naming that command and saying
    which of the two it was is printed, and the error's line is returned. A value the parent holds
    already at ``summary.step`` (the same command run again) is not logged twice.
    ``what`` names the batch in the note ("comparison", "study")."""
    try:
        if summary.metrics:
            log_once(tracker.client, parent, summary.metrics, summary.step)
        for name, text in summary.texts.items():
            tracker.client.log_text(parent, text, name)
        for key, value in summary.tags.items():
            tracker.client.set_tag(parent, key, value)
        for path in summary.files:
            tracker.client.log_artifact(parent, path)
        tracker.end_run(parent, summary.status)
    except Exception as e:  # noqa: BLE001 - whatever refused it, the summary waits on disk for `exgrpo sync`
        error = one_line(e, 160)
        _leave_for_sync(tracker.uri, parent, summary, Path(where))
        if is_reachable(tracker.uri):  # not an outage: say what failed, not that MLflow went away
            print(f"note: MLflow did not take the {what}'s summary ({error}); it is in {where}; `exgrpo sync {where}` "
                  f"puts it on parent run {parent}", flush=True)
        else:
            print(f"note: MLflow is unreachable ({error}); the {what}'s summary is in {where}; `exgrpo sync {where}` "
                  f"puts it on parent run {parent} once MLflow is back", flush=True)
        return error
    (Path(where) / PENDING_FILE).unlink(missing_ok=True)  # an earlier outage's marker: delivered now
    return None


def _leave_for_sync(uri: str, parent: str, summary: ParentSummary, where: Path) -> None:
    """``summary`` in ``where``: each text artifact a file, the figures beside them, and the marker."""
    where.mkdir(parents=True, exist_ok=True)
    artifacts = {}
    for name, text in summary.texts.items():
        path = Path(name)
        write_text_atomic(where / path.name, text)
        artifacts[path.name] = str(path.parent) if str(path.parent) != "." else ""
    for f in summary.files:
        if Path(f).resolve().parent != where.resolve():
            shutil.copy2(f, where / Path(f).name)
        artifacts[Path(f).name] = ""
    write_pending(where, uri, parent, summary.status, summary.metrics, summary.tags.get("error"),
                  artifacts=artifacts, tags={k: v for k, v in summary.tags.items() if k != "error"}, step=summary.step)
