"""veRL checkpoint directories: which one a resume may trust, and how many stay on disk.

veRL writes ``global_step_N/{actor/, data.pt}`` and then ``latest_checkpointed_iteration.txt`` (the
tracker) in place; exgrpo writes ``global_step_N/exgrpo_pool.pt`` before them, so a tracker that
points at N means the pool is there too. A kill can still leave a torn tracker or a torn newest
step; :func:`repair_tracker` points the tracker at the newest intact step and says so, before
veRL reads it. :func:`prune` keeps the newest ``train.keep_last`` steps.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path

from exgrpo.atomic import write_text_atomic

TRACKER = "latest_checkpointed_iteration.txt"
POOL_FILE = "exgrpo_pool.pt"
_STEP_DIR = re.compile(r"global_step_(\d+)$")


def step_dirs(ckpt_dir: Path) -> list[tuple[int, Path]]:
    """``(N, global_step_N)`` under ``ckpt_dir``, oldest first."""
    found = [(int(m.group(1)), p) for p in Path(ckpt_dir).glob("global_step_*") if (m := _STEP_DIR.search(p.name))]
    return sorted(found)


def why_torn(step_dir: Path, load: bool = True) -> str | None:
    """Why ``step_dir`` cannot be resumed from, or None if it looks whole (``load``: also load the pool)."""
    import torch

    actor = step_dir / "actor"
    if not actor.is_dir() or not any(actor.iterdir()):
        return "no actor weights"
    if not (step_dir / "data.pt").is_file() or (step_dir / "data.pt").stat().st_size == 0:
        return "no data.pt"
    pool = step_dir / POOL_FILE
    if not pool.is_file():
        return f"no {POOL_FILE}"
    if not load:
        return None
    try:
        torch.load(pool, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - truncated or not a checkpoint
        return f"{POOL_FILE} does not load ({type(e).__name__})"
    return None


def read_tracker(ckpt_dir: Path) -> int | None:
    try:
        return int((Path(ckpt_dir) / TRACKER).read_text().strip())
    except (OSError, ValueError):
        return None


def newest_intact(ckpt_dir: Path) -> int | None:
    """The newest intact step at or before the one the tracker names (any step if it is missing),
    read only: what a resume would start from, or None."""
    tracked = read_tracker(ckpt_dir)
    whole = [n for n, path in step_dirs(ckpt_dir) if (tracked is None or n <= tracked) and why_torn(path) is None]
    return whole[-1] if whole else None


def repair_tracker(ckpt_dir: Path, say: Callable[[str], None] = print) -> int | None:
    """Point the tracker at the newest intact step at or before the one it names (any step if it is
    missing or torn); returns that step, or None when there is none (a fresh start)."""
    tracked = read_tracker(ckpt_dir)
    candidates = [(n, p) for n, p in step_dirs(ckpt_dir) if tracked is None or n <= tracked]
    for n, path in reversed(candidates):
        reason = why_torn(path)
        if reason is None:
            if n != tracked:
                write_text_atomic(Path(ckpt_dir) / TRACKER, str(n))
                say(f"exgrpo: resume: the newest intact checkpoint is {path.name}; resuming from it")
            return n
        say(f"exgrpo: resume: {path.name} is torn ({reason}); skipping it")
    return None


def prune(ckpt_dir: Path, keep_last: int | None, current: int) -> list[Path]:
    """Keep the newest ``keep_last`` whole step directories up to ``current``; delete the older ones
    and the torn ones (a killed attempt's leftovers). Returns the deleted."""
    if keep_last is None:
        return []
    upto = [p for n, p in step_dirs(ckpt_dir) if n <= current]
    whole = [p for p in upto if why_torn(p, load=False) is None]
    old = [p for p in upto if p not in whole[-keep_last:]]
    for path in old:
        shutil.rmtree(path, ignore_errors=True)
    return old
