"""``exgrpo ui``'s service processes, without its servers: a stand-in process in their place."""

from __future__ import annotations

import os
import sys
import time
import warnings
from pathlib import Path

from exgrpo import ui


def open_files() -> set[Path]:
    fds = Path("/proc/self/fd")
    out = set()
    for fd in fds.iterdir():
        try:
            out.add(Path(os.readlink(fd)))
        except OSError:  # the directory's own descriptor, closed by the time it is read
            pass
    return out


def test_a_services_log_is_written_by_the_service_and_held_open_by_no_one_else(tmp_path, monkeypatch):
    monkeypatch.setattr(ui, "_port_free", lambda host, port: True)
    monkeypatch.setattr(ui, "_ready", lambda url: True)
    svc = ui.Service("stand-in", "http://127.0.0.1:1", "http://127.0.0.1:1/health",
                     [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)  # a file object dropped unclosed says so
        ui.start([svc], tmp_path / "logs", timeout=10)
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)], [str(w.message) for w in caught]
    try:
        assert svc.log == tmp_path / "logs" / "stand-in.log"
        assert svc.log.resolve() not in open_files()
        deadline = time.monotonic() + 30
        while "up" not in svc.log.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert svc.log.read_text() == "up\n"
    finally:
        ui.stop([svc], grace=5)
    assert svc.proc.poll() is not None
