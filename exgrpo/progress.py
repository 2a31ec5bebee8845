"""A rich progress bar for training steps, with a one-line summary per epoch."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

console = Console(stderr=True)


class StepProgress:
    def __init__(self, total: int, start: int = 0, enabled: bool = True, title: str = "train") -> None:
        self.enabled = enabled
        self.title = title
        self._p = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TimeRemainingColumn(),
            console=console, disable=not enabled, transient=False,
        )
        self._task = self._p.add_task(title, total=total, completed=start, info="")

    def __enter__(self) -> StepProgress:
        self._p.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._p.__exit__(*exc)

    def advance(self, m: dict[str, float]) -> None:
        info = f"pass@1 {m.get('batch/solved', 0):.3f}"
        if "pool/questions" in m:
            info += f"  pool {int(m['pool/questions'])}"
        self._p.update(self._task, advance=1, info=info)

    def epoch_summary(self, epoch: int, step: int, m: dict[str, float]) -> None:
        if not self.enabled:
            return
        parts = [f"epoch {epoch:3d}", f"step {step:5d}", f"val acc {m.get('val/accuracy', float('nan')):.4f}",
                 f"batch pass@1 {m.get('batch/solved', 0):.3f}"]
        if "pool/questions" in m:
            parts += [f"pool {int(m['pool/questions'])}", f"retired {int(m.get('pool/retired', 0))}"]
        if m.get("replay/questions"):
            parts.append(f"replayed {int(m['replay/questions'])}")
        self._p.console.print("  ".join(parts))
