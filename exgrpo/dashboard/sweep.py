"""Sweep report of an Optuna study (exgrpo.sweep): trials, parameter importances, best
configuration, optimisation history.

The study comes from its Optuna storage: the ``study.name`` / ``optuna.storage`` params of the
study's MLflow parent run (``kind=sweep``), or a study name + storage given directly. When the
storage cannot be read (e.g. a sqlite file on another machine) the trials are rebuilt from the
parent's MLflow child runs (tag ``trial_number``, params, ``final/<metric>``, the metric's history)
and the search space artifact ``sweep/space.json``.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exgrpo.dashboard import _html as H
from exgrpo.dashboard._store import DashboardError, children, get_run, history, run_link
from exgrpo.errors import redact_uri
from exgrpo.tracking.mlflow_tracking import run_url, sanitize_metric_name
from exgrpo.sweep import ParamSpec


@dataclass
class SweepData:
    study: Any  # optuna.Study
    study_name: str
    storage: str | None
    metric: str
    source: str
    """'optuna' (the study's storage) or 'mlflow' (rebuilt from the child runs)."""
    parent: Any | None = None
    tracking_uri: str | None = None
    run_urls: dict[str, str] = field(default_factory=dict)
    """MLflow run id -> UI link."""
    notes: list[str] = field(default_factory=list)

    @property
    def direction(self) -> str:
        return self.study.direction.name.lower()


def _storage_readable(url: str) -> str | None:
    """None if readable, else why not (never creates a sqlite file)."""
    if url.startswith("sqlite:///"):
        p = Path(url.removeprefix("sqlite:///"))
        if not p.is_file():
            return f"no such file {p}"
    return None


def load_study(study_name: str, storage: str) -> Any:
    import optuna

    why = _storage_readable(storage)
    if why:
        raise DashboardError(f"Optuna storage {redact_uri(storage)}: {why}")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        return optuna.load_study(study_name=study_name, storage=storage)
    except KeyError:
        names = optuna.study.get_all_study_names(storage)
        raise DashboardError(f"no study {study_name!r} in {redact_uri(storage)} "
                             f"(studies: {', '.join(names) or 'none'})") from None


def _parse_param(value: str, dist: Any) -> Any:
    import optuna.distributions as d

    if isinstance(dist, d.CategoricalDistribution):
        for c in dist.choices:
            if str(c) == value:
                return c
        raise ValueError(f"{value!r} not in {dist.choices}")
    x = int(float(value)) if isinstance(dist, d.IntDistribution) else float(value)
    if not dist.low <= x <= dist.high:
        raise ValueError(f"{x} outside [{dist.low}, {dist.high}]")
    return x


def study_from_mlflow(client: Any, parent: Any, metric: str, direction: str) -> Any:
    """An in-memory Optuna study holding the trials recorded as MLflow child runs of ``parent``."""
    import optuna
    from optuna.trial import TrialState, create_trial

    import os

    bar = os.environ.get("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR")
    os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = "false"
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = client.download_artifacts(parent.info.run_id, "sweep/space.json", tmp)
            space = json.loads(Path(path).read_text())["space"]
    except Exception as e:
        raise DashboardError(f"sweep run {parent.info.run_id}: no readable sweep/space.json artifact ({e})") from None
    finally:
        if bar is None:
            os.environ.pop("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", None)
        else:
            os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = bar
    dists = {k: ParamSpec.model_validate(v).distribution() for k, v in space.items()}
    mkey = sanitize_metric_name(metric)
    kids = [r for r in children(client, parent) if "trial_number" in r.data.tags]
    kids.sort(key=lambda r: int(r.data.tags["trial_number"]))
    trials = []
    for r in kids:
        t, status = r.data.tags, r.info.status
        params, pd = {}, {}
        for name, dist in dists.items():
            raw = r.data.params.get(sanitize_metric_name(name))
            if raw is None:
                continue
            try:
                params[name] = _parse_param(raw, dist)
                pd[name] = dist
            except ValueError:
                continue
        final = r.data.metrics.get(f"final/{mkey}")
        inter = history(client, r.info.run_id, mkey) if mkey in r.data.metrics else {}
        if status == "FINISHED" and final is not None and math.isfinite(final):
            state, value = TrialState.COMPLETE, final
        elif t.get("pruned") == "true":
            state, value = TrialState.PRUNED, None
        elif status in ("RUNNING", "SCHEDULED"):
            state, value = TrialState.RUNNING, None
        else:
            state, value = TrialState.FAIL, None
        attrs = {"mlflow_run_id": r.info.run_id}
        if t.get("error"):
            attrs["error"] = t["error"]
        start = r.info.start_time / 1000 if r.info.start_time else None
        end = r.info.end_time / 1000 if r.info.end_time else None
        ft = create_trial(state=state, value=value, params=params, distributions=pd,
                          intermediate_values=inter if state != TrialState.RUNNING else {},
                          user_attrs=attrs)
        if start is not None:
            from datetime import datetime, timezone

            ft.datetime_start = datetime.fromtimestamp(start, timezone.utc)
            if end is not None and state != TrialState.RUNNING:
                ft.datetime_complete = datetime.fromtimestamp(end, timezone.utc)
        trials.append(ft)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction=direction)
    for ft in trials:
        if ft.state == TrialState.RUNNING:
            continue  # add_trials takes finished trials only
        study.add_trial(ft)
    return study


