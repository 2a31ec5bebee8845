"""Headless Chromium for the browser tests: ``scripts/setup-chromium.sh`` installs it (or
``EXGRPO_CHROMIUM=/path/to/chromium``). Without it the browser tests skip, unless
``EXGRPO_REQUIRE_BROWSER`` is set (CI), where they fail."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest


def _require_browser() -> bool:
    return os.environ.get("EXGRPO_REQUIRE_BROWSER", "").strip().lower() not in ("", "0", "false", "no")


def find_chromium() -> str:
    """The Chromium executable, or skip (fail under ``EXGRPO_REQUIRE_BROWSER``)."""
    exe = os.environ.get("EXGRPO_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    if not os.access(exe, os.X_OK):
        if _require_browser():
            pytest.fail(f"EXGRPO_REQUIRE_BROWSER is set but chromium is not installed ({exe} not executable): "
                        "run scripts/setup-chromium.sh")
        pytest.skip(f"chromium not installed ({exe} not executable): run scripts/setup-chromium.sh; "
                    "EXGRPO_REQUIRE_BROWSER=1 makes this a failure instead of a skip")
    return exe


def _run(exe: str, tmp: Path, args: list[str], wait_ms: int | None) -> subprocess.CompletedProcess:
    profile = tempfile.mkdtemp(prefix="chromium-", dir=tmp)
    # a single-page app: the new headless mode, a budget of the page's time for its API calls, and a
    # desktop window (in the default 800x600 the Prefect UI's run list renders no rows)
    mode = ["--headless=new", f"--virtual-time-budget={wait_ms}", "--window-size=1600,1000"] if wait_ms else ["--headless"]
    cmd = [exe, *mode, "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--disable-dev-shm-usage", "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
           f"--user-data-dir={profile}", *args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=150)
    assert p.returncode == 0, p.stderr[-3000:]
    return p


def dump_dom(exe: str, url: str, tmp: Path, wait_ms: int | None = None) -> str:
    """The DOM after load (``wait_ms``: after that much of the page's own time, for a single-page
    app), from headless Chromium; every host but 127.0.0.1 unresolvable."""
    p = _run(exe, tmp, ["--dump-dom", url], wait_ms)
    assert "<body" in p.stdout, p.stderr[-3000:]
    return p.stdout



def app_dom(exe: str, url: str, tmp: Path, expect: str, tries: int = 3, wait_ms: int = 20000) -> str:
    """The DOM of a single-page app once it shows ``expect`` (up to ``tries`` loads: its first load on a
    busy machine may still be fetching when the budget ends); the last DOM if it never does."""
    for _ in range(tries):
        dom = dump_dom(exe, url, tmp, wait_ms)
        if expect in dom:
            break
    return dom
