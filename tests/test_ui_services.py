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


def test_no_store_uri_is_on_a_services_command_line(monkeypatch):
    """A store URI with a password reaches MLflow and optuna-dashboard in their environment, never in their
    arguments (a process's command line is readable by every user of the host; its environment is not)."""
    monkeypatch.setattr(ui, "_mlflow_app", lambda: [])
    uri, storage = "postgresql://alice:S3CRETPW@127.0.0.1:55432/mlflow", "postgresql://bob:0THERPW@127.0.0.1:55432/optuna"
    svcs = {s.name: s for s in ui.services(tracking_uri=uri, storage=storage)}
    assert set(svcs) == {"prefect", "mlflow", "optuna-dashboard"}
    assert not [s.cmd for s in svcs.values() if any("PW@" in a for a in s.cmd)], [s.cmd for s in svcs.values()]
    assert svcs["mlflow"].env == {"MLFLOW_BACKEND_STORE_URI": uri}
    assert svcs["optuna-dashboard"].env == {ui.OPTUNA_STORAGE_ENV: storage}