def load_sweep_from_run(client: Any, tracking_uri: str, parent: Any, storage: str | None = None) -> SweepData:
    tags, params = parent.data.tags, parent.data.params
    if tags.get("kind") != "sweep":
        raise DashboardError(f"run {parent.info.run_id} is not a sweep parent (tag kind={tags.get('kind')!r})")
    name = params.get("study.name") or tags.get("study")
    recorded = params.get("optuna.storage")
    env = os.environ.get("EXGRPO_OPTUNA_STORAGE")
    if env and redact_uri(env) == recorded:  # recorded without its password, which this environment has
        recorded = env
    storage = storage or recorded
    metric = params.get("study.metric", "val/accuracy")
    direction = params.get("study.direction", "maximize")
    notes = []
    try:
        if not (name and storage):
            raise DashboardError("the parent run records no study.name / optuna.storage")
        study, source = load_study(name, storage), "optuna"
    except Exception as e:
        notes.append(f"Optuna storage not readable ({redact_uri(str(e))}); trials rebuilt from the MLflow child "
                     "runs.")
        study, source = study_from_mlflow(client, parent, metric, direction), "mlflow"
    data = SweepData(study, name or "", storage, metric, source, parent, tracking_uri, notes=notes)
    for r in children(client, parent):
        data.run_urls[r.info.run_id] = run_link(r, tracking_uri)
    return data


def load_sweep_from_study(study_name: str, storage: str, open_client: Any = None) -> SweepData:
    """A study by name; its MLflow parent run (user attr ``mlflow_parent_run_id``) is used for links
    (and logging) when ``open_client()`` -> (client, tracking_uri) can read it."""
    study = load_study(study_name, storage)
    parent = client = tracking_uri = None
    pid = study.user_attrs.get("mlflow_parent_run_id")
    notes = []
    if open_client is not None and pid:
        try:
            client, tracking_uri = open_client()
            parent = get_run(client, pid)
        except DashboardError as e:
            notes.append(f"MLflow parent run {pid} not available: {e}")
    metric = parent.data.params.get("study.metric", "val/accuracy") if parent else "val/accuracy"
    data = SweepData(study, study_name, storage, metric, "optuna", parent, tracking_uri, notes=notes)
    if parent is not None:
        for r in children(client, parent):
            data.run_urls[r.info.run_id] = run_link(r, tracking_uri)
    return data


# ------------------------------------------------------------------------------------ content
def param_importances(study: Any) -> tuple[dict[str, float] | None, str]:
    """(importances, message): None with the reason when they cannot be computed."""
    from optuna.importance import FanovaImportanceEvaluator, get_param_importances
    from optuna.trial import TrialState

    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if len(complete) < 2:
        return None, (f"Parameter importances need at least 2 complete trials; the study has {len(complete)}.")
    if len({t.value for t in complete}) < 2:
        return None, (f"All {len(complete)} complete trials have the same value ({complete[0].value:.4f}): "
                      "no variance to attribute, importances are undefined.")
    try:
        imp = get_param_importances(study, evaluator=FanovaImportanceEvaluator(seed=0))
    except Exception as e:
        return None, f"Parameter importances could not be computed: {type(e).__name__}: {e}"
    return {k: float(v) for k, v in imp.items()}, (
        f"fANOVA (optuna.importance, seed 0) over {len(complete)} complete trials; normalised to sum to 1.")


