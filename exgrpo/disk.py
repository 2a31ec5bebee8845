"""Room on disk for a comparison's (or a sweep's) next run.

Each run of a comparison writes its checkpoint into its directory and a copy of its policy into MLflow's
artifact store, both at its end. A disk that fills fails a run at that final save, after all its training,
and every run started after it the same way. So a comparison launches a run only when the disk under
its ``output_dir`` has room for what one of its finished runs wrote, for that run and for each run already
training beside it; the runs it does not launch fail at once, in one line that names the sizes and the fix
(:func:`while_room`), and ``--resume`` trains them once there is room. Before any run of the comparison
has finished there is nothing to measure, and runs are launched as before.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TypeVar

from exgrpo.errors import UserError
from exgrpo.runs import has_checkpoint

GIB = 1024 ** 3
Job = TypeVar("Job")


class DiskFull(UserError):
    """The disk under a comparison's ``output_dir`` cannot hold its next run."""


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _policy_bytes(checkpoint: Path) -> int:
    """Bytes of the policy MLflow keeps of ``checkpoint`` (:func:`exgrpo.tracking.finished_run.policy_only`):
    a native file's ``model`` tensors, read memory-mapped (no weight is read); a veRL step's merged policy
    file where it was made, else the step itself (an upper bound)."""
    if checkpoint.is_dir():
        merged = checkpoint.parent / f"verl_{checkpoint.name}.pt"
        return _size(merged) if merged.is_file() else _size(checkpoint)
    import torch

    try:
        state = torch.load(checkpoint, map_location="cpu", weights_only=True, mmap=True)
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()  # tied weights share one
                    for t in state["model"].values() if torch.is_tensor(t)}
        return sum(storages.values())
    except Exception:  # noqa: BLE001 - torn or foreign: counted whole, an upper bound
        return _size(checkpoint)


def written_per_run(root: Path) -> tuple[int, int] | None:
    """What the largest finished run under ``root`` (a comparison's ``<arm run>/seed<k>/checkpoints/``, a
    sweep's ``trial<n>/<name>/seed<k>/checkpoints/``) wrote: ``(checkpoint bytes, policy copy bytes)``, the
    checkpoints it keeps and MLflow's copy of its newest policy; None when no run there holds a checkpoint yet."""
    largest: tuple[int, int] | None = None
    for ckpts in Path(root).glob("**/seed*/checkpoints"):
        entries = sorted(p for p in ckpts.iterdir() if p.name.startswith(("step_", "global_step_")))
        if not entries:
            continue
        newest = max(entries, key=lambda p: p.stat().st_mtime)
        found = (sum(_size(p) for p in entries), _policy_bytes(newest))
        if largest is None or sum(found) > sum(largest):
            largest = found
    return largest


def free_bytes(path: Path) -> int:
    """Bytes free to this user on the file system of ``path``."""
    return shutil.disk_usage(path).free


def room_for(root: Path, runs: int, what: str = "comparison") -> str | None:
    """Why the disk under ``root`` (a comparison's or a sweep's directory) cannot hold ``runs`` more runs
    like its largest finished one, in one line; None where it can (or where no run has finished to measure)."""
    root = Path(root)
    written = written_per_run(root)
    if written is None:
        return None
    where = next(p for p in (root, *root.parents) if p.exists())
    available = free_bytes(where)
    checkpoint, policy = written
    need = runs * (checkpoint + policy)
    if available >= need:
        return None
    return (f"disk full: {_shown(available)} free under {where}, and {runs} run(s) of this {what} need "
            f"{_shown(need)} (each writes a {_shown(checkpoint)} checkpoint and MLflow's {_shown(policy)} copy of "
            f"its policy): free space or set output_dir on a larger disk, then --resume trains this run")


def _shown(n: int) -> str:
    """Bytes as a person reads them: GiB from one GiB up, else MiB."""
    return f"{n / GIB:.2f} GiB" if abs(n) >= GIB else f"{n / 1024 ** 2:.2f} MiB"


def while_room(jobs: Iterable[Job], run_dir_of: Callable[[Job], Path], running: Callable[[], int],
               refuse: Callable[[Job, str], None], root: Path | None = None, what: str = "comparison",
               ) -> Iterator[Job]:
    """``jobs``, each as the disk has room for it beside the ``running()`` runs in flight
    (:func:`room_for`); the first new run it has no room for and every new run after it go to
    ``refuse(job, reason)`` instead (a later one would find no more room: a finished run's files stay). A
    run whose directory holds a checkpoint already (``--resume``) is launched: a finished one only reports,
    and its record is part of the comparison's statistics. ``root``: the directory whose runs are measured
    (default: a comparison's, two levels above a run's directory)."""
    reason = None
    for job in jobs:
        if has_checkpoint(run_dir_of(job)):
            yield job
            continue
        if reason is None:
            reason = room_for(root or Path(run_dir_of(job)).parent.parent, running() + 1, what)
        if reason is not None:
            refuse(job, reason)
            continue
        yield job
