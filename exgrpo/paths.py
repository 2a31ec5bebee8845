"""Where the project is on disk: the directory its stores (``mlruns/``, ``studies/``, ``.prefect/``) live
in, the Prefect home, and what a running ``exgrpo ui`` serves. It imports nothing of exgrpo, so any
floor can ask (the Prefect home, and the MLflow links of the tracking floor, included)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

UI_SERVER_FILE = "exgrpo-ui.json"
"""In the Prefect home while ``exgrpo ui`` runs: its Prefect API URL, its MLflow UI and the store that
UI serves, and its process (pid and start time)."""


def project_root(start: Path | None = None) -> Path:
    """The nearest directory at or above ``start`` (default: cwd) holding a pyproject.toml; else cwd."""
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        if (d / "pyproject.toml").is_file():
            return d
    return here


def prefect_home(env: Mapping[str, str] | None = None) -> Path:
    """``PREFECT_HOME`` if set, else ``<project>/.prefect``."""
    env = os.environ if env is None else env
    return Path(env["PREFECT_HOME"]).expanduser() if env.get("PREFECT_HOME") else project_root() / ".prefect"


def process_started(pid: int) -> float | None:
    """When process ``pid`` of this host started (seconds since the epoch); None if there is none."""
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def process_alive(pid: int, started: float | None) -> bool:
    """Whether the process ``pid`` that started at ``started`` still runs: a pid reused by another
    process (which started later) is not it. Without ``started``, whether any process has the pid."""
    now = process_started(pid)
    return now is not None and (started is None or abs(now - started) <= 1.0)


def running_ui(home: Path | None = None) -> dict[str, Any] | None:
    """The record of the ``exgrpo ui`` serving ``home`` (default :func:`prefect_home`), if its process
    still runs; else None. Whether its servers answer is the caller's to ask."""
    try:
        record = json.loads(((home or prefect_home()) / UI_SERVER_FILE).read_text())
        pid = int(record["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return record if process_alive(pid, record.get("started")) else None
