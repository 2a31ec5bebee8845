"""The project's one Prefect home (exgrpo/prefect_home.py): which home and API a command's flows use."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from exgrpo.prefect_home import UI_SERVER_FILE, announce_server, use_prefect_home, withdraw_server


class _Health(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(200 if self.path == "/api/health" else 404)
        self.end_headers()
        self.wfile.write(b"true")

    def log_message(self, *args):
        pass


@pytest.fixture
def api():
    """A server answering Prefect's health URL, as `exgrpo ui`'s does."""
    server = HTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/api"
    server.shutdown()


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


def test_flows_run_on_the_server_of_a_running_exgrpo_ui(tmp_path, api):
    home = tmp_path / "home"
    announce_server(home, api)
    env = {"PREFECT_HOME": str(home)}
    use_prefect_home(env)
    assert env["PREFECT_API_URL"] == api
    user = {"PREFECT_HOME": str(home), "PREFECT_API_URL": "http://127.0.0.1:1/api"}
    use_prefect_home(user)
    assert user["PREFECT_API_URL"] == "http://127.0.0.1:1/api"  # the user's own server wins
    withdraw_server(home)
    assert not (home / UI_SERVER_FILE).exists()
    env = {"PREFECT_HOME": str(home)}
    use_prefect_home(env)
    assert "PREFECT_API_URL" not in env


def test_a_record_left_by_a_killed_ui_is_ignored(tmp_path, api):
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    (tmp_path / UI_SERVER_FILE).write_text(json.dumps({"api_url": api, "pid": proc.pid}))
    env = {"PREFECT_HOME": str(tmp_path)}
    use_prefect_home(env)
    assert "PREFECT_API_URL" not in env

