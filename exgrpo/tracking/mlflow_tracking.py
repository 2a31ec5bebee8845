"""MLflow tracking for exgrpo runs: where the store is, what a run is tagged with, which params
are logged, how metric names are made MLflow-safe, and a step callback for ``train(...)``. Training
itself is started by :mod:`exgrpo.launch`, never here.

Everything goes through an explicit :class:`mlflow.MlflowClient` (never the fluent, process-global
active run), so the same code works in the driver, in Ray workers and inside Prefect flows, and a
child run is a run tagged with ``mlflow.parentRunId``.

Store resolution (first wins): the ``tracking_uri`` argument, ``MLFLOW_TRACKING_URI``, then a local
sqlite file ``<project>/mlruns/mlflow.db`` with artifacts in ``<project>/mlruns/artifacts``.
Team mode: ``MLFLOW_TRACKING_URI=postgresql://...`` (``scripts/setup-postgres.sh``) with
``EXGRPO_ARTIFACT_ROOT`` pointing at a directory every process can write.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse, urlsplit, urlunsplit

from exgrpo.config import ExperimentConfig, flatten, mlflow_param_keys
from exgrpo.errors import UserError, redact_uri
from exgrpo.paths import project_root, running_ui  # project_root re-exported: callers import it from here and exgrpo.tracking
from exgrpo.sqlite_wal import ensure_wal, sqlite_file
from exgrpo.tracking.code_version import code_version_tags
from exgrpo.tracking.names import sanitize_metric_name
from exgrpo.tracking.step_logger import MLflowStepLogger


class TrackingError(UserError, RuntimeError):
    """The tracking store cannot be used (unreachable server, unwritable sqlite directory...)."""


# --------------------------------------------------------------------------------------------
# Where the store is
# --------------------------------------------------------------------------------------------
def default_tracking_uri(root: Path | None = None) -> str:
    """``sqlite:///<project>/mlruns/mlflow.db``."""
    return f"sqlite:///{(root or project_root()) / 'mlruns' / 'mlflow.db'}"


def resolve_tracking_uri(uri: str | None = None) -> str:
    """The argument, else ``MLFLOW_TRACKING_URI``, else :func:`default_tracking_uri`."""
    return uri or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri()


def artifact_root(uri: str) -> Path | None:
    """Local artifact directory of new experiments: ``EXGRPO_ARTIFACT_ROOT`` if set (any database
    store, e.g. a directory on a shared filesystem next to a PostgreSQL store), else next to a
    sqlite store; None for servers, which own theirs, and for other databases without the variable
    (MLflow then uses ``./mlruns`` of the process that creates the experiment)."""
    if uri.startswith(("http://", "https://")):
        return None
    env = os.environ.get("EXGRPO_ARTIFACT_ROOT")
    if env:
        return Path(env).expanduser().resolve()
    db = sqlite_file(uri)
    return db.parent / "artifacts" if db is not None else None


def check_reachable(uri: str, timeout: float = 3.0) -> None:
    """Raise :class:`TrackingError` within ``timeout`` seconds if the store cannot be used.

    http(s): ``GET <uri>/health``; sqlite: the directory can be created and written; other
    database URLs: a TCP connection to host:port.
    """
    parsed, shown = urlparse(uri), redact_uri(uri)
    hint = (f"start one with `exgrpo ui`, or unset MLFLOW_TRACKING_URI to log to the local store "
            f"{default_tracking_uri()}")
    if parsed.scheme in ("http", "https"):
        import requests

        url = uri.rstrip("/") + "/health"
        try:
            r = requests.get(url, timeout=timeout)
        except requests.RequestException as e:
            raise TrackingError(f"MLflow tracking server {shown} is not reachable ({type(e).__name__}: "
                                f"{redact_uri(str(e))}); {hint}") from None
        if r.status_code != 200:
            raise TrackingError(f"MLflow tracking server {shown} answered {redact_uri(url)} with HTTP {r.status_code}; "
                                f"{hint}")
        return
    if parsed.scheme.split("+")[0] == "sqlite":
        db = sqlite_file(uri)
        if db is None:
            raise TrackingError(f"tracking URI {shown!r}: give a file, e.g. {default_tracking_uri()}")
        try:
            db.parent.mkdir(parents=True, exist_ok=True)
            probe = db.parent / f".write-probe-{os.getpid()}"
            probe.write_text("")
            probe.unlink()
        except OSError as e:
            raise TrackingError(f"tracking store {shown}: cannot write to {db.parent} ({e})") from None
        return
    if parsed.scheme in ("file", ""):
        raise TrackingError(f"tracking URI {shown!r}: the MLflow file store is not supported; use a database, "
                            f"e.g. {default_tracking_uri()}")
    host, port = parsed.hostname, parsed.port
    if host:
        default_ports = {"postgresql": 5432, "mysql": 3306, "mssql": 1433}
        port = port or default_ports.get(parsed.scheme.split("+")[0], 0)
        if port:
            try:
                socket.create_connection((host, port), timeout=timeout).close()
            except OSError as e:
                raise TrackingError(f"tracking database {host}:{port} ({parsed.scheme}) is not reachable: {e}") from None


