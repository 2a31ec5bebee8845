"""Dashboards MLflow's UI lacks, built from the MLflow store (and the Optuna storage of sweeps):

- comparison report of a compare parent run (``kind=compare``): learning curves with 95% CI bands
  across seeds, the final table (mean ± 95% CI, paired difference vs the baseline, steps to the
  baseline's final value; :func:`exgrpo.compare.summarize`), experience-pool dynamics of replay arms;
- sweep report of a study parent run (``kind=sweep``) or an Optuna study: trials, parameter
  importances, best configuration, optimisation history.

Each report is one self-contained HTML file (inline CSS, figures as base64 PNG, a CSP that forbids
any external load), logged on the parent run as ``dashboards/comparison.html`` /
``dashboards/sweep.html`` and served on 127.0.0.1 by ``exgrpo dashboard`` (see dashboards/README.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exgrpo.dashboard._store import DashboardError, get_run, latest_parent, open_client
from exgrpo.dashboard import sweep
from exgrpo.dashboard.server import serve, start_server
from exgrpo.sweep import resolve_storage

ARTIFACT_PATHS = {"comparison": "dashboards/comparison.html", "sweep": "dashboards/sweep.html"}


@dataclass
class Report:
    kind: str
    """'comparison' or 'sweep'."""
    html: str
    run_id: str | None
    """The parent run it belongs to (where it is logged); None for a study without one."""
    tracking_uri: str | None
    title: str
    data: Any = None
    """The loaded :class:`~exgrpo.dashboard.comparison.ComparisonData` / :class:`~exgrpo.dashboard.sweep.SweepData`."""

    @property
    def artifact_path(self) -> str:
        return ARTIFACT_PATHS[self.kind]

    def write(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.html, encoding="utf-8")
        return path

    def log(self) -> str:
        """Log the HTML on the parent run; returns the artifact path."""
        if not self.run_id or not self.tracking_uri:
            raise DashboardError("this report has no MLflow parent run to log to")
        from mlflow import MlflowClient

        MlflowClient(tracking_uri=self.tracking_uri).log_text(self.run_id, self.html, self.artifact_path)
        return self.artifact_path


def _parent_of(client: Any, run: Any) -> Any:
    """A compare/sweep parent as is; a child run (arm x seed, trial): its parent."""
    if run.data.tags.get("kind") in ("compare", "sweep"):
        return run
    pid = run.data.tags.get("mlflow.parentRunId")
    if pid:
        parent = get_run(client, pid)
        if parent.data.tags.get("kind") in ("compare", "sweep"):
            return parent
    raise DashboardError(f"run {run.info.run_id} is neither a compare nor a sweep parent run, nor a child of one "
                         f"(tag kind={run.data.tags.get('kind')!r})")


def build_report(run_id: str | None = None, *, tracking_uri: str | None = None, experiment: str | None = None,
                 kind: str = "compare", study: str | None = None, storage: str | None = None) -> Report:
    """The report of ``run_id`` (a compare or sweep parent, or a child of one), of the latest
    ``kind`` parent run of ``experiment``, or of the Optuna ``study`` in ``storage``."""
    if study:
        if run_id or experiment:
            raise DashboardError("give either a run (--run-id / --experiment) or a study (--study), not both")

        return build_sweep_report(study=study, storage=resolve_storage(storage), tracking_uri=tracking_uri)
    client, uri = open_client(tracking_uri)
    if run_id:
        run = _parent_of(client, get_run(client, run_id))
    elif experiment:
        run = latest_parent(client, experiment, kind)
    else:
        raise DashboardError("give --run-id, --experiment or --study")
    if run.data.tags["kind"] == "compare":
        return build_comparison_report(run.info.run_id, tracking_uri=uri, _client=client, _run=run)
    return build_sweep_report(run.info.run_id, tracking_uri=uri, storage=storage, _client=client, _run=run)


def build_comparison_report(run_id: str, *, tracking_uri: str | None = None, _client: Any = None,
                            _run: Any = None) -> Report:
    from exgrpo.dashboard import comparison  # scipy: `exgrpo --help` imports this package (its cli)

    client, uri = (_client, tracking_uri) if _client is not None else open_client(tracking_uri)
    parent = _run or get_run(client, run_id)
    data = comparison.load_comparison(client, uri, parent)
    html = comparison.render(data)
    return Report("comparison", html, parent.info.run_id, uri, f"comparison {data.experiment}", data)


def build_sweep_report(run_id: str | None = None, *, tracking_uri: str | None = None, study: str | None = None,
                       storage: str | None = None, _client: Any = None, _run: Any = None) -> Report:
    """From the study's MLflow parent run (``run_id``), or from ``study`` + ``storage`` (the MLflow
    store is then optional: used for run links and logging when it holds the study's parent run)."""
    if run_id:
        client, uri = (_client, tracking_uri) if _client is not None else open_client(tracking_uri)
        parent = _run or get_run(client, run_id)
        data = sweep.load_sweep_from_run(client, uri, parent, storage=storage)
    else:
        if not (study and storage):
            raise DashboardError("a sweep report needs a parent run id, or a study name and its storage")
        data = sweep.load_sweep_from_study(study, storage, lambda: open_client(tracking_uri))
    html = sweep.render(data)
    rid = data.parent.info.run_id if data.parent is not None else None
    return Report("sweep", html, rid, data.tracking_uri if rid else None, f"sweep {data.study_name}", data)


__all__ = ["ARTIFACT_PATHS", "DashboardError", "Report", "build_comparison_report", "build_report",
           "build_sweep_report", "serve", "start_server"]
