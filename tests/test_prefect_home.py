"""The project's one Prefect home (exgrpo/prefect_home.py): which home and API a command's flows use.

Which API a flow finds while `exgrpo ui` runs is tested against a real Prefect server, the one the e2e
tier already starts (tests/test_prefect_server.py)."""

from __future__ import annotations

from pathlib import Path

from exgrpo.prefect_home import use_prefect_home


def test_the_home_is_the_projects_unless_the_user_set_one(tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text("")
    monkeypatch.chdir(tmp_path)
    env: dict[str, str] = {}
    assert use_prefect_home(env) == tmp_path / ".prefect"
    assert env["PREFECT_HOME"] == str(tmp_path / ".prefect") and "PREFECT_API_URL" not in env
    assert env["PREFECT_PROFILES_PATH"] == str(Path("~/.prefect/profiles.toml").expanduser())  # the user's profiles
    mine = {"PREFECT_HOME": str(tmp_path / "mine"), "PREFECT_SERVER_ANALYTICS_ENABLED": "true"}
    assert use_prefect_home(mine) == tmp_path / "mine"
    assert "PREFECT_PROFILES_PATH" not in mine and mine["PREFECT_SERVER_ANALYTICS_ENABLED"] == "true"


def test_the_ui_record_holding_the_store_uri_is_readable_by_its_owner_only(tmp_path):
    import os
    import stat

    from exgrpo.prefect_home import UI_SERVER_FILE, announce_server

    store = "postgresql://exgrpo:secret@db:5432/mlflow"  # team mode: the URI carries the password
    umask = os.umask(0o022)  # the usual default, under which a plain write is 0644
    try:
        path = announce_server(tmp_path, "http://127.0.0.1:4200/api", "http://127.0.0.1:5000", store)
    finally:
        os.umask(umask)
    assert path == tmp_path / UI_SERVER_FILE and stat.S_IMODE(path.stat().st_mode) == 0o600
    path.chmod(0o644)  # an older record, readable by all: rewriting it tightens it too
    announce_server(tmp_path, "http://127.0.0.1:4200/api", "http://127.0.0.1:5000", store)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert not list(tmp_path.glob("*.tmp"))