# --------------------------------------------------------------------------------------------
# Names, tags, params
# --------------------------------------------------------------------------------------------

def is_reachable(uri: str, timeout: float = 3.0) -> bool:
    """True when :func:`check_reachable` finds the store usable within ``timeout`` seconds."""
    try:
        check_reachable(uri, timeout)
    except TrackingError:
        return False
    return True

def algo_tag(cfg: ExperimentConfig) -> str:
    """The replay strategy's label: ``grpo`` (no replay), ``exgrpo`` (bucketed pool), ``notebook``, ..."""
    from exgrpo.core.replay import REPLAY_STRATEGIES  # torch: tracking stays light (the CLI, dashboards)

    return REPLAY_STRATEGIES[cfg.algorithm.replay].label_for(cfg.algorithm)


def model_tag(cfg: ExperimentConfig) -> str:
    """The policy's model: the MLP's shape, an HF policy's model name (smollm2, or its directory's), else the kind."""
    p = cfg.policy
    if hasattr(p, "hidden"):
        return f"{p.kind}-{p.hidden}x{p.layers}"
    return str(getattr(p, "model_name", None) or getattr(p, "kind", cfg.tier))


def run_tags(cfg: ExperimentConfig, arm: str | None = None, study: str | None = None,
             extra: Mapping[str, Any] | None = None) -> dict[str, str]:
    """The tags every exgrpo run carries (so one filter gives a side-by-side view)."""
    tags = {
        "algo": algo_tag(cfg),
        "arm": arm or algo_tag(cfg),
        "tier": str(cfg.tier.value),
        "task": str(getattr(cfg.task, "kind", "")),
        "model": model_tag(cfg),
        "seed": str(cfg.seed),
        "study": study or "",
        "budget_steps": str(cfg.train.max_steps or ""),
    }
    tags.update({k: str(v) for k, v in (extra or {}).items()})
    return {k: v for k, v in tags.items() if v != ""}


def curated_params(cfg: ExperimentConfig, extra_keys: Iterable[str] = ()) -> dict[str, str]:
    """A run's MLflow params -> values as strings truncated to MLflow's ``MAX_PARAM_VAL_LENGTH``: the
    config fields that decide its numbers (``mlflow_param_keys``: every field that is not
    ``RESUME_SAFE``, and the ``RESUME_SAFE_PARAM`` ones) plus ``extra_keys`` (e.g. a sweep's space).
    Keys absent from the config are skipped."""
    from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

    flat = flatten(cfg)
    keys = list(dict.fromkeys([*mlflow_param_keys(cfg), *extra_keys]))
    return {sanitize_metric_name(k): str(flat[k])[:MAX_PARAM_VAL_LENGTH] for k in keys if k in flat}


RUNS_VIEW = "workflowType=machine_learning"
"""The query that opens MLflow's UI on training runs. MLflow 3.17 chooses an experiment's page in the
browser: the link's ``workflowType``, else the choice last made with the "GenAI | Model training"
switch at the top of its sidebar (kept per browser), else GenAI (the traces "Overview"). The
experiment's ``mlflow.experimentKind`` tag and the server's settings do not enter into it, so every
link the project prints carries this query."""

