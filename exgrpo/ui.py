"""``exgrpo ui``: the Prefect server, the MLflow UI and optuna-dashboard on loopback, over the
project's local stores; prints the URLs, stops all three on Ctrl-C.

Stores: MLflow ``<project>/mlruns/mlflow.db`` (artifacts ``<project>/mlruns/artifacts``), Optuna
``<project>/studies/optuna.db``, Prefect the project's one home (:mod:`exgrpo.prefect_home`:
``$PREFECT_HOME``, default ``<project>/.prefect``), where ``exgrpo compare`` and ``sweep`` record
their flow runs. While it runs, those commands run their flows on its Prefect server.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from exgrpo.errors import redact_uri
from exgrpo.prefect_home import announce_server, prefect_home, use_prefect_home, withdraw_server
from exgrpo.sqlite_wal import sqlite_file
from exgrpo.sweep import resolve_storage
from exgrpo.tracking.mlflow_tracking import artifact_root, project_root, resolve_tracking_uri, ui_link

MLFLOW_APP = "exgrpo"
"""``mlflow server --app-name``: MLflow's server with the page that opens the training runs
(:mod:`exgrpo.tracking.mlflow_app`, registered under the ``mlflow.app`` entry points in pyproject.toml)."""


@dataclass
class Service:
    name: str
    url: str
    health: str
    cmd: list[str]
    env: dict[str, str] = field(default_factory=dict)
    """What the service reads from its environment: the stores' URIs, which may hold a password (a process's
    command line is readable by every user of the host, its environment by its owner only)."""
    proc: subprocess.Popen | None = None
    log: Path | None = None


OPTUNA_STORAGE_ENV = "EXGRPO_OPTUNA_STORAGE"

_OPTUNA_DASHBOARD = ("import os, sys; from importlib.metadata import entry_points; "
                     f"sys.argv[1:1] = [os.environ.pop({OPTUNA_STORAGE_ENV!r})]; "
                     "entry_points(group='console_scripts')['optuna-dashboard'].load()()")
"""optuna-dashboard's own command, given its storage from the environment (it reads it only from its
arguments or a file)."""


def _exe(name: str) -> str:
    local = Path(sys.executable).parent / name
    found = str(local) if local.exists() else shutil.which(name)
    if not found:
        raise RuntimeError(f"`{name}` not found next to {sys.executable} or on PATH; install the orchestration "
                           "extra: pip install -e '.[orchestration]'")
    return found


def _port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def _ready(url: str) -> bool:
    import requests

    try:
        return requests.get(url, timeout=2).status_code == 200
    except requests.RequestException:
        return False


def _mlflow_app() -> list[str]:
    """The ``--app-name`` flag, once the installed project registers the app (an install older than
    the app has no such entry point, and ``mlflow server`` would exit on it)."""
    from importlib.metadata import entry_points

    if not any(ep.name == MLFLOW_APP for ep in entry_points(group="mlflow.app")):
        raise RuntimeError(f"the MLflow app `{MLFLOW_APP}` is not registered in this environment (an install older "
                           "than pyproject.toml): reinstall the project, `pip install --no-deps -e .`")
    return ["--app-name", MLFLOW_APP]


def services(host: str = "127.0.0.1", prefect_port: int = 4200, mlflow_port: int = 5000, optuna_port: int = 8080,
             tracking_uri: str | None = None, storage: str | None = None) -> list[Service]:
    """The commands (not started)."""
    uri = resolve_tracking_uri(tracking_uri)
    out = [Service("prefect", f"http://{host}:{prefect_port}", f"http://{host}:{prefect_port}/api/health",
                   [_exe("prefect"), "server", "start", "--host", host, "--port", str(prefect_port)])]
    db = sqlite_file(uri)
    if db is not None:
        db.parent.mkdir(parents=True, exist_ok=True)
        out.append(Service("mlflow", f"http://{host}:{mlflow_port}", f"http://{host}:{mlflow_port}/health", [
            _exe("mlflow"), "server", "--host", host, "--port", str(mlflow_port),
            "--artifacts-destination", str(db.parent / "artifacts"), "--workers", "1", *_mlflow_app()],
            {"MLFLOW_BACKEND_STORE_URI": uri}))
    elif "://" in uri and not uri.startswith(("http://", "https://", "file:")):  # a database (team mode: PostgreSQL)
        dest = artifact_root(uri) or project_root() / "mlruns" / "artifacts"
        out.append(Service("mlflow", f"http://{host}:{mlflow_port}", f"http://{host}:{mlflow_port}/health", [
            _exe("mlflow"), "server", "--host", host, "--port", str(mlflow_port),
            "--artifacts-destination", str(dest), "--workers", "1", *_mlflow_app()],
            {"MLFLOW_BACKEND_STORE_URI": uri}))
    storage = resolve_storage(storage)
    _exe("optuna-dashboard")  # installed: its entry point runs below, with the storage out of its arguments
    out.append(Service("optuna-dashboard", f"http://{host}:{optuna_port}", f"http://{host}:{optuna_port}/api/studies",
                       [sys.executable, "-c", _OPTUNA_DASHBOARD, "--host", host, "--port", str(optuna_port),
                        "--server", "wsgiref"], {OPTUNA_STORAGE_ENV: storage}))
    return out


def start(svcs: list[Service], log_dir: Path, timeout: float = 120.0) -> None:
    """Start every service in its own process group; wait until each answers its health URL."""
    import optuna

    for s in svcs:
        port = int(s.url.rsplit(":", 1)[1])
        if not _port_free(s.url.split("//")[1].rsplit(":", 1)[0], port):
            raise RuntimeError(f"{s.name}: port {port} is in use; pick another (see `exgrpo ui --help`)")
    for s in svcs:
        if s.name == "optuna-dashboard":  # the dashboard needs the storage to exist
            optuna.storages.RDBStorage(s.env[OPTUNA_STORAGE_ENV])
    log_dir.mkdir(parents=True, exist_ok=True)
    env = os.environ.copy()
    use_prefect_home(env, find_server=False)
    # the UI is what this command is for, whatever a shell or profile says (PREFECT_SERVER_UI_ENABLED=false
    # serves the API alone, and every page of the UI answers 404)
    env.update(PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_SERVER_UI_ENABLED="true",
               MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    for s in svcs:  # Prefect's UI calls the API at PREFECT_API_URL, else port 4200: this server's, whatever its port
        if s.name == "prefect" and not env.get("PREFECT_UI_API_URL"):
            env["PREFECT_UI_API_URL"] = f"{s.url}/api"
    for s in svcs:
        s.log = log_dir / f"{s.name}.log"
        # the service writes its log through its own copy of the descriptor: this process keeps none open
        with s.log.open("w") as log:
            s.proc = subprocess.Popen(s.cmd, stdout=log, stderr=subprocess.STDOUT, env={**env, **s.env},
                                      start_new_session=True)
    deadline = time.monotonic() + timeout
    pending = list(svcs)
    while pending:
        for s in list(pending):
            if s.proc.poll() is not None:
                stop(svcs)
                tail = s.log.read_text()[-2000:] if s.log else ""
                raise RuntimeError(f"{s.name} exited with code {s.proc.returncode}; log {s.log}:\n{tail}")
            if _ready(s.health):
                pending.remove(s)
        if pending and time.monotonic() > deadline:
            stop(svcs)
            raise RuntimeError(f"not ready after {timeout:.0f} s: {[s.name for s in pending]} (logs in {log_dir})")
        time.sleep(0.5)


def stop(svcs: list[Service], grace: float = 10.0) -> None:
    """SIGTERM each service's process group (twice for Prefect), then SIGKILL what is left."""
    for s in svcs:
        if s.proc is not None and s.proc.poll() is None:
            try:
                os.killpg(s.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace
    for s in svcs:
        if s.proc is None:
            continue
        try:
            s.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(s.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            s.proc.wait(timeout=5)


def kill(svcs: list[Service]) -> None:
    """SIGKILL each service's process group now (a second Ctrl-C while they stop)."""
    for s in svcs:
        if s.proc is not None and s.proc.returncode is None:
            try:
                os.killpg(s.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def main(host: str = "127.0.0.1", prefect_port: int = 4200, mlflow_port: int = 5000, optuna_port: int = 8080,
         tracking_uri: str | None = None, storage: str | None = None) -> int:
    svcs = services(host, prefect_port, mlflow_port, optuna_port, tracking_uri, storage)
    home = prefect_home()
    log_dir = home / "ui-logs"

    # the signal that stops it, first; once it stops, another signal kills what is left instead of
    # interrupting the stop, which would leave the services running (they are in sessions of their own)
    stopping: list[int] = []

    def _interrupt(signum, frame):  # SIGTERM, and SIGINT even when started in the background
        if stopping:
            kill(svcs)
            return
        stopping.append(signum)
        raise KeyboardInterrupt

    def stopped_by(signum: int) -> bool:  # (an interrupt raised elsewhere counts as Ctrl-C)
        stopping.append(signum)
        return stopping[0] == signal.SIGTERM

    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    print("starting " + ", ".join(s.name for s in svcs) + f" (logs in {log_dir}) ...", flush=True)
    t0 = time.monotonic()
    try:
        start(svcs, log_dir)
    except KeyboardInterrupt:
        terminated = stopped_by(signal.SIGINT)
        stop(svcs)
        return 143 if terminated else 130
    try:
        api = f"http://{host}:{prefect_port}/api"
        mlflow = next((s.url for s in svcs if s.name == "mlflow"), None)
        # `exgrpo compare` and `sweep` now run their flows on this server, and the MLflow links the
        # project prints for this store point at this UI
        announce_server(home, api, mlflow, resolve_tracking_uri(tracking_uri) if mlflow else None)
        print(f"ready in {time.monotonic() - t0:.1f} s:")
        for s in svcs:
            print(f"  {s.name:17s} {ui_link(s.url, '/experiments') if s.name == 'mlflow' else s.url}")
        print(f"\nPrefect home: {home} (`exgrpo compare` and `sweep` run their flows on this server while it runs)")
        print(f"export PREFECT_API_URL={api}   # for `prefect deploy`, `prefect worker start` (prefect.yaml)")
        if any(s.name == "mlflow" for s in svcs):
            store = redact_uri(resolve_tracking_uri(tracking_uri))
            print(f"MLflow store: {store} (the UI reads the same file). The links the "
                  "project prints open MLflow on \"Model training\" and keep it there in that browser; opened any other "
                  "way, MLflow shows GenAI traces until \"Model training\" is chosen once at the top of its sidebar")
        print("Ctrl-C stops all.", flush=True)
        while all(s.proc.poll() is None for s in svcs):
            time.sleep(1)
        stopped_by(0)
        dead = [s for s in svcs if s.proc.poll() is not None]
        print(f"{dead[0].name} exited (code {dead[0].proc.returncode}); stopping the others", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        terminated = stopped_by(signal.SIGINT)
        print("\nstopping ...", flush=True)
        return 143 if terminated else 0  # Ctrl-C is how it is meant to end; SIGTERM, as every command, 143
    finally:
        withdraw_server(home)
        stop(svcs)
