"""Live MLflow metrics from inside a veRL job.

The caller (the Prefect train flow, through :func:`exgrpo.tracking.tracked_train`) creates the MLflow
run first and hands its id to the job as ``MLFLOW_RUN_ID`` with ``MLFLOW_TRACKING_URI``. In the job,
veRL's file logger writes one JSON line per step, unbuffered, to ``VERL_FILE_LOGGER_PATH``;
:class:`LiveMetrics` tails that file in the same process and writes each step to the run through
:class:`~exgrpo.tracking.step_logger.MLflowStepLogger` (batched, buffered while the server is down),
under the names of METRICS.md: the same conversion, :func:`verl_row`, that builds ``metrics.jsonl``
after the run. veRL's own MLflow logger is not used: it starts a run of its own, names metrics its
own way, and a failing write there goes unnoticed.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

RUN_ID_ENV = "MLFLOW_RUN_ID"
TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"
FILE_LOGGER_ENV = "VERL_FILE_LOGGER_PATH"


def verl_row(record: dict[str, Any]) -> tuple[int, dict[str, float]]:
    """One line of veRL's file logger ``{"step": n, "data": {...}}`` -> (step, our metric row):
    numbers only, names MLflow-safe, and veRL's validation mean as ``val/accuracy``."""
    from exgrpo.tracking.mlflow_tracking import sanitize_metric_name

    step = int(record["step"])
    row: dict[str, float] = {"step": float(step)}
    for key, value in record["data"].items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            row[sanitize_metric_name(key)] = float(value)
            if key.startswith("val-core/") and "/mean@" in key:
                row["val/accuracy"] = float(value)
    return step, row


class LiveMetrics:
    """Tail ``path`` (veRL's metric file) on a thread; every complete line goes to MLflow run ``run_id``."""

    def __init__(self, path: str | Path, tracking_uri: str, run_id: str, poll_seconds: float = 1.0) -> None:
        import mlflow

        from exgrpo.tracking.step_logger import MLflowStepLogger

        self.path, self.poll_seconds = Path(path), poll_seconds
        self.logger = MLflowStepLogger(mlflow.MlflowClient(tracking_uri), run_id, flush_every=1, background=False,
                                       warn=lambda msg: print(f"exgrpo live metrics: {msg}", flush=True))  # its own thread
        self._offset = 0
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
        """Log every complete line written since the last poll; returns how many."""
        if not self.path.is_file():
            return 0
        with self.path.open("rb") as f:
            f.seek(self._offset)
            chunk = f.read()
        end = chunk.rfind(b"\n") + 1  # a line being written stays for the next poll
        lines = chunk[:end].splitlines()
        self._offset += end
        for line in lines:
            try:
                step, row = verl_row(json.loads(line))
            except (ValueError, KeyError, TypeError):
                continue
            self.logger(step, row)
        return len(lines)

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
