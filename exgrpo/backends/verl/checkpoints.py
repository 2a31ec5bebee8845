"""veRL checkpoint directories: which one a resume may trust, and how many stay on disk.

veRL writes ``global_step_N/{actor/, data.pt}`` and then ``latest_checkpointed_iteration.txt`` (the
tracker) in place; exgrpo writes ``global_step_N/exgrpo_pool.pt`` before them, so a tracker that
points at N means the pool is there too. A kill can still leave a torn tracker or a torn newest
step; :func:`repair_tracker` points the tracker at the newest intact step and says so, before
veRL reads it. :func:`prune` keeps the newest ``train.keep_last`` steps.

veRL logs a step's metrics row only after it has saved that step's checkpoint (and synced the
rollout's weights, and validated): a kill in between leaves a whole checkpoint of a step that has no
row. Resumed from there, the run would never log that step, so such a checkpoint is not intact
either (:func:`logged_steps`): the resume falls back to the one before, whose pool and weights are
saved together with it, and trains the step again. Nothing is deleted; the step's directory is
written over when the run reaches it again.
"""

from __future__ import annotations

import json
import os
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


def logged_steps(metrics_dir: Path | None) -> set[int] | None:
    """The steps whose training row veRL's file logger wrote, in any attempt's ``attempt_*.jsonl``
    under ``metrics_dir``; None when there is no such log to check against (a checkpoint is then
    judged by its files alone). A validation-only row (veRL's ``val_before_train``) does not count."""
    files = sorted(Path(metrics_dir).glob("attempt_*.jsonl")) if metrics_dir is not None else []
    if not files:
        return None
    steps: set[int] = set()
    for path in files:
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
                if "training/global_step" in record["data"]:
                    steps.add(int(record["step"]))
            except (ValueError, KeyError, TypeError):  # a torn last line of a killed attempt
                continue
    return steps


def why_not_resumable(n: int, step_dir: Path, logged: set[int] | None) -> str | None:
    """Why step ``n`` cannot be resumed from ("is torn (...)", or "has no metrics row ..."), or None."""
    if (torn := why_torn(step_dir)) is not None:
        return f"is torn ({torn})"
    if logged is not None and n not in logged:
        return "has no metrics row (the run was killed before veRL logged the step)"
    return None


def read_tracker(ckpt_dir: Path) -> int | None:
    try:
        return int((Path(ckpt_dir) / TRACKER).read_text().strip())
    except (OSError, ValueError):
        return None


def newest_intact(ckpt_dir: Path, metrics_dir: Path | None = None) -> int | None:
    """The newest intact step at or before the one the tracker names (any step if it is missing),
    read only: what a resume would start from, or None. ``metrics_dir``: veRL's metric logs, whose
    rows a step must have (:func:`logged_steps`)."""
    tracked = read_tracker(ckpt_dir)
    logged = logged_steps(metrics_dir)
    whole = [n for n, path in step_dirs(ckpt_dir)
             if (tracked is None or n <= tracked) and why_not_resumable(n, path, logged) is None]
    return whole[-1] if whole else None


def repair_tracker(ckpt_dir: Path, say: Callable[[str], None] = print, metrics_dir: Path | None = None) -> int | None:
    """Point the tracker at the newest intact step at or before the one it names (any step if it is
    missing or torn) whose metrics row was written (``metrics_dir``, :func:`logged_steps`); returns
    that step, or None when there is none (a fresh start)."""
    tracked = read_tracker(ckpt_dir)
    logged = logged_steps(metrics_dir)
    candidates = [(n, p) for n, p in step_dirs(ckpt_dir) if tracked is None or n <= tracked]
    for n, path in reversed(candidates):
        reason = why_not_resumable(n, path, logged)
        if reason is None:
            if n != tracked:
                write_text_atomic(Path(ckpt_dir) / TRACKER, str(n))
                say(f"exgrpo: resume: the newest intact checkpoint is {path.name}; resuming from it")
            return n
        say(f"exgrpo: resume: {path.name} {reason}; skipping it")
    return None


def prune(ckpt_dir: Path, keep_last: int | None, current: int, metrics_dir: Path | None = None) -> list[Path]:
    """Keep the newest ``keep_last`` whole step directories up to ``current``; delete the older ones
    and the torn ones (a killed attempt's leftovers). Returns the deleted. With ``metrics_dir``, only
    steps whose row is logged count towards ``keep_last``, and the newer ones (the step just saved,
    whose row veRL writes later) stay beside them: a kill before that row leaves a step to fall back to."""
    if keep_last is None:
        return []
    logged = logged_steps(metrics_dir)
    upto = [(n, p) for n, p in step_dirs(ckpt_dir) if n <= current]
    whole = [(n, p) for n, p in upto if why_torn(p, load=False) is None]
    if logged is None:
        keep = [p for _, p in whole[-keep_last:]]
    else:
        counted = [(n, p) for n, p in whole if n in logged]
        newest = counted[-1][0] if counted else -1
        keep = [p for _, p in counted[-keep_last:]] + [p for n, p in whole if n > newest]
    old = [p for _, p in upto if p not in keep]
    for path in old:
        shutil.rmtree(path, ignore_errors=True)
    return old


HOLD_AFTER_CHECKPOINT_ENV = "EXGRPO_FAULT_HOLD_AFTER_CHECKPOINT"
"""A fault-injection point for tests: set to N, the job stops moving once step N's checkpoint is
saved, before veRL logs the step's row (a kill then lands in that window for sure)."""


def hold_after_checkpoint(step: int) -> None:
    """Hold the job here, announcing it, when :data:`HOLD_AFTER_CHECKPOINT_ENV` names ``step``."""
    if os.environ.get(HOLD_AFTER_CHECKPOINT_ENV) != str(step):
        return
    import time

    print(f"exgrpo: fault injection: holding after the checkpoint of step {step}", flush=True)
    while True:
        time.sleep(3600)
