"""Atomic file writes: write a temporary file beside the target, then rename it into place, so a
kill mid-write never leaves a torn file under the final name."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` through ``<path>.tmp`` and a rename."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


def torch_save_atomic(obj: Any, path: str | Path) -> Path:
    """``torch.save`` to ``path`` through ``<path>.tmp`` and a rename."""
    import torch

    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)
    return path
