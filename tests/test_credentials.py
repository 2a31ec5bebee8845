"""A store URI's password is never shown nor written where others read it.

A run tracked to ``http://alice:<password>@127.0.0.1:<port>`` (a real ``mlflow server``: it ignores the
credentials, but MLflow's client sends them and builds its own lines from the URI) keeps the password
out of what the commands print (their own lines and MLflow's "View run ... at" lines), out of the MLflow
store (params, tags, artifacts) and out of Prefect's records; the files that must hold the full URI to
work (``mlflow_run.json``, the pending-sync marker) are readable by their owner alone.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from exgrpo.errors import one_line, redact_uri
from mlflowserver import Server

pytestmark = pytest.mark.e2e

PASSWORD = "S3CRETPW"
ROOT = Path(__file__).resolve().parent.parent
SMALL = ["--set", "task.max_operand=4", "--set", "policy.hidden=16", "--set", "train.batch_size=8",
         "--set", "algorithm.group_size=4"]
"""A toy run small enough to take a second a step."""

ENV_SET_BY_TRACKING = ("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "MLFLOW_HTTP_REQUEST_MAX_RETRIES",
                       "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "MLFLOW_HTTP_REQUEST_TIMEOUT")
"""Variables a tracker sets in its process for an http store: restored after an in-process command."""


@pytest.mark.parametrize("uri, shown", [
    ("http://alice:S3CRETPW@127.0.0.1:5000", "http://alice:***@127.0.0.1:5000"),
    ("https://alice:S3CRETPW@mlflow.example.org/prefix/", "https://alice:***@mlflow.example.org/prefix/"),
    ("postgresql+psycopg2://exgrpo:S3CRETPW@db:5432/mlflow?sslmode=require",
     "postgresql+psycopg2://exgrpo:***@db:5432/mlflow?sslmode=require"),
    ("postgresql://exgrpo:p%40ss@127.0.0.1:55432/optuna", "postgresql://exgrpo:***@127.0.0.1:55432/optuna"),
    ("mysql://u:pa@ss@host/db", "mysql://u:***@host/db"),  # an unescaped @ in the password: the last @ ends it
    ("postgresql://host/db?user=u&password=S3CRETPW", "postgresql://host/db?user=u&password=***"),
    ("postgresql://u:p/w@host/db", "postgresql://u:***@host/db"),  # the characters a generated password holds
    ("postgresql://u:p?w#x@host:5432/db", "postgresql://u:***@host:5432/db"),
    ("http://u:pw@host/x?mail=a@b.c", "http://u:***@host/x?mail=a@b.c"),  # an @ after the host is not the password's
    ("http://alice@127.0.0.1:5000", "http://alice@127.0.0.1:5000"),  # no password: nothing to hide
    ("http://127.0.0.1:5000", "http://127.0.0.1:5000"),
    ("sqlite:////tmp/mlruns/mlflow.db", "sqlite:////tmp/mlruns/mlflow.db"),
    ("file:///tmp/mlruns", "file:///tmp/mlruns"),
    ("/tmp/user:name@host/mlruns", "/tmp/user:name@host/mlruns"),  # a path, not a URI
    ("models:/exgrpo-toy@champion", "models:/exgrpo-toy@champion"),
])
def test_redact_uri_hides_the_password_and_nothing_else(uri, shown):
    assert redact_uri(uri) == shown


def test_a_password_in_an_error_message_is_hidden_in_its_line():
    # what MLflow raises when a request fails: the URL it built from the store's URI, credentials included
    error = RuntimeError("API request to http://alice:S3CRETPW@127.0.0.1:5000/api/2.0/mlflow/runs/create failed "
                         "with exception HTTPConnectionPool(host='127.0.0.1', port=5000)")
    line = one_line(error, None)
    assert PASSWORD not in line and "http://alice:***@127.0.0.1:5000/api/2.0/mlflow/runs/create" in line


def test_the_files_that_hold_the_full_uri_are_its_owners_alone(tmp_path):
    from exgrpo.tracking.run_record import read_record, write_record
    from exgrpo.tracking.sync import PENDING_FILE, write_pending

    uri = f"http://alice:{PASSWORD}@127.0.0.1:5000"
    write_record(tmp_path, uri, "run-1")
    marker = write_pending(tmp_path, uri, "run-1", "FINISHED", {"final/val/accuracy": 0.5})
    for f in (tmp_path / "mlflow_run.json", tmp_path / PENDING_FILE):
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    assert read_record(tmp_path).tracking_uri == uri  # whole: a resume and `exgrpo sync` use it
    assert json.loads(marker.read_text())["tracking_uri"] == uri


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("mlflow"))
    srv.start()
    yield srv
    srv.kill()


def _with_password(url: str) -> str:
    return url.replace("http://", f"http://alice:{PASSWORD}@", 1)


def _files_holding_password(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and PASSWORD.encode() in p.read_bytes()]


def test_the_links_to_a_store_with_a_password_carry_none(monkeypatch):
    from exgrpo.tracking.mlflow_tracking import experiment_url, run_link, run_url, ui_command

    monkeypatch.delenv("EXGRPO_MLFLOW_UI", raising=False)
    uri = f"http://alice:{PASSWORD}@127.0.0.1:5000"
    url = run_url("1", "abc", uri)
    assert url.startswith("http://127.0.0.1:5000/") and "/experiments/1/runs/abc" in url, url  # a link that opens
    assert run_link(url, uri) == {"mlflow_url": url}
    assert experiment_url("1", uri).startswith("http://127.0.0.1:5000/")
    assert ui_command(f"postgresql://exgrpo:{PASSWORD}@127.0.0.1:55432/mlflow") == (
        "exgrpo ui --tracking-uri postgresql://exgrpo:***@127.0.0.1:55432/mlflow")


def test_the_sweep_records_its_storage_without_the_password(tmp_path):
    import optuna
    from mlflow import MlflowClient

    from exgrpo.sweep import base_config, load_sweep
    from exgrpo.sweep.runner import _parent_run
    from exgrpo.tracking import Tracker

    sc = load_sweep("experiments/toy-sweep.yaml", {})
    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db")
    storage = f"postgresql://exgrpo:{PASSWORD}@127.0.0.1:55432/optuna"
    parent = _parent_run(tracker, sc, base_config(sc), optuna.create_study(), "sweep-credentials", storage)
    params = MlflowClient(tracker.uri).get_run(parent).data.params
    assert params["optuna.storage"] == "postgresql://exgrpo:***@127.0.0.1:55432/optuna"


def test_a_train_through_a_uri_with_a_password_names_its_run_at_once_and_the_password_nowhere(server, tmp_path):
    """``exgrpo train`` to the server through a URI with a password, stopped (SIGTERM) once it trains: it
    has named its MLflow run, its store and its link as the run started; neither its lines nor MLflow's
    ("View run ... at", as the run ends KILLED) show the password, nor does the MLflow store; the run's
    record holds the whole URI, for its owner alone."""
    import threading

    uri = _with_password(server.url)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.Popen([sys.executable, "-m", "exgrpo.cli", "train", "experiments/toy-exgrpo.yaml", *SMALL,
                             "--max-steps", "100000", "--set", "train.epochs=100000", "--no-progress",
                             "--output-dir", str(tmp_path / "runs"), "--tracking-uri", uri],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 180  # a hang guard
        while not any(p.stat().st_size for p in (tmp_path / "runs").rglob("metrics.jsonl")):
            assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)[-3000:]
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 143
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(timeout=60)
    said = "".join(lines)
    assert PASSWORD not in said, said[-3000:]
    (record,) = (tmp_path / "runs").rglob("mlflow_run.json")
    run_id = json.loads(record.read_text())["run_id"]
    started = [line for line in lines if line.startswith("MLflow run ")]
    assert started, said[-3000:]
    assert run_id in started[0] and f"http://alice:***@127.0.0.1:{server.port}" in started[0], started[0]
    assert f"{server.url}/" in started[0], started[0]  # its link, which opens as it is

    assert stat.S_IMODE(record.stat().st_mode) == 0o600
    assert json.loads(record.read_text())["tracking_uri"] == uri  # whole: a resume reaches the store with it
    assert [p for p in _files_holding_password(tmp_path / "runs") if p != record] == []
    assert _files_holding_password(server.root) == [], "the password reached the MLflow store"
    from mlflow import MlflowClient

    assert MlflowClient(server.url).get_run(run_id).info.status == "KILLED"


def test_prefect_records_no_password_of_a_sweep_it_runs(server, tmp_path, capsys, monkeypatch):
    """``exgrpo sweep`` through its Prefect flow with a tracking URI and an Optuna storage URL that carry
    passwords: neither reaches Prefect's records (the flow run's parameters, its logs, its state). The
    storage's database is not there, so the flow fails in its first second, with one line, once its
    parameters are recorded (no trial, no Ray)."""
    from exgrpo.cli import main
    from netutil import free_port

    for var in (*ENV_SET_BY_TRACKING, "EXGRPO_OPTUNA_STORAGE"):
        monkeypatch.delenv(var, raising=False)
    storage = f"postgresql://exgrpo:{PASSWORD}@127.0.0.1:{free_port()}/optuna"
    assert main(["sweep", "experiments/toy-sweep.yaml", "--storage", storage, "--tracking-uri",
                 _with_password(server.url), "--set", f"study.name=credentials-{os.getpid()}"]) == 2
    out, err = capsys.readouterr()
    assert "error: Optuna storage postgresql://exgrpo:***@127.0.0.1:" in err and "is not reachable" in err, err
    assert PASSWORD not in out + err
    assert "EXGRPO_OPTUNA_STORAGE" not in os.environ  # the flow had it for its run, no longer
    home = Path(os.environ["PREFECT_HOME"])
    assert list(home.rglob("*.db")), f"no Prefect database under {home}"
    assert _files_holding_password(home) == [], "the password reached Prefect's records"


def test_an_unexpected_errors_traceback_hides_a_password(monkeypatch, capsys):
    """An error no command expects ends with Python's traceback and exit 1, as before, but with any URI's
    password hidden: MLflow's errors name the URL they requested, credentials included."""
    from exgrpo import cli

    def fails(argv):
        raise RuntimeError("API request to http://alice:S3CRETPW@127.0.0.1:5000/api/2.0/mlflow/runs/get failed")

    monkeypatch.setattr(cli, "_main", fails)
    assert cli.main(["runs"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):") and "RuntimeError: API request to" in err, err
    assert "S3CRETPW" not in err and "http://alice:***@127.0.0.1:5000" in err, err
