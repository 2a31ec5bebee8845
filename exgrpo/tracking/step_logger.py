"""The per-step MLflow writer: batched, and training never waits on a tracking server that is down.

Metrics go to MLflow with ``log_batch`` every ``flush_every`` steps (and on evaluation steps); with
``background=True`` that write runs in a helper thread, so the training step never waits on the
store (a file-backed store costs ~0.2 ms per metric value: a 40-metric step ~10 ms). ``flush(force=True)``
waits for it and writes the rest. When a write fails (the server died, the network dropped) the metrics stay in a bounded buffer, one
warning says so, and training goes on; the next write is tried ``retry_seconds`` later, and the
buffer is delivered when the server answers again. ``metrics.jsonl`` in the run directory is the
local truth either way: whatever never reached MLflow is replayed by ``exgrpo sync``
(:mod:`exgrpo.tracking.sync`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

logger = logging.getLogger(__name__)

RETRY_SECONDS = 30.0
"""Seconds between write attempts while the server is unreachable."""
MAX_BUFFERED = 500_000
"""Most metric values held while the server is unreachable; older ones are dropped (metrics.jsonl keeps them)."""


class MLflowStepLogger:
    """A ``train(..., callbacks=[...])`` callback that writes each step's metrics (names sanitised)."""

    def __init__(self, client: Any, run_id: str, flush_every: int = 10, retry_seconds: float = RETRY_SECONDS,
                 max_buffered: int = MAX_BUFFERED, warn: Callable[[str], None] = logger.warning,
                 background: bool = False) -> None:
        self.client, self.run_id, self.flush_every = client, run_id, max(1, flush_every)
        self.retry_seconds, self.max_buffered, self.warn = retry_seconds, max_buffered, warn
        self.background = background
        self._buf: list[Any] = []
        self._buf_lock = threading.Lock()  # appends (training thread) vs. delivered-prefix deletes (writer)
        self._write_lock = threading.Lock()  # one writer at a time
        self._writer: threading.Thread | None = None
        self._names: dict[str, str] = {}
        self._last_attempt = -float("inf")
        self.logged_steps = 0
        self.offline = False
        """True while the last write failed."""
        self.dropped = 0
        """Metric values dropped from a full buffer (still in metrics.jsonl)."""

    def _name(self, key: str) -> str:
        from exgrpo.tracking.mlflow_tracking import sanitize_metric_name

        if key not in self._names:
            self._names[key] = sanitize_metric_name(key)
        return self._names[key]

    def __call__(self, step: int, metrics: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        new = [Metric(self._name(k), float(v), ts, int(step)) for k, v in metrics.items()
               if k != "step" and isinstance(v, (int, float))]
        with self._buf_lock:
            self._buf.extend(new)
        self.logged_steps += 1
        if self.logged_steps % self.flush_every == 0 or any(k.startswith("val/") for k in metrics):
            if not self.background:
                self.flush()
            elif self._writer is None or not self._writer.is_alive():  # else the running write picks these up
                self._writer = threading.Thread(target=self._write, name="mlflow-step-logger", daemon=True)
                self._writer.start()

    def flush(self, force: bool = False) -> bool:
        """Write the buffer; True when everything buffered has reached MLflow. While the server is
        unreachable a write is tried at most every ``retry_seconds`` (always with ``force``). Waits
        for a background write first."""
        writer = self._writer
        if writer is not None and writer is not threading.current_thread():
            writer.join()
        return self._write(force)

    def _write(self, force: bool = False) -> bool:
        with self._write_lock:
            return self._write_locked(force)

    def _write_locked(self, force: bool) -> bool:
        if not self._buf:
            return True
        now = time.monotonic()
        if self.offline and not force and now - self._last_attempt < self.retry_seconds:
            return False
        self._last_attempt = now
        try:
            while self._buf:
                with self._buf_lock:
                    chunk = self._buf[:1000]
                self.client.log_batch(self.run_id, metrics=chunk)
                with self._buf_lock:
                    del self._buf[: len(chunk)]  # only what was delivered
        except Exception as e:  # noqa: BLE001 - any failure of the store: keep the metrics, keep training
            if not self.offline:
                self.warn(f"MLflow is unreachable ({type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}); "
                          f"training goes on, metrics are buffered and kept in metrics.jsonl")
            self.offline = True
            with self._buf_lock:
                if len(self._buf) > self.max_buffered:
                    extra = len(self._buf) - self.max_buffered
                    del self._buf[:extra]
                    self.dropped += extra
            return False
        if self.offline:
            self.warn("MLflow is reachable again; buffered metrics delivered")
            self.offline = False
        return True
