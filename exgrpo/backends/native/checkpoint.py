"""Checkpoints: model, optimiser, experience pool, replay switch, RNG states and step, in one file.

Written atomically (temp file + fsync + rename) as ``<run_dir>/checkpoints/step_<n>.pt``; loaded
with ``torch.load(weights_only=True)`` (the state holds only tensors and plain containers). Resume
takes the newest checkpoint that loads: a torn one (a disk that filled, a copy cut short) is
skipped with a warning naming it, and the run goes on from the one before.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch

from exgrpo.atomic import torch_save_atomic
from exgrpo.errors import UserError, one_line
from exgrpo.runs import NothingToResume

logger = logging.getLogger(__name__)
_STEP = re.compile(r"step_(\d+)\.pt$")
OPTIMIZER = "optimizer"
"""The state's key of the optimiser's state, absent from a finished run's last checkpoint under
``train.final_checkpoint_optimizer: false``."""


class Checkpointed(Protocol):
    """What a checkpoint saves and restores: the native trainer."""

    cfg: Any
    step: int

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def save(trainer: Checkpointed, run_dir: Path, finished: bool = False) -> Path:
    """Write ``step_<n>.pt`` (a finished run's without the optimiser's state under
    ``train.final_checkpoint_optimizer: false``); then, with ``train.keep_last``, delete all but the newest
    that many."""
    d = run_dir / "checkpoints"
    d.mkdir(parents=True, exist_ok=True)
    state = trainer.state_dict()
    if finished and not trainer.cfg.train.final_checkpoint_optimizer:
        del state[OPTIMIZER]
    path = torch_save_atomic(state, d / f"step_{trainer.step:07d}.pt")
    keep = trainer.cfg.train.keep_last
    if keep:
        for old in checkpoints(run_dir)[:-keep]:
            old.unlink(missing_ok=True)
    return path


def checkpoints(run_dir: Path) -> list[Path]:
    """The run's ``step_*.pt`` files, oldest first."""
    d = run_dir / "checkpoints"
    found = sorted((int(m.group(1)), p) for p in d.glob("step_*.pt") if (m := _STEP.search(p.name)))
    return [p for _, p in found]


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = checkpoints(run_dir)
    return found[-1] if found else None


def load_latest_intact(run_dir: Path, warn: Callable[[str], None] = logger.warning,
                       mmap: bool = False) -> tuple[Path, dict] | None:
    """The newest checkpoint that loads, and its state; None if there is none. Each torn newer one
    is reported through ``warn`` (one line: which file, why, which one is used instead). ``mmap``: its
    tensors mapped from the file, not read (a look at its entries costs little)."""
    found = checkpoints(run_dir)
    for i in range(len(found) - 1, -1, -1):
        try:
            return found[i], load_state(found[i], mmap=mmap)
        except Exception as e:  # noqa: BLE001 - torch.load raises many types for a torn zip
            older = found[i - 1].name if i > 0 else "none left"
            warn(f"checkpoint {found[i]} is unreadable ({type(e).__name__}: {str(e)[:120]}); "
                 f"falling back to the previous one ({older})")
    return None


def no_checkpoint_error(run_dir: Path) -> NothingToResume:
    """What a ``--resume`` of ``run_dir`` meets when none of its checkpoints loads."""
    what = "readable checkpoint" if checkpoints(run_dir) else "checkpoint"
    return NothingToResume(f"--resume: no {what} under {run_dir / 'checkpoints'}; run without --resume")


class CheckpointError(ValueError):
    """A file that is not a readable exgrpo checkpoint; the message is one line naming the file."""


class FinishedCheckpoint(CheckpointError, UserError):
    """``--resume`` asked to train past a finished run's last checkpoint that holds no optimiser state."""


def load_state(path: Path, mmap: bool = False) -> dict:
    """The state dict of checkpoint ``path``, loaded with ``weights_only=True`` (tensors and plain
    containers only: a pickle that would run code is refused). CheckpointError if it is not one.
    ``mmap``: tensors mapped from the file rather than read into memory."""
    import pickle

    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        if "weights_only" in str(e).lower() or "weights only" in str(e).lower():
            raise CheckpointError(f"{path}: refused to load: it holds Python objects, not only tensors (exgrpo "
                                  f"checkpoints load with weights_only=True; a foreign or hostile pickle)") from e
        raise CheckpointError(f"{path}: not a readable exgrpo checkpoint ({one_line(e, 160)})") from e
    except Exception as e:  # noqa: BLE001 - torch.load raises many types for torn or foreign files
        raise CheckpointError(f"{path}: not a readable exgrpo checkpoint (torn or another format: {one_line(e, 160)})") from e
    if not isinstance(state, dict) or not {"config", "model"} <= set(state):
        raise CheckpointError(f"{path}: not an exgrpo checkpoint (no 'config' and 'model' entries)")
    return state


def load(trainer: Checkpointed, path: Path) -> None:
    trainer.load_state_dict(load_state(path))
