"""Headless Chromium for the browser tests: ``scripts/setup-chromium.sh`` installs it (or
``EXGRPO_CHROMIUM=/path/to/chromium``). Without it the browser tests skip, unless
``EXGRPO_REQUIRE_BROWSER`` is set (CI), where they fail."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
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


def find_chromedriver() -> str:
    """chromedriver (Debian's ``chromium-driver``, installed with Chromium by
    ``scripts/setup-chromium.sh``), or skip (fail under ``EXGRPO_REQUIRE_BROWSER``)."""
    exe = os.environ.get("EXGRPO_CHROMEDRIVER") or shutil.which("chromedriver") or "/usr/bin/chromedriver"
    if not os.access(exe, os.X_OK):
        if _require_browser():
            pytest.fail(f"EXGRPO_REQUIRE_BROWSER is set but chromedriver is not installed ({exe} not executable): "
                        "run scripts/setup-chromium.sh")
        pytest.skip(f"chromedriver not installed ({exe} not executable): run scripts/setup-chromium.sh")
    return exe


class Browser:
    """Chromium driven as a user drives it (W3C WebDriver over HTTP to chromedriver: open a page,
    click what it shows), in a fresh profile; every host but 127.0.0.1 unresolvable."""

    def __init__(self, chromium: str, tmp: Path, patience: float = 240.0) -> None:
        import requests

        from netutil import free_port

        self.patience = patience  # a busy shared machine: a bound on waiting, not a time limit under test
        self.http = requests.Session()
        port = free_port()
        self.driver = subprocess.Popen([find_chromedriver(), f"--port={port}"], stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL, start_new_session=True)
        self.base = f"http://127.0.0.1:{port}"
        self._until(lambda: self._ready(), "chromedriver to start")
        profile = tempfile.mkdtemp(prefix="chromium-", dir=tmp)
        args = ["--headless=new", "--window-size=1600,1000", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
                f"--user-data-dir={profile}"]
        caps = {"capabilities": {"alwaysMatch": {"browserName": "chrome", "pageLoadStrategy": "normal",
                                                 "goog:chromeOptions": {"binary": chromium, "args": args}}}}
        self.session = f"{self.base}/session/" + self._call("post", f"{self.base}/session", caps)["sessionId"]
        self._call("post", f"{self.session}/timeouts", {"pageLoad": int(patience * 1000), "script": 30000})

    def _ready(self) -> bool:
        try:
            return bool(self.http.get(f"{self.base}/status", timeout=5).json()["value"]["ready"])
        except Exception:  # not listening yet
            return False

    def _call(self, method: str, url: str, body: dict | None = None):
        r = self.http.request(method, url, json=body, timeout=self.patience)
        value = r.json().get("value")
        if r.status_code != 200:
            raise RuntimeError(f"webdriver {method.upper()} {url}: {r.status_code} {value}")
        return value

    def _until(self, check, what: str):
        deadline = time.monotonic() + self.patience
        while time.monotonic() < deadline:
            got = check()
            if got:
                return got
            time.sleep(0.5)
        raise AssertionError(f"waited {self.patience:.0f} s for {what}")

    def open(self, url: str) -> None:
        self._call("post", f"{self.session}/url", {"url": url})

    @property
    def url(self) -> str:
        return self._call("get", f"{self.session}/url")

    def dom(self) -> str:
        return self._call("get", f"{self.session}/source")

    def text(self) -> str:
        """What the page shows (its body's rendered text)."""
        return self._call("post", f"{self.session}/execute/sync",
                          {"script": "return document.body ? document.body.innerText : ''", "args": []})

    def wait_text(self, *texts: str) -> str:
        """The page's text once it shows one of ``texts``."""
        return self._until(lambda: t if any(x in (t := self.text()) for x in texts) else None,
                           f"one of {texts} on {self.url}")

    def click(self, xpath: str) -> None:
        """Click the first element at ``xpath`` once the page has one, as a user's click does."""
        def find():
            found = self._call("post", f"{self.session}/elements", {"using": "xpath", "value": xpath})
            return found[0] if found else None

        element = next(iter(self._until(find, f"{xpath} on {self.url}").values()))
        self._call("post", f"{self.session}/element/{element}/click", {})

    def close(self) -> None:
        try:
            self._call("delete", self.session)
        except Exception:  # chromedriver already gone: its process is ended below
            pass
        self.driver.terminate()
        try:
            self.driver.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.driver.kill()
            self.driver.wait(timeout=10)
