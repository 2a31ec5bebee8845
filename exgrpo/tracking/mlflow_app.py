"""``mlflow server --app-name exgrpo`` (what ``exgrpo ui`` runs): MLflow's own server and UI, plus one
page on its origin, :data:`~exgrpo.tracking.mlflow_tracking.OPEN_PATH`, through which every link the
project prints opens MLflow's training runs and keeps them.

MLflow 3.17's UI picks GenAI or "Model training" from the link's ``workflowType``, else from the
browser's ``localStorage`` (key ``mlflow.workflowType_v1``, a JSON string), which only its sidebar
switch writes, else GenAI; so a link with ``?workflowType=machine_learning`` shows the runs, but the
next click inside the app (the experiment, a child run) falls back to GenAI's traces. The page writes
that choice as the switch would, then replaces itself with the MLflow route in its own hash
(``/exgrpo/open#/experiments/1/runs/<id>?workflowType=machine_learning`` opens
``/#/experiments/1/runs/<id>?...``): the hash never reaches the server, and the page only ever opens
a route on MLflow's own origin.

The factory follows MLflow's ``basic-auth`` app: it adds its route to MLflow's Flask app and, under
uvicorn (``mlflow server``'s default), returns MLflow's FastAPI wrapper of it.
"""

from __future__ import annotations

import json

from exgrpo.tracking.mlflow_tracking import OPEN_PATH

WORKFLOW_STORAGE_KEY = "mlflow.workflowType_v1"
"""Where MLflow 3.17's UI keeps the sidebar's "GenAI | Model training" choice: its ``useLocalStorage``
hook stores ``{key: "mlflow.workflowType", version: 1}`` under ``<key>_v<version>``, as JSON."""
TRAINING_VIEW = "machine_learning"
"""The value of that choice for "Model training"."""

PAGE = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>MLflow</title></head>
<body>
<noscript>MLflow's UI needs JavaScript.</noscript>
<script>
try {{ localStorage.setItem({json.dumps(WORKFLOW_STORAGE_KEY)}, {json.dumps(json.dumps(TRAINING_VIEW))}); }}
catch (e) {{ /* storage refused (a private window's policy): the link's own workflowType still applies */ }}
location.replace("../" + (location.hash || "#/experiments"));
</script>
</body></html>
"""


def _open_page():
    from flask import Response

    return Response(PAGE, mimetype="text/html", headers={"Cache-Control": "no-store"})


def create_app():
    """The ``mlflow.app`` entry point ``exgrpo``: MLflow's server app with :data:`PAGE` at
    ``OPEN_PATH`` (under ``--static-prefix`` when one is set)."""
    from mlflow.environment_variables import _MLFLOW_SGI_NAME
    from mlflow.server import app
    from mlflow.server.handlers import _add_static_prefix

    app.add_url_rule(_add_static_prefix(OPEN_PATH), "exgrpo_open", _open_page)
    if _MLFLOW_SGI_NAME.get() == "uvicorn":
        from mlflow.server.fastapi_app import create_fastapi_app

        return create_fastapi_app(app)
    return app
