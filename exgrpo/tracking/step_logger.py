"""The per-step MLflow writer: batched, and training never waits on a tracking server that is down.

Metrics of every ``every``-th step (``train.log_every_steps``; evaluation steps always) go to
MLflow with ``log_batch`` every ``flush_every`` logged steps or once ``flush_seconds`` have passed
since the last write, whichever comes first: a fast run writes few large batches, a slow one (an LM
step of seconds) still shows each step within seconds. (MLflow's SQL store costs ~0.1 ms per metric
value in large batches here and ~0.2 ms in one-step batches, plus a per-call cost, so a 50-metric
step costs 5-10 ms to log; writing from a helper thread was measured slower for small steps: the
two threads contend for the GIL.) When
a write fails (the server died, the network dropped) the metrics stay in a bounded buffer, one
warning says so, and training goes on; the next write is tried ``retry_seconds`` later, and the
buffer is delivered when the server answers again. ``metrics.jsonl`` in the run directory is the
local truth either way: whatever never reached MLflow is replayed by ``exgrpo sync``
(:mod:`exgrpo.tracking.sync`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

logger = logging.getLogger(__name__)

FLUSH_SECONDS = 5.0
"""Longest wait, in seconds of training, before buffered step metrics are written."""
RETRY_SECONDS = 30.0
"""Seconds between write attempts while the server is unreachable."""
MAX_BUFFERED = 500_000
"""Most metric values held while the server is unreachable; older ones are dropped (metrics.jsonl keeps them)."""


class MLflowStepLogger:
    """A ``train(..., callbacks=[...])`` callback that writes each step's metrics (names sanitised)."""

    def __init__(self, client: Any, run_id: str, flush_every: int = 50, retry_seconds: float = RETRY_SECONDS,
                 max_buffered: int = MAX_BUFFERED, warn: Callable[[str], None] = logger.warning,
                 every: int = 1, flush_seconds: float | None = None) -> None:
        self.client, self.run_id, self.flush_every = client, run_id, max(1, flush_every)
        self.flush_seconds = FLUSH_SECONDS if flush_seconds is None else flush_seconds
        self.every = max(1, every)  # steps between logged steps (evaluation steps are always logged)
        self.retry_seconds, self.max_buffered, self.warn = retry_seconds, max_buffered, warn
        self._buf: list[Any] = []
        self._names: dict[str, str] = {}
        self._last_attempt = -float("inf")
        self._last_flush = time.monotonic()
        self.logged_steps = 0
        self.last_logged: list[Any] = []
        """The ``Metric`` values of the last logged step (as written, timestamps included)."""
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

        evaluated = any(k.startswith("val/") for k in metrics)
        if int(step) % self.every and not evaluated:
            return
        ts = int(time.time() * 1000)
        self.last_logged = [Metric(self._name(k), float(v), ts, int(step)) for k, v in metrics.items()
                            if k != "step" and isinstance(v, (int, float))]
        self._buf.extend(self.last_logged)
        self.logged_steps += 1
        if self.logged_steps % self.flush_every == 0 or time.monotonic() - self._last_flush >= self.flush_seconds:
            self.flush()

    def flush(self, force: bool = False) -> bool:
        """Write the buffer; True when everything buffered has reached MLflow. While the server is
        unreachable a write is tried at most every ``retry_seconds`` (always with ``force``)."""
        if not self._buf:
            return True
        now = time.monotonic()
        if self.offline and not force and now - self._last_attempt < self.retry_seconds:
            return False
        self._last_attempt = self._last_flush = now
        try:
            while self._buf:
                self.client.log_batch(self.run_id, metrics=self._buf[:1000])
                del self._buf[:1000]  # only what was delivered
        except Exception as e:  # noqa: BLE001 - any failure of the store: keep the metrics, keep training
            if not self.offline:
                self.warn(f"MLflow is unreachable ({type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}); "
                          f"training goes on, metrics are buffered and kept in metrics.jsonl")
            self.offline = True
            if len(self._buf) > self.max_buffered:
                extra = len(self._buf) - self.max_buffered
                del self._buf[:extra]
                self.dropped += extra
            return False
        if self.offline:
            self.warn("MLflow is reachable again; buffered metrics delivered")
            self.offline = False
        return True