OPEN_PATH = "/exgrpo/open"
"""The page that ``mlflow server --app-name exgrpo`` (what ``exgrpo ui`` runs,
:mod:`exgrpo.tracking.mlflow_app`) adds to MLflow's UI: it makes the browser keep "Model training",
as a click on the sidebar's switch would, and opens the MLflow route in its hash. Without it the
link's :data:`RUNS_VIEW` holds for the first page only, and the next click (the experiment, a child
run) is on GenAI again."""


DEFAULT_UI = "http://127.0.0.1:5000"
"""Where ``exgrpo ui`` serves MLflow unless told otherwise."""


def _serving_ui(uri: str) -> str | None:
    """The MLflow UI that a running ``exgrpo ui`` serves for store ``uri``, if one does."""
    record = running_ui()
    return str(record["mlflow_url"]) if record and record.get("mlflow_url") and record.get("mlflow_store") == uri else None


def _without_credentials(url: str) -> str:
    """``url`` without its ``user:password@``: a link to print, which the browser opens as any other
    (asking for a login where the server wants one)."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def _ui(tracking_uri: str | None) -> tuple[str, bool]:
    """(the MLflow UI of the store, whether it has :data:`OPEN_PATH`): the tracking server itself, without
    the credentials of its URI (has it when a running ``exgrpo ui`` serves that address); else
    ``EXGRPO_MLFLOW_UI``, else the UI a running ``exgrpo ui`` serves for this store, else where ``exgrpo ui``
    would serve it: each one ``exgrpo ui``'s."""
    uri = resolve_tracking_uri(tracking_uri)
    if uri.startswith(("http://", "https://")):
        record = running_ui() or {}
        base = _without_credentials(uri).rstrip("/")
        return base, str(record.get("mlflow_url") or "").rstrip("/") == base
    return (os.environ.get("EXGRPO_MLFLOW_UI") or _serving_ui(uri) or DEFAULT_UI).rstrip("/"), True


def ui_base(tracking_uri: str | None = None) -> str:
    """The MLflow UI of the store: the tracking server itself; else ``EXGRPO_MLFLOW_UI``; else the UI
    a running ``exgrpo ui`` serves for this store; else where ``exgrpo ui`` would serve it
    (http://127.0.0.1:5000)."""
    return _ui(tracking_uri)[0]


def ui_command(tracking_uri: str | None = None) -> str | None:
    """The command that serves the store's MLflow UI (``exgrpo ui``, naming the store unless it is the
    default) when nothing serves it now; None when something does: the tracking server itself,
    ``EXGRPO_MLFLOW_UI``, or a running ``exgrpo ui``."""
    uri = resolve_tracking_uri(tracking_uri)
    if uri.startswith(("http://", "https://")) or os.environ.get("EXGRPO_MLFLOW_UI") or _serving_ui(uri):
        return None
    return "exgrpo ui" + ("" if uri == default_tracking_uri() else f" --tracking-uri {redact_uri(uri)}")


def ui_note(tracking_uri: str | None = None) -> str:
    """What serves the store's links, for the line that prints one: the server itself or a running
    ``exgrpo ui``, else the command that would serve it."""
    uri = resolve_tracking_uri(tracking_uri)
    if uri.startswith(("http://", "https://")) or os.environ.get("EXGRPO_MLFLOW_UI"):
        return ""
    command = ui_command(uri)
    return " (served by the running `exgrpo ui`)" if command is None else f" (nothing serves this store now: `{command}` does)"


def run_link(url: str, tracking_uri: str | None = None) -> dict[str, str]:
    """A finished run's MLflow entry for a command's JSON record: ``{"mlflow_url": url}`` where a UI
    serves the store now; else ``{"mlflow_ui": ...}``, the command that serves it (a link to a port
    nothing listens on would only fail)."""
    command = ui_command(tracking_uri)
    if command is None:
        return {"mlflow_url": url}
    return {"mlflow_ui": f"nothing serves this store now; `{command}` does, and lists the run under its experiment"}


def ui_link(base: str, route: str, through_page: bool = True) -> str:
    """A link to MLflow ``route`` (``/experiments/...``) at the UI ``base``, in the training-runs view:
    through :data:`OPEN_PATH` when that UI is ``exgrpo ui``'s (``through_page``), which keeps the view
    for the clicks that follow; else MLflow's own link, whose view holds for its first page."""
    return f"{base.rstrip('/')}{OPEN_PATH if through_page else '/'}#{route}?{RUNS_VIEW}"