def _val(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:.6g}"
    return str(x)


def trials_table(data: SweepData, best_number: int | None) -> str:
    from optuna.trial import TrialState

    trials = data.study.get_trials(deepcopy=False)
    keys = sorted({k for t in trials for k in t.params})
    rows = []
    for t in trials:
        cls = "best" if t.number == best_number else None
        dur = t.duration.total_seconds() if t.duration is not None else None
        last = max(t.intermediate_values) if t.intermediate_values else None
        rid = t.user_attrs.get("mlflow_run_id")
        url = data.run_urls.get(rid) or (run_url(data.parent.info.experiment_id, rid, data.tracking_uri)
                                         if rid and data.parent is not None else None)
        err = t.user_attrs.get("error") or ""
        state_cls = {TrialState.FAIL: "bad", TrialState.PRUNED: "warn"}.get(t.state)
        rows.append([
            H.td(str(t.number), cls, trial=t.number, col="number"),
            H.td(t.state.name, state_cls, trial=t.number, col="state"),
            H.td(H.fmt(t.value), cls, trial=t.number, col="value", value=None if t.value is None else repr(t.value)),
            *[H.td(H.esc(_val(t.params[k])) if k in t.params else "—", trial=t.number, param=k,
                   value=t.params.get(k)) for k in keys],
            H.td("" if last is None else str(last)),
            H.td("" if dur is None else f"{dur:.1f}"),
            H.td(H.link(url, rid[:12]) if rid else "—", "l"),
            H.td(H.esc(" ".join(err.split())[:160]), "l err" if err else "l"),
        ])
    headers = ["trial", "state", f"value ({data.metric})", *keys, "last reported step", "seconds", "MLflow run",
               "error"]
    return H.table(headers, rows, tid="trials-table", left=0)


def importance_html(data: SweepData) -> str:
    imp, msg = param_importances(data.study)
    if imp is None:
        return f"<p class=\"note\" id=\"importance-message\">{H.esc(msg)}</p>"
    items = sorted(imp.items(), key=lambda kv: kv[1])
    fig = H.new_figure(8, 0.5 + 0.45 * len(items))
    ax = fig.subplots()
    ax.barh([k for k, _ in items], [v for _, v in items], color="C0")
    for i, (_, v) in enumerate(items):
        ax.text(v, i, f" {v:.3f}", va="center", fontsize=8)
    ax.set(xlabel="importance", xlim=(0, max(1e-9, max(v for _, v in items)) * 1.18))
    ax.grid(alpha=0.3, axis="x")
    rows = [[H.td(H.esc(k), "l", param=k, col="importance_name"), H.td(f"{v:.4f}", param=k, col="importance",
                                                                     value=repr(v))]
            for k, v in sorted(imp.items(), key=lambda kv: -kv[1])]
    return (H.table(["parameter", "importance"], rows, tid="importance-table")
            + H.figure_html(fig, "fig-importance", "Hyper-parameter importances (fANOVA).", alt="parameter importances")
            + f"<p class=\"note\" id=\"importance-message\">{H.esc(msg)}</p>")


def best_html(data: SweepData) -> tuple[str, int | None]:
    from optuna.trial import TrialState

    if not data.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        return "<p class=\"note\" id=\"best-message\">No complete trial yet: no best configuration.</p>", None
    best = data.study.best_trial
    rid = best.user_attrs.get("mlflow_run_id")
    url = data.run_urls.get(rid) if rid else None
    rows = [[H.td(H.esc(k), "l", param=k, col="best_param_name"),
             H.td(H.esc(_val(v)), "l", param=k, col="best_param", value=v)] for k, v in sorted(best.params.items())]
    sets = " ".join(f"--set {k}={v}" for k, v in sorted(best.params.items()))
    pairs = [("trial", f"<span id=\"best-trial\" data-value=\"{best.number}\">{best.number}</span>"),
             (f"value ({data.metric}, {data.direction})",
              f"<span id=\"best-value\" data-value=\"{best.value!r}\">{best.value:.4f}</span>"),
             ("MLflow run", H.link(url, rid) if rid else "—")]
    html = H.kv(pairs) + H.table(["parameter", "value"], rows, tid="best-params")
    if data.parent is not None:
        logged = {k.removeprefix("best/"): v for k, v in data.parent.data.tags.items() if k.startswith("best/")}
        if logged:
            same = all(logged.get(k) == str(v) for k, v in best.params.items())
            html += (f"<p class=\"note\">Parent run tags <code>best/*</code>: "
                     f"{'match' if same else 'differ (the study may have grown since it was last summarised)'}.</p>")
    html += (f"<p class=\"note\">Re-run it: <code>exgrpo train &lt;sweep base&gt; --set "
             f"train.max_steps={H.esc(data.study.user_attrs.get('budget_steps', '<budget>'))} "
             f"{H.esc(sets)}</code></p>")
    return html, best.number


