"""Live MLflow metrics from inside a veRL job.

The caller (the Prefect train flow, through :func:`exgrpo.launch.tracked_train`) creates the MLflow
run first and hands its id to the job as ``MLFLOW_RUN_ID`` with ``MLFLOW_TRACKING_URI``. In the job,
veRL's file logger writes one JSON line per step, unbuffered, to ``VERL_FILE_LOGGER_PATH``;
:class:`LiveMetrics` tails that file in the same process and writes each step to the run through
:class:`~exgrpo.tracking.step_logger.MLflowStepLogger` (batched, buffered while the server is down),
under the names of METRICS.md: the same conversion, :func:`verl_row`, that builds ``metrics.jsonl``
after the run. veRL's own MLflow logger is not used: it starts a run of its own, names metrics its
own way, and a failing write there goes unnoticed.

The caller reads the same file while the job runs (:class:`StepFeed`): its ``train(...,
callbacks=...)`` callbacks (live progress, a sweep's pruning) see each step as it is written, as on the
native backend; a callback that raises (Optuna's ``TrialPruned``) stops the job.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from exgrpo.tracking.mlflow_tracking import sanitize_metric_name
from exgrpo.tracking.step_logger import MLflowStepLogger

RUN_ID_ENV = "MLFLOW_RUN_ID"
TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"
FILE_LOGGER_ENV = "VERL_FILE_LOGGER_PATH"
LOOPBACK_ENV = "EXGRPO_BIND_LOOPBACK"
"""Set (to 1) for a run on a private local Ray: its rollout servers bind 127.0.0.1 (platform/patches.py)."""


SHARED_NAMES: dict[str, str] = {
    "timing_s/step": "time/step_seconds",
    "timing_s/gen": "time/rollout_seconds",
    "timing_s/reward": "time/reward_seconds",
}
"""veRL's names of quantities the native trainer measures too -> the one name both backends log
(METRICS.md): the wall time of a step, of its rollout and of its grading."""


def verl_row(record: dict[str, Any]) -> tuple[int, dict[str, float]]:
    """One line of veRL's file logger ``{"step": n, "data": {...}}`` -> (step, our metric row):
    numbers only, names MLflow-safe, a quantity the native trainer logs too under its name
    (:data:`SHARED_NAMES`), and veRL's validation mean as ``val/accuracy``."""
    step = int(record["step"])
    row: dict[str, float] = {"step": float(step)}
    for key, value in record["data"].items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            row[SHARED_NAMES.get(key) or sanitize_metric_name(key)] = float(value)
            if key.startswith("val-core/") and "/mean@" in key:
                row["val/accuracy"] = float(value)
    return step, row


class MetricTail:
    """The steps appended to veRL's metric file since the last read (complete lines only: a line being
    written waits for the next read; a line that is not a step is skipped)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._offset = 0

    def read(self) -> list[tuple[int, dict[str, float]]]:
        """(step, row) of every complete line written since the last call, in file order."""
        if not self.path.is_file():  # veRL has not opened it yet
            return []
        with self.path.open("rb") as f:
            f.seek(self._offset)
            chunk = f.read()
        end = chunk.rfind(b"\n") + 1
        self._offset += end
        rows = []
        for line in chunk[:end].splitlines():
            try:
                rows.append(verl_row(json.loads(line)))
            except (ValueError, KeyError, TypeError):
                continue
        return rows


class StepFeed:
    """The caller's callbacks, fed each step of a running job from its metric file.

    The runner calls :meth:`poll` from its wait loop; each step reaches every callback once, in order.
    The first exception a callback raises (e.g. ``optuna.TrialPruned``) is kept in :attr:`error`, no
    step is delivered after it, and the runner stops the job; ``train`` then raises it."""

    def __init__(self, path: str | Path, callbacks: list[Any]) -> None:
        self.tail, self.callbacks = MetricTail(path), list(callbacks)
        self.error: BaseException | None = None
        self.steps = 0
        """Steps delivered so far."""

    def poll(self) -> bool:
        """Deliver the steps written since the last poll; True while the job may go on."""
        if self.error is None:
            for step, row in self.tail.read():
                try:
                    for cb in self.callbacks:
                        cb(step, row)
                except BaseException as e:  # noqa: BLE001 - handed to the caller once the job is stopped
                    self.error = e
                    break
                self.steps += 1
        return self.error is None


class LiveMetrics:
    """Tail ``path`` (veRL's metric file) on a thread; every complete line goes to MLflow run ``run_id``."""

    def __init__(self, path: str | Path, tracking_uri: str, run_id: str, poll_seconds: float = 1.0) -> None:
        import mlflow

        self.tail, self.poll_seconds = MetricTail(path), poll_seconds
        self.logger = MLflowStepLogger(mlflow.MlflowClient(tracking_uri), run_id, flush_every=1, background=False,
                                       warn=lambda msg: print(f"exgrpo live metrics: {msg}", flush=True))  # its own thread
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="exgrpo-live-metrics", daemon=True)

    @classmethod
    def from_env(cls) -> LiveMetrics | None:
        """The tailer the job's environment asks for, or None when no MLflow run was handed over."""
        run_id, uri, path = (os.environ.get(k) for k in (RUN_ID_ENV, TRACKING_URI_ENV, FILE_LOGGER_ENV))
        return cls(path, uri, run_id) if run_id and uri and path else None

    def start(self) -> LiveMetrics:
        self._thread.start()
        return self

    def poll(self) -> int:
        """Log every complete line written since the last poll; returns how many steps."""
        rows = self.tail.read()
        for step, row in rows:
            self.logger(step, row)
        return len(rows)

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            self.poll()
            self.logger.flush()

    def stop(self) -> bool:
        """Log what is left and flush; True when everything reached MLflow."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        self.poll()
        return self.logger.flush(force=True)
