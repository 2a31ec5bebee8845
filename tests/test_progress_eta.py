"""The remaining time a run's progress shows: none until a few steps have been timed, then the pace of
the steps after the first (whose time holds the run's start-up), in the live table and lines of a
comparison (exgrpo/live_progress.py) and in a run's own bar (exgrpo/progress.py)."""

from __future__ import annotations

import io
import time

from rich.console import Console

from exgrpo import progress
from exgrpo.live_progress import ProgressReporter, eta, format_progress
from exgrpo.progress import MIN_TIMED_STEPS, StepProgress


def test_a_start_up_spread_over_the_first_steps_gives_no_eta_then_the_steps_own_pace():
    """120 steps of 5 s after a 300 s start-up (a veRL job's workers, a warm start): 10 minutes left
    after step 1, which the start-up's pace called hours."""
    reporter = ProgressReporter(board=None, key="grpo seed 0", total=120, min_seconds=0.0)
    t0 = reporter.t0
    shown = {}
    for step in range(1, 11):
        state = reporter.state(step, {"batch/solved": 0.5}, now=t0 + 300 + 5 * step)
        shown[step] = eta(state)
    assert all(shown[s] == "" for s in range(1, 1 + MIN_TIMED_STEPS))
    assert shown[1 + MIN_TIMED_STEPS] == f"{5 * (119 - MIN_TIMED_STEPS) // 60}:{5 * (119 - MIN_TIMED_STEPS) % 60:02d}"
    assert shown[10] == "9:10" and format_progress("grpo seed 0", state).endswith("ETA 9:10")


def test_a_resumed_run_is_timed_from_its_first_step_after_the_resume():
    reporter = ProgressReporter(board=None, key="exgrpo seed 1", total=120, min_seconds=0.0)
    states = [reporter.state(step, {}, now=reporter.t0 + 60 + 2 * (step - 60)) for step in range(61, 61 + 5)]
    assert [eta(s) for s in states] == ["", "", "", "1:52", "1:50"]


def test_a_runs_bar_shows_no_remaining_time_until_steps_are_timed(monkeypatch):
    monkeypatch.setattr(progress, "console", Console(file=io.StringIO(), width=200, force_terminal=True))
    bar = StepProgress(total=100, start=0, enabled=True)
    column, task = bar._p.columns[-1], bar._p.tasks[0]
    shown = []
    with bar:
        for _ in range(2 + MIN_TIMED_STEPS):
            time.sleep(0.02)  # a step's time, for rich's pace
            bar.advance({"batch/solved": 0.5})
            shown.append(column.render(task).plain)
    assert shown[:MIN_TIMED_STEPS] == ["-:--:--"] * MIN_TIMED_STEPS  # the first update and the next ones
    assert all(s != "-:--:--" for s in shown[MIN_TIMED_STEPS:]), shown
