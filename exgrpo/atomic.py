"""Atomic file writes: write a temporary file beside the target, flush it to disk (fsync), then
rename it into place, so a kill or a crash mid-write never leaves a torn file under the final name,
and a failed write leaves no temporary file behind."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO


def _write_atomic(path: str | Path, write: Callable[[BinaryIO], None], mode: int | None = None) -> Path:
    """Call ``write`` on ``<path>.tmp``, fsync it, rename it to ``path`` and fsync the directory.
    ``mode``: the file's permission bits, set before any byte is written (a secret is never readable
    by others, not even for a moment); None leaves them to the umask."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666 if mode is None else mode)
        with open(fd, "wb") as f:
            if mode is not None:  # a leftover temporary file keeps its old mode through O_CREAT
                os.fchmod(fd, mode)
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    try:  # the rename itself is durable once the directory entry is on disk
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:  # some filesystems cannot fsync a directory
        pass
    return path


def write_text_atomic(path: str | Path, text: str, mode: int | None = None) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically; ``mode``: its permission bits (default: the umask's)."""
    return _write_atomic(path, lambda f: f.write(text.encode()), mode)


def torch_save_atomic(obj: Any, path: str | Path) -> Path:
    """``torch.save`` ``obj`` to ``path`` atomically."""
    import torch

    return _write_atomic(path, lambda f: torch.save(obj, f))


@contextmanager
def directory_atomic(out: Path) -> Iterator[Path]:
    """A temporary directory beside ``out`` to fill; renamed to ``out`` when the block ends without
    error (a directory another process published meanwhile is kept), removed in every case: ``out``
    never holds a half-written directory."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        yield tmp
        os.chmod(tmp, 0o755)
        try:
            os.replace(tmp, out)
        except OSError:  # another process published it meanwhile
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
