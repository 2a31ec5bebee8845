"""Checkpoints: model, optimiser, experience pool, replay switch, RNG states and step, in one file.

Written atomically (temp file + rename) as ``<run_dir>/checkpoints/step_<n>.pt``; loaded with
``torch.load(weights_only=True)`` (the state holds only tensors and plain containers).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from exgrpo.atomic import torch_save_atomic

if TYPE_CHECKING:
    from exgrpo.backends.native.trainer import Trainer

_STEP = re.compile(r"step_(\d+)\.pt$")


def save(trainer: Trainer, run_dir: Path) -> Path:
    d = run_dir / "checkpoints"
    d.mkdir(parents=True, exist_ok=True)
    return torch_save_atomic(trainer.state_dict(), d / f"step_{trainer.step:07d}.pt")


def latest_checkpoint(run_dir: Path) -> Path | None:
    d = run_dir / "checkpoints"
    found = sorted((int(m.group(1)), p) for p in d.glob("step_*.pt") if (m := _STEP.search(p.name)))
    return found[-1][1] if found else None


def load_state(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def load(trainer: Trainer, path: Path) -> None:
    trainer.load_state_dict(load_state(path))


def read_metrics(path: Path, up_to_step: int) -> list[dict[str, float]]:
    """Metric records with step <= ``up_to_step`` (later ones belong to the killed tail)."""
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if r["step"] <= up_to_step]


def write_metrics(path: Path, rows: list[dict[str, float]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