def run_url(experiment_id: str, run_id: str, tracking_uri: str | None = None) -> str:
    """Link to a run's page in the MLflow UI, in its training-runs view (:func:`ui_link`)."""
    base, through_page = _ui(tracking_uri)
    return ui_link(base, f"/experiments/{experiment_id}/runs/{run_id}", through_page)


def experiment_url(experiment_id: str | None = None, tracking_uri: str | None = None) -> str:
    """Link to an experiment's runs in the MLflow UI (no id: the list of experiments), in the
    training-runs view (:func:`ui_link`)."""
    base, through_page = _ui(tracking_uri)
    return ui_link(base, f"/experiments/{experiment_id}/runs" if experiment_id else "/experiments", through_page)


# --------------------------------------------------------------------------------------------
# Runs
# --------------------------------------------------------------------------------------------
class Tracker:
    """An MLflow client bound to one store, checked for reachability up front."""

    def __init__(self, tracking_uri: str | None = None, check: bool = True, timeout: float = 3.0) -> None:
        self.uri = resolve_tracking_uri(tracking_uri)
        if self.uri.startswith(("http://", "https://")):
            # MLflow's defaults retry a dead server for minutes; fail a write in seconds instead:
            # the step logger buffers and retries, and `exgrpo sync` completes what never arrived
            for k, v in {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                         "MLFLOW_HTTP_REQUEST_TIMEOUT": "20"}.items():
                os.environ.setdefault(k, v)
            if redact_uri(self.uri) != self.uri:
                # MLflow prints "View run ... at <url>" as a run ends, the URL built from the store's URI
                # with its password; the project prints its own links, without it
                os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
        if check:
            check_reachable(self.uri, timeout)
        ensure_wal(self.uri)  # a sqlite store: readers (the UI, dashboards) never block the runs writing
        from mlflow import MlflowClient

        self.client = MlflowClient(tracking_uri=self.uri)

    def experiment_id(self, name: str) -> str:
        """Get or create the MLflow experiment ``name`` (artifacts next to a sqlite store)."""
        exp = self.client.get_experiment_by_name(name)
        if exp is not None:
            return exp.experiment_id
        root = artifact_root(self.uri)
        location = (root / sanitize_metric_name(name).replace("/", "_")).as_uri() if root else None
        try:
            return self.client.create_experiment(name, artifact_location=location)
        except Exception:  # created concurrently by another process
            exp = self.client.get_experiment_by_name(name)
            if exp is None:
                raise
            return exp.experiment_id

    def start_run(self, experiment: str, run_name: str | None = None, tags: Mapping[str, str] | None = None,
                  parent_run_id: str | None = None) -> str:
        """Create a RUNNING run (a child of ``parent_run_id`` if given), tagged with the code's version
        (:func:`code_version_tags`); returns its id."""
        tags = {**code_version_tags(), **(tags or {})}
        if parent_run_id:
            tags["mlflow.parentRunId"] = parent_run_id
        run = self.client.create_run(self.experiment_id(experiment), run_name=run_name, tags=tags)
        return run.info.run_id

    def continue_run(self, run_id: str, tags: Mapping[str, str] | None = None, parent_run_id: str | None = None) -> str:
        """Run ``run_id`` RUNNING again (a resume): the tags of this attempt set (its parent too, e.g. a
        resumed comparison's new parent run), a kill's ``killed`` tag and an earlier ``error`` removed."""
        from mlflow.entities import RunTag

        tags = {**code_version_tags(), **(tags or {})}
        if parent_run_id:
            tags["mlflow.parentRunId"] = parent_run_id
        old = self.client.get_run(run_id).data.tags
        for key in ("killed", "error"):
            if key in old:
                self.client.delete_tag(run_id, key)
        self.client.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])
        self.client.update_run(run_id, status="RUNNING")
        return run_id

    def log_params(self, run_id: str, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

        items = [Param(sanitize_metric_name(k), str(v)[:MAX_PARAM_VAL_LENGTH]) for k, v in params.items()]
        for i in range(0, len(items), 100):
            self.client.log_batch(run_id, params=items[i:i + 100])

    def log_metrics(self, run_id: str, metrics: Mapping[str, float], step: int = 0) -> list[Any]:
        """Log ``metrics`` at ``step``; returns the ``mlflow.entities.Metric`` values written."""
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        items = [Metric(sanitize_metric_name(k), float(v), ts, step) for k, v in metrics.items()
                 if isinstance(v, (int, float))]
        for i in range(0, len(items), 1000):
            self.client.log_batch(run_id, metrics=items[i:i + 1000])
        return items

    def log_identity(self, run_id: str, params: Mapping[str, Any], config: Mapping[str, Any]) -> None:
        """What a training run is: its curated params and its resolved config (``config/resolved_config.json``).
        A continued run keeps the params it has (MLflow never changes one); a resume-safe field the
        resume changed is named in the tag ``resumed_with``."""
        have = self.client.get_run(run_id).data.params
        values = param_values(params)
        changed = {k: v for k, v in values.items() if k in have and have[k] != v}
        self.log_params(run_id, {k: v for k, v in values.items() if k not in have})
        if changed:
            self.client.set_tag(run_id, "resumed_with", "; ".join(f"{k}={v}" for k, v in changed.items())[:5000])
        self.client.log_dict(run_id, dict(config), "config/resolved_config.json")

    def end_run(self, run_id: str, status: str = "FINISHED") -> None:
        self.client.set_terminated(run_id, status)

    def end_running_children(self, parent_run_id: str, status: str = "KILLED") -> list[str]:
        """End ``status`` every child of ``parent_run_id`` still RUNNING (what a stopped comparison's
        workers, ended with their Ray, could not end themselves); their ids."""
        parent = self.client.get_run(parent_run_id)
        running = search_all(
            self.client, [parent.info.experiment_id],
            f"tags.`mlflow.parentRunId` = '{parent_run_id}' and attributes.status = 'RUNNING'")
        for run in running:
            self.client.set_terminated(run.info.run_id, status)
        return [run.info.run_id for run in running]


SEARCH_PAGE = 1000
"""Runs read per ``search_runs`` call (MLflow's own default page)."""


def search_all(client: Any, experiment_ids: list[str], filter_string: str,
               order_by: list[str] | None = None) -> list[Any]:
    """Every matching (active) run, following page tokens (one ``search_runs`` reads one page)."""
    out: list[Any] = []
    token = None
    while True:
        page = client.search_runs(experiment_ids, filter_string=filter_string, max_results=SEARCH_PAGE,
                                  order_by=order_by, page_token=token)
        out.extend(page)
        token = page.token
        if not token:
            return out


def param_values(params: Mapping[str, Any]) -> dict[str, str]:
    """Params as MLflow stores them: sanitized keys, values as text cut to MLflow's limit."""
    from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

    return {sanitize_metric_name(k): str(v)[:MAX_PARAM_VAL_LENGTH] for k, v in params.items()}


@dataclass
class TrackedRun:
    """A finished tracked run."""

    result: Any  # TrainResult
    run_id: str
    experiment_id: str
    tracking_uri: str
    synced: bool = True
    """False when MLflow was unreachable at the end: ``exgrpo sync`` completes the run."""

    @property
    def url(self) -> str:
        return run_url(self.experiment_id, self.run_id, self.tracking_uri)


def backfill_steps(client: Any, run_id: str, history: list[dict[str, float]], logger: MLflowStepLogger,
                   probe: str = "batch/solved") -> int:
    """After a job that logged to MLflow by itself: log the steps of ``history`` (metrics.jsonl)
    that never arrived, and say so loudly (tag ``live_metrics``). Returns how many were missing."""
    try:
        arrived = {m.step for m in client.get_metric_history(run_id, probe)}
    except Exception:  # noqa: BLE001 - the store is down: the logger buffers every step (exgrpo sync delivers)
        for row in history:
            logger(int(row["step"]), row)
        return len(history)
    missing = [r for r in history if probe in r and int(r["step"]) not in arrived]
    if missing:
        how = "none" if not arrived else "partial"
        print(f"warning: the training job logged {len(arrived)} of {len(arrived) + len(missing)} steps to MLflow "
              f"run {run_id} live ({how}; see the job log); the missing {len(missing)} are logged now from "
              "metrics.jsonl", flush=True)
        client.set_tag(run_id, "live_metrics", how)
        for row in missing:
            logger(int(row["step"]), row)
    return len(missing)
