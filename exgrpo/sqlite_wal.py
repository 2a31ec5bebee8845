"""The embedded default's sqlite stores (MLflow's ``mlruns/mlflow.db``, Optuna's study file) in
write-ahead-log mode.

In sqlite's default rollback-journal mode a reader locks writers out: the MLflow UI or a dashboard
reading a store while a sweep's trials write to it, or two trials writing at once, wait on each other
and, past the busy timeout, fail with ``database is locked`` (MLflow sets a 20 s timeout; Optuna
none). In WAL mode readers never block the one writer, and a commit appends to the log instead of
rewriting a journal. The mode is a property of the database file, so setting it once covers every
process that opens the file afterwards: MLflow's, Optuna's, Ray workers', ``exgrpo ui``'s. Neither
library sets it (MLflow 3.17, Optuna 5.0). WAL needs the processes on one host: a sqlite store on a
network filesystem is not supported in any mode; team mode uses PostgreSQL.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

_DONE: set[Path] = set()


def _sqlite_url(uri: str):
    """The parsed SQLAlchemy URL of a sqlite URI (any driver: ``sqlite+pysqlite://...``); else None."""
    if not uri.startswith("sqlite"):
        return None
    from sqlalchemy.engine import make_url  # SQLAlchemy's own parser: the URL means what it means to MLflow and Optuna
    from sqlalchemy.exc import ArgumentError

    try:
        url = make_url(uri)
    except ArgumentError:
        return None
    return url if url.get_backend_name() == "sqlite" else None


def _uri_filename(url) -> bool:
    """The database is named in sqlite's own URI form (``file:<path>`` with ``?uri=true``)."""
    return url.query.get("uri") == "true" and (url.database or "").startswith("file:")


def sqlite_file(uri: str) -> Path | None:
    """The database file of a sqlite URI (``sqlite:///<path>``, with or without options such as
    ``?timeout=30``); None for other URIs and in-memory databases."""
    url = _sqlite_url(uri)
    db = url.database if url is not None else None
    if db and _uri_filename(url):
        db = db.removeprefix("file:")
    return Path(db) if db and db != ":memory:" else None


def with_sqlite_file(uri: str, path: Path) -> str:
    """``uri`` with its database file replaced by ``path``, its driver and options kept."""
    url = _sqlite_url(uri)
    if url is None:
        raise ValueError(f"not a sqlite URI: {uri!r}")
    if _uri_filename(url):
        path = f"file:{path}"
    return url.set(database=str(path)).render_as_string(hide_password=False)


def ensure_wal(uri: str) -> bool:
    """Put the sqlite database of ``uri`` in WAL mode (creating an empty file if there is none; its
    directory must exist). True when it is in WAL mode; False for other stores, or when another
    process holds the database right now (the next call tries again). Once per file per process."""
    path = sqlite_file(uri)
    if path is None:
        return False
    path = path.resolve()
    if path in _DONE:
        return True
    try:
        con = sqlite3.connect(path, timeout=5.0)
        try:
            mode = con.execute("PRAGMA journal_mode").fetchone()[0]
            if mode.lower() != "wal":
                mode = con.execute("PRAGMA journal_mode=WAL").fetchone()[0]  # answers the mode now in force
        finally:
            con.close()
    except sqlite3.Error:
        return False
    if mode.lower() != "wal":
        return False
    _DONE.add(path)
    return True
