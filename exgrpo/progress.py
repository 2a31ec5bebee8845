"""A rich progress bar for training steps, with a one-line summary per epoch."""

from __future__ import annotations

import os

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, Task, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.text import Text

console = Console(stderr=True)

MIN_TIMED_STEPS = 3
"""Steps timed (after the first, whose time holds the run's start-up: loading, warm start, a veRL
job's workers) before a remaining time is shown: one step's pace, or a start-up spread over one
step, says little about the rest (it made the first ETA of a 10-minute run hours)."""


class _TimeRemaining(TimeRemainingColumn):
    """rich's time remaining, blank ("-:--:--") until :data:`MIN_TIMED_STEPS` steps have been timed
    (the task's ``timed`` field)."""

    def render(self, task: Task) -> Text:
        if task.fields.get("timed", 0) < MIN_TIMED_STEPS:
            return Text("-:--:--", style="progress.remaining")
        return super().render(task)


def is_watched(con: Console | None = None) -> bool:
    """A person watches ``con`` (default: :data:`console`): it is a terminal, and ``EXGRPO_PROGRESS``
    is not ``plain``. Then progress is drawn in place; elsewhere (logs, pipes, a Prefect flow run's
    log) it is printed as plain lines."""
    return (con or console).is_terminal and os.environ.get("EXGRPO_PROGRESS", "").lower() != "plain"


class StepProgress:
    def __init__(self, total: int | None, start: int = 0, enabled: bool = True, title: str = "train") -> None:
        self.enabled = enabled
        self.title = title
        self._p = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"), TimeElapsedColumn(), _TimeRemaining(),
            console=console, disable=not enabled, transient=False,
        )
        self._task = self._p.add_task(title, total=total, completed=start, info="", timed=0)
        self._updates = 0

    def __enter__(self) -> StepProgress:
        self._p.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._p.__exit__(*exc)

    def _timed(self) -> int:
        """Steps timed so far, this update's included: every update after the first."""
        self._updates += 1
        return self._updates - 1

    def advance(self, m: dict[str, float]) -> None:
        self._p.update(self._task, advance=1, info=self._info(m), timed=self._timed())

    def show(self, step: int, m: dict[str, float]) -> None:
        """Step ``step`` is done, with metrics ``m``: for steps that arrive from elsewhere (a veRL job's
        metric file, a step callback); a validation step also prints its summary line."""
        self._p.update(self._task, completed=step, info=self._info(m), timed=self._timed())
        if "val/accuracy" in m and self.enabled:
            self._p.console.print(self._summary([f"step {step:5d}"], m))

    def epoch_summary(self, epoch: int, step: int, m: dict[str, float]) -> None:
        if not self.enabled:
            return
        self._p.console.print(self._summary([f"epoch {epoch:3d}", f"step {step:5d}"], m))

    @staticmethod
    def _info(m: dict[str, float]) -> str:
        info = f"pass@1 {m.get('batch/solved', 0):.3f}"
        if "pool/questions" in m:
            info += f"  pool {int(m['pool/questions'])}"
        return info

    @staticmethod
    def _summary(parts: list[str], m: dict[str, float]) -> str:
        parts = [*parts, f"val acc {m.get('val/accuracy', float('nan')):.4f}",
                 f"batch pass@1 {m.get('batch/solved', 0):.3f}"]
        if "pool/questions" in m:
            parts += [f"pool {int(m['pool/questions'])}", f"retired {int(m.get('pool/retired', 0))}"]
        if m.get("replay/questions"):
            parts.append(f"replayed {int(m['replay/questions'])}")
        return "  ".join(parts)
