"""Room on disk for a comparison's or a sweep's next run.

Each run writes its checkpoint into its directory and a copy of its policy into MLflow's artifact store,
both at its end. A disk that fills fails a run at that final save, after all its training, and every run
started after it the same way. So a comparison or a sweep launches a new run only when the disk under its
directory has room for what its largest finished run wrote, for that run and for each run already training
beside it (:func:`while_room`); what it does not launch is said in one line with the sizes and the fix.

What is counted is an upper bound: MLflow's copy as if it were on the same disk (the default store keeps its
artifacts beside the runs), and each run in flight at a whole run's size. Before any run has finished there
is nothing to measure, and runs are launched as before: on Ray without ``--workers`` a comparison's first
stage launches all its runs at once, so the check applies from the next stage (or set ``--workers``). A
finished run whose last checkpoint left out the optimiser's state is counted with the whole checkpoint it
held while training (:func:`_in_flight_bytes`).
"""

from __future__ import annotations

import functools
import re
import shutil
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TypeVar

from exgrpo.runs import has_checkpoint

GIB = 1024 ** 3
Job = TypeVar("Job")
_CHECKPOINT = re.compile(r"^(step_\d+\.pt|global_step_\d+|verl_global_step_\d+\.pt|verl_global_step_\d+_hf)$")
"""What a run keeps in ``checkpoints/``: native ``step_N.pt``, veRL's ``global_step_N/`` and the policy merged
from it (a file, or an HF directory for an external model); an atomic write's ``.tmp`` is not yet a checkpoint."""
_STEP = re.compile(r"(\d+)")


def free_bytes(path: Path) -> int:
    """Bytes free to this user on the file system of ``path``."""
    return shutil.disk_usage(path).free


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


@functools.lru_cache(maxsize=4096)
def _native_parts(path: Path, size: int, mtime_ns: int) -> tuple[int, bool]:
    """A native checkpoint's ``model`` tensors in bytes and whether it holds the optimiser's state, read
    memory-mapped (no weight is read); cached by the file's size and time, as a comparison asks again before
    each run it launches."""
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()  # tied weights share one
                    for t in state["model"].values() if torch.is_tensor(t)}
        # the key exgrpo.backends.native.checkpoint.OPTIMIZER names (not imported: it would import torch here)
        return sum(storages.values()), "optimizer" in state
    except Exception:  # noqa: BLE001 - torn or foreign: counted whole, an upper bound
        return size, True


def _in_flight_bytes(kept: list[Path], newest: Path) -> int:
    """What a run like this one holds in ``checkpoints/`` while it trains: what the finished run keeps, and
    where its last checkpoint left out the optimiser's state (``train.final_checkpoint_optimizer: false``), the
    whole checkpoint it held before that one as well: its last file plus two moments of its weights (AdamW's,
    an upper bound for the optimisers here)."""
    kept_bytes = sum(_size(p) for p in kept)
    if not newest.is_file():
        return kept_bytes
    st = newest.stat()
    model, has_optimizer = _native_parts(newest, st.st_size, st.st_mtime_ns)
    return kept_bytes if has_optimizer else kept_bytes + st.st_size + 2 * model


def _policy_bytes(step: Path) -> int:
    """Bytes of the policy MLflow keeps of checkpoint ``step`` (:func:`exgrpo.tracking.finished_run.policy_only`):
    a native file's ``model`` tensors; for a veRL step, its merged policy file or HF directory where it was
    made, else the step itself (an upper bound)."""
    if step.is_file():
        st = step.stat()
        return _native_parts(step, st.st_size, st.st_mtime_ns)[0]
    for merged in (step.parent / f"verl_{step.name}.pt", step.parent / f"verl_{step.name}_hf"):
        if merged.exists():
            return _size(merged)
    return _size(step)


def written_per_run(root: Path) -> tuple[int, int] | None:
    """What the largest finished run under ``root`` (a comparison's ``<arm run>/seed<k>/checkpoints/``, a
    sweep's ``trial<n>/<name>/seed<k>/checkpoints/``) wrote: ``(checkpoint bytes, policy copy bytes)``, what
    its ``checkpoints/`` keeps and MLflow's copy of its newest policy; None when no run there holds a
    checkpoint yet. A file that goes while it is read (a run still writing or pruning) is skipped."""
    largest: tuple[int, int] | None = None
    for ckpts in Path(root).glob("**/seed*/checkpoints"):
        try:
            kept = [p for p in ckpts.iterdir() if _CHECKPOINT.match(p.name)]
            steps = [p for p in kept if p.name.startswith(("step_", "global_step_"))]
            if not steps:
                continue
            newest = max(steps, key=lambda p: int(_STEP.search(p.name).group(1)))
            found = (_in_flight_bytes(kept, newest), _policy_bytes(newest))
        except OSError:
            continue
        if largest is None or sum(found) > sum(largest):
            largest = found
    return largest


def room_for(root: Path, runs: int, fix: str) -> str | None:
    """Why the disk under ``root`` (a comparison's or a sweep's directory) cannot hold ``runs`` more runs like
    its largest finished one, in one line ending in ``fix``; None where it can, where no run has finished to
    measure, or where the disk cannot be read (the check never stops work it cannot judge)."""
    root = Path(root)
    try:
        written = written_per_run(root)
        if written is None:
            return None
        where = next(p for p in (root, *root.parents) if p.exists())
        available = free_bytes(where)
    except OSError:
        return None
    checkpoint, policy = written
    need = runs * (checkpoint + policy)
    if available >= need:
        return None
    return (f"no room on disk: {_shown(available)} free under {where}, and {runs} run(s) need {_shown(need)} (each "
            f"writes {_shown(checkpoint)} of checkpoints and MLflow's {_shown(policy)} copy of its policy): free "
            f"space or set output_dir on a larger disk, then {fix}")


def _shown(n: int) -> str:
    """Bytes as a person reads them: GiB from one GiB up, else MiB."""
    return f"{n / GIB:.2f} GiB" if abs(n) >= GIB else f"{n / 1024 ** 2:.2f} MiB"


def while_room(jobs: Iterable[Job], run_dir_of: Callable[[Job], Path], running: Callable[[], int],
               refuse: Callable[[Job, str], None], *, resume: bool, fix: str, root: Path | None = None,
               ) -> Iterator[Job]:
    """``jobs``, each as the disk has room for it beside the ``running()`` runs in flight
    (:func:`room_for`); the first new run it has no room for and every new run after it go to
    ``refuse(job, reason)`` instead (a later one would find no more room: a finished run's files stay).
    With ``resume``, a run whose directory holds a checkpoint already is launched: a finished one only
    reports, and its record is part of the statistics (without ``resume`` it would be moved aside and
    trained anew, so it is checked like any new run). ``root``: the directory whose runs are measured
    (default: a comparison's, two levels above a run's directory); ``fix``: the reason's last words."""
    reason = None
    for job in jobs:
        if resume and has_checkpoint(run_dir_of(job)):
            yield job
            continue
        if reason is None:
            reason = room_for(root or Path(run_dir_of(job)).parent.parent, running() + 1, fix)
        if reason is not None:
            refuse(job, reason)
            continue
        yield job
