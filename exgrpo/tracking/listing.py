"""``exgrpo runs``: the recent runs, comparisons and sweeps of an MLflow store, one line each.

Top-level runs only (a comparison's or a sweep's children are summarised by their parent): when it
started, the experiment, the run's name and kind, its status, the headline result and the run id.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from exgrpo.tracking.mlflow_tracking import Tracker


@dataclass
class RunLine:
    started: str
    experiment: str
    name: str
    kind: str
    status: str
    headline: str
    run_id: str


def _headline(run: Any) -> str:
    """The result a person looks for first: per-arm means of a comparison, the best trial of a
    sweep, the final validation accuracy of a single run."""
    m, tags = run.data.metrics, run.data.tags
    kind = tags.get("kind", "run")
    if kind == "compare":
        arms = [a for a in tags.get("arms", "").split(",") if a]
        metric = tags.get("metric", "val/accuracy")
        parts = [f"{a} {m[f'{a}/final_mean']:.4f}" for a in arms if f"{a}/final_mean" in m]
        return f"{metric}: " + ", ".join(parts) if parts else "no statistics yet"
    if kind == "sweep":
        if "best_value" not in m:
            return "no finished trial yet"
        best = ", ".join(f"{k.removeprefix('best/')}={v}" for k, v in sorted(tags.items()) if k.startswith("best/"))
        return f"best {m['best_value']:.4f} (trial {int(m.get('best_trial', -1))}{': ' + best if best else ''})"
    for key in ("final/val/accuracy", "val/accuracy", "eval/val/avg_at_1", "final/batch/solved"):
        if key in m:
            return f"{key} {m[key]:.4f}"
    return ""


def recent_runs(tracking_uri: str | None = None, limit: int = 20, experiment: str | None = None) -> list[RunLine]:
    """The ``limit`` most recent top-level runs (newest first), of one experiment or of all."""
    from mlflow import MlflowClient
    from mlflow.entities import ViewType

    client: MlflowClient = Tracker(tracking_uri).client
    exps = client.search_experiments(view_type=ViewType.ACTIVE_ONLY)
    if experiment is not None:
        exps = [e for e in exps if e.name == experiment]
        if not exps:
            raise ValueError(f"no MLflow experiment named {experiment!r}; `exgrpo runs` lists the ones there are")
    names = {e.experiment_id: e.name for e in exps}
    if not names:
        return []
    runs = client.search_runs(list(names), filter_string="", order_by=["attributes.start_time DESC"],
                              max_results=max(limit * 20, 200))
    top = [r for r in runs if "mlflow.parentRunId" not in r.data.tags][:limit]
    return [
        RunLine(time.strftime("%Y-%m-%d %H:%M", time.localtime(r.info.start_time / 1000)), names[r.info.experiment_id],
                r.info.run_name or "", r.data.tags.get("kind", "run"), r.info.status, _headline(r), r.info.run_id)
        for r in top
    ]


def format_runs(lines: list[RunLine]) -> str:
    """A plain fixed-width table (readable in a terminal and in a log)."""
    if not lines:
        return "no runs yet: `make demo` or `exgrpo train experiments/toy-exgrpo.yaml` makes one"
    header = RunLine("started", "experiment", "name", "kind", "status", "result", "run id")
    rows = [header, *lines]
    widths = [max(len(getattr(r, f)) for r in rows) for f in ("started", "experiment", "name", "kind", "status")]
    out = []
    for r in rows:
        cells = [getattr(r, f).ljust(w) for f, w in zip(("started", "experiment", "name", "kind", "status"), widths,
                                                          strict=True)]
        out.append("  ".join([*cells, r.run_id.ljust(32), r.headline]).rstrip())
    return "\n".join(out)
