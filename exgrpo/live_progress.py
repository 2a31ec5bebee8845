"""Live progress of runs that execute on Ray workers (comparisons, sweeps), shown by the driver.

Each worker's training loop reports through a step callback (:class:`ProgressReporter`) to one small
Ray actor (:class:`ProgressBoard`), at most once a second; the driver polls the board while it waits
for results and prints what changed (:class:`ProgressPrinter`): one line per run (arm, seed,
step/total, the latest batch pass@1 and validation accuracy, an ETA) and the runs done out of the
total. Plain periodic lines, so they read the same in a terminal, a CI log and the Prefect UI's logs.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

PRINT_SECONDS = 10.0
"""Default seconds between two progress lines of the same run (``EXGRPO_PROGRESS_SECONDS`` overrides)."""


class ProgressBoard:
    """Latest progress of every run (a Ray actor: ``ray.remote(num_cpus=0)(ProgressBoard)``)."""

    def __init__(self) -> None:
        self.runs: dict[str, dict[str, Any]] = {}

    def report(self, key: str, state: dict[str, Any]) -> None:
        self.runs[key] = state

    def snapshot(self) -> dict[str, dict[str, Any]]:
        return dict(self.runs)


class ProgressReporter:
    """A step callback (``train(..., callbacks=[...])``) that sends the run's progress to the board."""

    def __init__(self, board: Any, key: str, total: int | None, min_seconds: float = 1.0) -> None:
        self.board, self.key, self.total, self.min_seconds = board, key, total, min_seconds
        self.t0 = time.monotonic()
        self._last = -float("inf")
        self._val: float | None = None

    def __call__(self, step: int, metrics: dict[str, float]) -> None:
        if "val/accuracy" in metrics:
            self._val = float(metrics["val/accuracy"])
        now = time.monotonic()
        last_step = self.total is not None and step >= self.total
        if now - self._last < self.min_seconds and not last_step and "val/accuracy" not in metrics:
            return
        self._last = now
        ref = self.board.report.remote(self.key, {
            "step": int(step), "total": self.total, "elapsed": now - self.t0,
            "pass": metrics.get("batch/solved"), "val": self._val,
        })
        if last_step:  # the board holds the final state before the run's result reaches the driver
            import ray

            ray.get(ref)


def format_progress(key: str, state: dict[str, Any]) -> str:
    step, total, elapsed = state["step"], state.get("total"), state.get("elapsed", 0.0)
    parts = [f"{key}: step {step}" + (f"/{total}" if total else "")]
    if state.get("pass") is not None:
        parts.append(f"pass@1 {state['pass']:.3f}")
    if state.get("val") is not None:
        parts.append(f"val {state['val']:.3f}")
    if total and step:
        left = max(0.0, elapsed / step * (total - step))
        parts.append(f"ETA {int(left // 60)}:{int(left % 60):02d}")
    return ", ".join(parts)


class ProgressPrinter:
    """Prints, from the driver, each run whose progress changed (at most every ``every`` seconds per run)."""

    def __init__(self, board: Any, total_runs: int, say: Callable[[str], None] | None = None,
                 every: float | None = None) -> None:
        self.board, self.total_runs, self._say = board, total_runs, say
        self.every = float(os.environ.get("EXGRPO_PROGRESS_SECONDS", PRINT_SECONDS)) if every is None else every
        self.done = 0
        self._shown: dict[str, tuple[int, float]] = {}

    def say(self, line: str) -> None:
        """``print`` looked up when called (a Prefect flow's ``log_prints`` replaces it), flushed."""
        if self._say is not None:
            self._say(line)
        else:
            print(line, flush=True)

    def poll(self) -> None:
        import ray

        now = time.monotonic()
        for key, state in sorted(ray.get(self.board.snapshot.remote()).items()):
            step, when = self._shown.get(key, (-1, -float("inf")))
            if state["step"] != step and now - when >= self.every:
                self._shown[key] = (state["step"], now)
                self.say(f"progress: {format_progress(key, state)} | runs done {self.done}/{self.total_runs}")

    def finished(self, what: str) -> None:
        self.done += 1
        self.say(f"progress: {what} finished | runs done {self.done}/{self.total_runs}")
