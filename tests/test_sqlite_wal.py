"""The embedded sqlite stores run in WAL mode: a reader never locks the runs' writes out."""

from __future__ import annotations

import sqlite3
import threading

from exgrpo.sqlite_wal import ensure_wal, sqlite_file
from exgrpo.sweep import load_sweep
from exgrpo.sweep.study import open_study
from exgrpo.tracking import Tracker


def journal_mode(path) -> str:
    con = sqlite3.connect(path)
    try:
        return con.execute("PRAGMA journal_mode").fetchone()[0]
    finally:
        con.close()


def test_an_mlflow_write_goes_through_while_a_reader_holds_the_store(tmp_path):
    """In sqlite's default journal mode the write below waits for the reader (and fails with
    `database is locked` after MLflow's 20 s busy timeout); in WAL mode it commits at once."""
    uri = f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}"
    tracker = Tracker(uri)
    run_id = tracker.start_run("wal", "writer")
    assert journal_mode(tmp_path / "mlruns" / "mlflow.db") == "wal"

    reader = sqlite3.connect(tmp_path / "mlruns" / "mlflow.db", timeout=0)
    reader.execute("BEGIN")
    assert reader.execute("SELECT count(*) FROM runs").fetchone()[0] == 1  # a read transaction stays open
    done, errors = threading.Event(), []

    def write() -> None:
        try:
            tracker.client.log_metric(run_id, "m", 1.0, step=0)
            tracker.client.set_tag(run_id, "t", "v")
        except Exception as e:  # noqa: BLE001
            errors.append(e)
        done.set()

    threading.Thread(target=write, daemon=True).start()
    try:
        assert done.wait(15), "the write is blocked by the open read transaction"
        assert not errors, errors
    finally:
        reader.rollback()
        reader.close()
    assert tracker.client.get_run(run_id).data.metrics["m"] == 1.0


def test_a_sweeps_optuna_sqlite_storage_is_in_wal_mode(tmp_path):
    sc = load_sweep({"study": {"name": "wal", "n_trials": 1}, "base": "experiments/toy-exgrpo.yaml", "budget_steps": 2,
                     "space": {"algorithm.experience_ratio": {"type": "float", "low": 0.1, "high": 0.9}}})
    study, _, created = open_study(sc, f"sqlite:///{tmp_path / 'optuna.db'}")
    assert created and journal_mode(tmp_path / "optuna.db") == "wal"
    before = len(study.get_trials())
    study.enqueue_trial({"algorithm.experience_ratio": 0.5})
    assert len(study.get_trials()) == before + 1  # Optuna works on the file as usual


def test_ensure_wal_leaves_other_stores_alone(tmp_path):
    assert sqlite_file("postgresql://u@127.0.0.1:55432/db") is None and not ensure_wal("postgresql://u@h/db")
    assert not ensure_wal("sqlite:///:memory:") and not ensure_wal("http://127.0.0.1:5000")
    assert not ensure_wal(f"sqlite:///{tmp_path / 'missing-dir' / 'x.db'}")  # no directory: nothing created
    assert not (tmp_path / "missing-dir").exists()
    assert ensure_wal(f"sqlite:///{tmp_path / 'new.db'}") and journal_mode(tmp_path / "new.db") == "wal"


def test_optuna_storage_urls_resolve_through_the_one_sqlite_parser(tmp_path, monkeypatch):
    """A relative sqlite path becomes absolute with its directory created (Ray workers run
    elsewhere); an in-memory database stays in memory (it used to become a file named ':memory:')."""
    from exgrpo.sweep.space import resolve_storage
    from exgrpo.sweep.study import _storage_exists

    monkeypatch.chdir(tmp_path)
    assert resolve_storage("sqlite:///studies/o.db") == f"sqlite:///{tmp_path.resolve()}/studies/o.db"
    assert (tmp_path / "studies").is_dir() and not _storage_exists(resolve_storage("sqlite:///studies/o.db"))
    assert resolve_storage("sqlite:///:memory:") == "sqlite:///:memory:" and not (tmp_path / ":memory:").exists()
    assert resolve_storage("postgresql://u@127.0.0.1/optuna") == "postgresql://u@127.0.0.1/optuna"


def test_sqlite_uris_with_a_driver_or_options_name_the_right_file(tmp_path, monkeypatch):
    """The one parser is SQLAlchemy's: `?timeout=30` is an option, not part of the file name (it
    used to make WAL mode, the artifact root and `exgrpo ui` point at a file named `x.db?timeout=30`)."""
    from exgrpo.sweep.space import resolve_storage
    from exgrpo.tracking.mlflow_tracking import artifact_root

    assert sqlite_file("sqlite:///runs/x.db?timeout=30").as_posix() == "runs/x.db"
    assert sqlite_file("sqlite+pysqlite:////abs/x.db").as_posix() == "/abs/x.db"
    assert sqlite_file("sqlite://") is None and sqlite_file("sqlite:///") is None
    monkeypatch.chdir(tmp_path)
    assert resolve_storage("sqlite:///studies/o.db?timeout=30") == f"sqlite:///{tmp_path.resolve()}/studies/o.db?timeout=30"

    uri = f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}?timeout=30"
    assert artifact_root(uri) == tmp_path / "mlruns" / "artifacts"
    tracker = Tracker(uri)
    run_id = tracker.start_run("options", "r")
    tracker.client.log_metric(run_id, "m", 1.0, step=0)
    assert journal_mode(tmp_path / "mlruns" / "mlflow.db") == "wal"
    assert sorted(p.name for p in (tmp_path / "mlruns").glob("*.db*")) == ["mlflow.db", "mlflow.db-shm", "mlflow.db-wal"]
