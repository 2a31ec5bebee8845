"""Live progress of runs that execute on Ray workers (comparisons, sweeps), shown by the driver.

Each worker's training loop reports through a step callback (:class:`ProgressReporter`) to one small
Ray actor (:class:`ProgressBoard`), at most once a second; the driver polls the board while it waits
for results and shows it (:func:`progress_display`): one line per run (arm, seed, step/total, the
latest batch pass@1 and validation accuracy, an ETA) and the runs done out of the total. In a
terminal that is a rich table redrawn in place (:class:`LiveProgressTable`); elsewhere (CI logs, the
Prefect UI's logs, a pipe) plain periodic lines (:class:`ProgressPrinter`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from exgrpo.progress import MIN_TIMED_STEPS, console as default_console, is_watched

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
        self._first: tuple[int, float] | None = None
        """(step, seconds since start) of the first step reported: the ETA times the steps after it."""

    def on_start(self, total_steps: int) -> None:
        """The trainer's planned step count (the ETA's denominator when the config sets no max_steps);
        the board hears of the run at once, so its start is known before its first step."""
        self.total = total_steps
        self.board.report.remote(self.key, {"step": 0, "total": total_steps, "elapsed": 0.0, "pass": None, "val": None})

    def state(self, step: int, metrics: dict[str, float], now: float) -> dict[str, Any] | None:
        """What the board hears after step ``step`` at time ``now`` (``time.monotonic``), or None while
        reports are throttled (at most one every ``min_seconds``, the last step and validations always)."""
        if "val/accuracy" in metrics:
            self._val = float(metrics["val/accuracy"])
        if self._first is None:
            self._first = (int(step), now - self.t0)
        last_step = self.total is not None and step >= self.total
        if now - self._last < self.min_seconds and not last_step and "val/accuracy" not in metrics:
            return None
        self._last = now
        return {"step": int(step), "total": self.total, "elapsed": now - self.t0, "timed_from": self._first,
                "pass": metrics.get("batch/solved"), "val": self._val}

    def __call__(self, step: int, metrics: dict[str, float]) -> None:
        state = self.state(step, metrics, time.monotonic())
        if state is None:
            return
        ref = self.board.report.remote(self.key, state)
        last_step = self.total is not None and step >= self.total
        if last_step:  # the board holds the final state before the run's result reaches the driver
            import ray

            ray.get(ref)


def completed_fraction(states: dict[str, dict[str, Any]], ended: dict[str, str], total_runs: int) -> float:
    """Finished runs count 1, a running one step/total (0 while its total is unknown); in [0, 1]."""
    if total_runs <= 0:
        return 1.0
    running = sum(min(1.0, st["step"] / st["total"]) for k, st in states.items()
                  if k not in ended and st.get("total"))
    return min(1.0, (len(ended) + running) / total_runs)


def format_progress(key: str, state: dict[str, Any]) -> str:
    step, total = state["step"], state.get("total")
    parts = [f"{key}: step {step}" + (f"/{total}" if total else "")]
    if state.get("pass") is not None:
        parts.append(f"pass@1 {state['pass']:.3f}")
    if state.get("val") is not None:
        parts.append(f"val {state['val']:.3f}")
    if eta(state):
        parts.append(f"ETA {eta(state)}")
    return ", ".join(parts)


def eta(state: dict[str, Any]) -> str:
    """``m:ss`` left at the pace of the steps timed since the run's first reported step, or ``""``
    while its total is unknown or fewer than :data:`~exgrpo.progress.MIN_TIMED_STEPS` steps are timed
    (the first step's time holds the run's start-up, which says nothing of the steps to come)."""
    step, total, first = state["step"], state.get("total"), state.get("timed_from")
    if not total or first is None or step - first[0] < MIN_TIMED_STEPS:
        return ""
    per_step = (state.get("elapsed", 0.0) - first[1]) / (step - first[0])
    left = max(0.0, per_step * (total - step))
    return f"{int(left // 60)}:{int(left % 60):02d}"


def record_finished(what: str, ended: dict[str, str]) -> str:
    """Note a finished run (``what``: its key, optionally `` (NOTE)``, e.g. FAILED) in ``ended``; its key."""
    key, _, note = what.partition(" (")
    ended[key] = note.rstrip(")")
    return key


class ProgressPrinter:
    """Prints, from the driver, each run whose progress changed (at most every ``every`` seconds per run)."""

    def __init__(self, board: Any, total_runs: int, say: Callable[[str], None] | None = None,
                 every: float | None = None) -> None:
        self.board, self.total_runs, self._say = board, total_runs, say
        self.every = float(os.environ.get("EXGRPO_PROGRESS_SECONDS", PRINT_SECONDS)) if every is None else every
        self.done = 0
        self.states: dict[str, dict[str, Any]] = {}
        self.ended: dict[str, str] = {}
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
        self.states.update(ray.get(self.board.snapshot.remote()))
        for key, state in sorted(self.states.items()):
            if key in self.ended:  # its "finished" line is its last: a step it reported within the throttle stays unshown
                continue
            step, when = self._shown.get(key, (-1, -float("inf")))
            if state["step"] != step and now - when >= self.every:
                self._shown[key] = (state["step"], now)
                self.say(f"progress: {format_progress(key, state)} | runs done {self.done}/{self.total_runs}")

    def finished(self, what: str) -> None:
        self.done += 1
        record_finished(what, self.ended)
        self.say(f"progress: {what} finished | runs done {self.done}/{self.total_runs}")

    def fraction(self) -> float:
        """Share of the whole work done: finished runs count 1, running ones step/total."""
        return completed_fraction(self.states, self.ended, self.total_runs)

    def __enter__(self) -> ProgressPrinter:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


class LiveProgressTable:
    """The board as a rich table redrawn in place: a row per run, a footer with the runs done.
    Same interface as :class:`ProgressPrinter`; a context manager (the display ends on exit)."""

    def __init__(self, board: Any, total_runs: int, console: Any = None) -> None:
        from rich.live import Live

        self.board, self.total_runs, self.done = board, total_runs, 0
        self.states: dict[str, dict[str, Any]] = {}
        self.ended: dict[str, str] = {}
        self.live = Live(self._render(), console=console or default_console, refresh_per_second=2, transient=False)

    def _render(self):
        from rich.table import Table

        table = Table(title=None, caption=f"runs done {self.done}/{self.total_runs}", expand=False)
        for col in ("run", "step", "batch pass@1", "val accuracy", "ETA"):
            table.add_column(col, justify="left" if col == "run" else "right")
        for key, st in sorted(self.states.items()):
            step, total = st["step"], st.get("total")
            table.add_row(key + (f" ({self.ended[key]})" if self.ended.get(key) else ""),
                          f"{step}/{total}" if total else str(step),
                          "" if st.get("pass") is None else f"{st['pass']:.3f}",
                          "" if st.get("val") is None else f"{st['val']:.3f}",
                          "done" if key in self.ended else eta(st))
        return table

    def __enter__(self) -> LiveProgressTable:
        self.live.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.live.update(self._render(), refresh=True)
        self.live.stop()

    def poll(self) -> None:
        import ray

        self.states.update(ray.get(self.board.snapshot.remote()))
        self.live.update(self._render())

    def finished(self, what: str) -> None:
        """``what`` is the run's key, optionally followed by a note in parentheses (e.g. FAILED)."""
        self.done += 1
        self.states.setdefault(record_finished(what, self.ended), {"step": 0})
        self.poll()

    def fraction(self) -> float:
        """Share of the whole work done (see :func:`completed_fraction`)."""
        return completed_fraction(self.states, self.ended, self.total_runs)


def progress_display(board: Any, total_runs: int, console: Any = None) -> LiveProgressTable | ProgressPrinter:
    """A live table where a terminal is attached (``console.is_terminal``), plain lines elsewhere;
    ``EXGRPO_PROGRESS=plain`` forces the lines. Use as a context manager."""
    console = console or default_console
    if is_watched(console):
        return LiveProgressTable(board, total_runs, console)
    return ProgressPrinter(board, total_runs)
