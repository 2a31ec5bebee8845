"""The project's one Prefect home: every command that talks to Prefect uses :func:`use_prefect_home`.

Those commands are ``exgrpo compare`` and ``exgrpo sweep`` (and ``make demo``, which runs
``exgrpo compare``), whose flows run on Prefect's local API, and ``exgrpo ui``, which serves the
Prefect UI; the deployments of ``prefect.yaml`` run on the server ``exgrpo ui`` starts. A flow run
of any of them is therefore in the one database ``exgrpo ui`` shows.

* The home: ``PREFECT_HOME`` when the user set it, else ``<project>/.prefect`` (beside ``mlruns/``
  and ``studies/``). The user's Prefect profiles stay where they are (``~/.prefect/profiles.toml``
  unless ``PREFECT_PROFILES_PATH`` says otherwise), so a profile's settings still apply.
* The API: ``PREFECT_API_URL`` when the user set it; else, while ``exgrpo ui`` runs on this home,
  its server (the flow run shows there as it runs; :func:`announce_server` is how ``exgrpo ui``
  says so); else Prefect's temporary local server on the home's database, which ``exgrpo ui``
  serves afterwards.

Prefect reads its settings once, when it is imported: this runs before any ``import prefect``.
"""

from __future__ import annotations

import json
import os
from collections.abc import MutableMapping
from pathlib import Path

from exgrpo.paths import UI_SERVER_FILE, prefect_home, process_started, running_ui

RUNTIME_SETTINGS = {"PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90"}
"""What Prefect needs on these machines (stack-notes.md §10), unless the environment sets it."""


def running_ui_api(home: Path) -> str | None:
    """The API URL of the ``exgrpo ui`` serving ``home``, if one runs and answers; else None."""
    record = running_ui(home)
    if record is None or "api_url" not in record:
        return None
    import requests

    url = str(record["api_url"])
    try:
        return url if requests.get(url.rstrip("/") + "/health", timeout=2).status_code == 200 else None
    except requests.RequestException:
        return None


def use_prefect_home(env: MutableMapping[str, str] | None = None, find_server: bool = True) -> Path:
    """Point Prefect at the project's home (and, with ``find_server``, a running ``exgrpo ui``'s API) in
    ``env`` (default: this process's environment, so also every process it starts); returns the home.
    A user's own settings are kept."""
    env = os.environ if env is None else env
    home = prefect_home(env)
    if not env.get("PREFECT_HOME"):
        env["PREFECT_HOME"] = str(home)
        env.setdefault("PREFECT_PROFILES_PATH", str(Path("~/.prefect/profiles.toml").expanduser()))
    for k, v in RUNTIME_SETTINGS.items():
        env.setdefault(k, v)
    if find_server and not env.get("PREFECT_API_URL"):
        url = running_ui_api(home)
        if url is not None:
            env["PREFECT_API_URL"] = url
    return home


def announce_server(home: Path, api_url: str, mlflow_url: str | None = None, mlflow_store: str | None = None) -> Path:
    """Record that this process serves ``home``'s Prefect API at ``api_url`` (``exgrpo ui``), and the
    MLflow UI at ``mlflow_url`` for the store ``mlflow_store``: the links the project prints for that
    store then point there. The record is the owner's alone (0600): a team-mode store URI carries
    the database password."""
    from exgrpo.atomic import write_text_atomic

    home.mkdir(parents=True, exist_ok=True)
    record = {"api_url": api_url, "pid": os.getpid(), "started": process_started(os.getpid()),
              "mlflow_url": mlflow_url, "mlflow_store": mlflow_store}
    return write_text_atomic(home / UI_SERVER_FILE, json.dumps(record), mode=0o600)


def withdraw_server(home: Path) -> None:
    """Remove this process's record from ``home`` (leaves another process's)."""
    path = home / UI_SERVER_FILE
    try:
        if json.loads(path.read_text()).get("pid") == os.getpid():
            path.unlink()
    except (OSError, ValueError):
        pass