def history_figure(data: SweepData) -> str:
    from optuna.trial import TrialState

    trials = data.study.get_trials(deepcopy=False)
    fig = H.new_figure(14, 4.2)
    ax, ax2 = fig.subplots(1, 2)
    comp = [t for t in trials if t.state == TrialState.COMPLETE]
    maximize = data.direction == "maximize"
    if comp:
        ax.scatter([t.number for t in comp], [t.value for t in comp], color="C0", label="complete", zorder=3)
        best, xs, ys = None, [], []
        for t in sorted(comp, key=lambda t: t.number):
            if best is None or (t.value > best if maximize else t.value < best):
                best = t.value
            xs.append(t.number)
            ys.append(best)
        ax.step(xs, ys, where="post", color="C3", label="best so far")
    pruned = [t for t in trials if t.state == TrialState.PRUNED and t.intermediate_values]
    if pruned:
        ax.scatter([t.number for t in pruned], [t.intermediate_values[max(t.intermediate_values)] for t in pruned],
                   marker="x", color="grey", label="pruned (last reported)", zorder=3)
    failed = [t.number for t in trials if t.state == TrialState.FAIL]
    if failed:
        ax.scatter(failed, [0.0] * len(failed), marker="v", color="#b00020", label="failed", zorder=3,
                   transform=ax.get_xaxis_transform(), clip_on=False)
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(title=f"optimisation history ({data.direction} {data.metric})", xlabel="trial", ylabel=data.metric)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    for t in trials:
        if not t.intermediate_values:
            continue
        steps = sorted(t.intermediate_values)
        color = {TrialState.COMPLETE: "C0", TrialState.PRUNED: "grey"}.get(t.state, "#b00020")
        ax2.plot(steps, [t.intermediate_values[s] for s in steps], color=color, alpha=0.6, marker=".",
                 label=None)
    ax2.set(title="intermediate values (blue: complete, grey: pruned)", xlabel="training step", ylabel=data.metric)
    ax2.grid(alpha=0.3)
    return H.figure_html(fig, "fig-history", "Optimisation history: objective per trial with the best so far; "
                         "the values each trial reported at its evaluation steps (what the pruner saw).",
                         alt="optimisation history")


def render(data: SweepData) -> str:
    from optuna.trial import TrialState

    trials = data.study.get_trials(deepcopy=False)
    counts = {s.name: sum(t.state == s for t in trials) for s in TrialState}
    counts = {k: v for k, v in counts.items() if v}
    meta = [f"study <b>{H.esc(data.study_name)}</b>", f"{H.esc(data.direction)} <code>{H.esc(data.metric)}</code>",
            f"source: {'Optuna storage' if data.source == 'optuna' else 'MLflow child runs'} "
            f"<code>{H.esc(redact_uri(data.storage or ''))}</code>"]
    if data.parent is not None:
        p = data.parent
        meta.append(f"parent run {H.link(run_link(p, data.tracking_uri), p.info.run_id)} ({H.esc(p.info.status)})")
    best, best_number = best_html(data)
    intro = (f"<p class=\"note\" id=\"trial-counts\">{len(trials)} trials: "
             + ", ".join(f"{v} {k.lower()}" for k, v in counts.items()) + ".</p>")
    if data.notes:
        intro += "<ul class=\"err\">" + "".join(f"<li>{H.esc(n)}</li>" for n in data.notes) + "</ul>"
    sections = [
        H.section("best", "Best configuration", intro + best),
        H.section("history", "Optimisation history", history_figure(data)),
        H.section("importance", "Parameter importances", importance_html(data)),
        H.section("trials", "Trials", trials_table(data, best_number)),
    ]
    return H.page(f"Sweep: {data.study_name}", meta, sections, kind="sweep")
