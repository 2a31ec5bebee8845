"""Where the project is on disk: the directory its stores (``mlruns/``, ``studies/``, ``.prefect/``) live
in. It imports nothing of exgrpo, so any floor can ask, the Prefect home included."""

from __future__ import annotations

from pathlib import Path


def project_root(start: Path | None = None) -> Path:
    """The nearest directory at or above ``start`` (default: cwd) holding a pyproject.toml; else cwd."""
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        if (d / "pyproject.toml").is_file():
            return d
    return here
