"""Benchmark scores of a checkpoint in its run's MLflow record: ``eval/<benchmark>/<metric>`` at the
checkpoint's step, each with its sampling settings beside it (a tag of the same name plus
``.settings``, and every score whole in an artifact ``evaluations/step_<N>[-<key>].json``).

Each evaluation is a record of its own, by its settings. The run's own settings (greedy, one sample,
the policy's token budget, the whole set) keep ``eval/<benchmark>/<metric>``; any other evaluation's
names carry its settings key (:func:`settings_key`): ``eval/val/pass_at_1/n4-t0.7-seed0``. No artifact
is overwritten: a name taken already gets ``-2``, ``-3``, ...
"""

from __future__ import annotations

import dataclasses
import json
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from exgrpo.atomic import write_text_atomic

SETTINGS = ("n_problems", "n_samples", "temperature", "top_p", "max_tokens", "template", "grader", "grader_version")
"""What of a score says how it was sampled and graded: recorded beside its value."""

TOLERANCE = 1e-9
"""Two values of one series at one step closer than this are one reading."""


def _settings(settings: Any) -> dict[str, Any]:
    """``settings`` (an :class:`exgrpo.evaluation.metrics.EvalSettings`, its dict, or None: the run's own)
    as a dict."""
    if settings is None:
        return {}
    return dataclasses.asdict(settings) if dataclasses.is_dataclass(settings) else dict(settings)


def settings_key(settings: Any = None, subset: int | None = None) -> str:
    """What of an evaluation's settings differs from the run's own (greedy, one sample, top_p 1, the
    policy's token budget, the whole set), as a short key: ``""`` for the run's own, else e.g.
    ``n4-t0.7-seed0``: samples ``n``, temperature ``t``, ``top_p``, token budget ``max``, the problems of a
    subset ``sub``, and the seed where it decides the numbers (sampling, or a subset)."""
    s = _settings(settings)
    n, temperature, top_p = s.get("n", 1), s.get("temperature", 0.0), s.get("top_p", 1.0)
    parts = [f"n{n}"] if n != 1 else []
    parts += [f"t{temperature:g}"] if temperature else []
    parts += [f"top_p{top_p:g}"] if top_p != 1.0 else []
    parts += [f"max{s['max_tokens']}"] if s.get("max_tokens") is not None else []
    parts += [f"sub{subset}"] if subset is not None else []
    parts += [f"seed{s.get('seed', 0)}"] if temperature or subset is not None else []
    return "-".join(parts)


def metric_names(scores: list[Any], settings: Any = None, subsets: Mapping[str, int] | None = None) -> dict[str, str]:
    """Each score's MLflow name (by its ``key``, ``<benchmark>/<metric>``): ``eval/<benchmark>/<metric>``,
    followed by ``/<settings key>`` unless it was made with the run's own settings."""
    subsets = subsets or {}
    out = {}
    for s in scores:
        key = settings_key(settings, subsets.get(s.benchmark))
        out[s.key] = f"eval/{s.key}" + (f"/{key}" if key else "")
    return out


def _values_at(client: Any, run_id: str, key: str, step: int) -> list[float]:
    return [m.value for m in client.get_metric_history(run_id, key) if m.step == step]


def place(client: Any, run_id: str, named: dict[str, float], step: int) -> tuple[dict[str, float], dict[str, float]]:
    """(what to log, what the run holds already) of ``named`` at ``step``. A value the run has at that
    step under that name is held, not logged twice; one that differs there (the same settings on another
    machine) goes under ``evaluate/`` beside it, so each series keeps one reading per step."""
    log, held = {}, {}
    for key, value in named.items():
        there = _values_at(client, run_id, key, step)
        if not there:
            log[key] = value
        elif any(abs(v - value) <= TOLERANCE for v in there):
            held[key] = value
        else:
            other = "evaluate/" + key.split("/", 1)[1]
            if any(abs(v - value) <= TOLERANCE for v in _values_at(client, run_id, other, step)):
                held[other] = value
            else:
                log[other] = value
    return log, held


def one_series_per_meaning(client: Any, run_id: str, named: dict[str, float], step: int) -> dict[str, float]:
    """What of ``named`` to log at ``step`` (:func:`place`)."""
    return place(client, run_id, named, step)[0]


@dataclass
class Logged:
    """What :func:`log_scores` did."""

    logged: dict[str, float]
    """Metrics logged now (keys as :func:`place` placed them)."""
    held: dict[str, float] = field(default_factory=dict)
    """Metrics the run held already at that step (not logged again)."""
    artifact: str | None = None
    """The artifact the scores were written to (None: nothing new to record)."""


def _artifact_for(client: Any, run_id: str, stem: str, record: dict[str, Any]) -> tuple[str, bool]:
    """(name, held): the run's ``evaluations/<stem>[-<n>].json`` that holds ``record`` already (held), else
    the first of ``<stem>.json``, ``<stem>-2.json``, ... that the run does not hold (one listing of the run's
    evaluations serves both)."""
    same_stem = re.compile(re.escape(stem) + r"(-\d+)?\.json")
    wanted = json.dumps(record, sort_keys=True)  # as text: a NaN score equals itself
    taken = {Path(a.path).name for a in client.list_artifacts(run_id, "evaluations")}
    for name in sorted(n for n in taken if same_stem.fullmatch(n)):
        with tempfile.TemporaryDirectory(prefix="exgrpo-eval-") as tmp:
            local = client.download_artifacts(run_id, f"evaluations/{name}", tmp)
            if json.dumps(json.loads(Path(local).read_text()), sort_keys=True) == wanted:
                return name, True
    name, i = f"{stem}.json", 2
    while name in taken:
        name, i = f"{stem}-{i}.json", i + 1
    return name, False


def log_scores(tracker: Any, run_id: str, scores: list[Any], step: int, settings: Any = None,
               subsets: Mapping[str, int] | None = None) -> Logged:
    """Log ``scores`` (:class:`exgrpo.evaluation.metrics.Score`) made with ``settings`` (None: the run's
    own) on benchmark subsets ``subsets`` (benchmark -> problems) on run ``run_id`` at ``step``, named by
    :func:`metric_names`; the scores whole go to an artifact of their own under ``evaluations/``.

    What describes the values (their settings tags, the artifact) is written before the values: a log cut
    short is repeated whole (by ``exgrpo sync``), and a run that holds the values holds their description;
    an artifact the cut-short log wrote already is found by its content, not written twice."""
    client = tracker.client
    names = metric_names(scores, settings, subsets)
    by_name = {names[s.key]: s for s in scores}
    logged, held = place(client, run_id, {name: s.value for name, s in by_name.items()}, step)
    if not logged:
        return Logged(logged, held)
    s = _settings(settings)
    seed = f" seed={s.get('seed', 0)}" if s else ""
    for key in logged:
        source = by_name[key if key in by_name else "eval/" + key.split("/", 1)[1]]
        client.set_tag(run_id, f"{key}.settings", " ".join(f"{f}={getattr(source, f)}" for f in SETTINGS) + seed)
    key = settings_key(settings)
    stem = f"step_{step}" + (f"-{key}" if key else "")
    record = {"step": step, "settings": s or None, "subsets": dict(subsets or {}),
              "metrics": dict(logged), "scores": [x.to_dict() for x in scores]}
    name, held_already = _artifact_for(client, run_id, stem, record)
    if not held_already:
        with tempfile.TemporaryDirectory(prefix="exgrpo-eval-") as tmp:
            path = write_text_atomic(Path(tmp) / name, json.dumps(record, indent=1))
            client.log_artifact(run_id, str(path), "evaluations")
    tracker.log_metrics(run_id, logged, step=step)
    return Logged(logged, held, f"evaluations/{name}")


def pending_evaluation(scores: list[Any], step: int, settings: Any = None,
                       subsets: Mapping[str, int] | None = None) -> dict[str, Any]:
    """An evaluation as a marker of ``exgrpo sync`` carries it (:func:`exgrpo.tracking.sync.write_pending`'s
    ``evaluations``), for :func:`log_pending` to log later."""
    return {"step": step, "settings": _settings(settings) or None, "subsets": dict(subsets or {}),
            "scores": [s.to_dict() for s in scores]}


def log_pending(tracker: Any, run_id: str, entry: Mapping[str, Any]) -> Logged:
    """Log an evaluation that waited in a marker (:func:`pending_evaluation`), as :func:`log_scores` logs
    one: what the run holds by then is not logged twice."""
    scores = [_stored(s) for s in entry["scores"]]
    return log_scores(tracker, run_id, scores, int(entry["step"]), entry.get("settings"), entry.get("subsets"))


def _stored(score: Mapping[str, Any]) -> SimpleNamespace:
    """A score as a marker stores it (``Score.to_dict``), with what :func:`log_scores` reads of a score."""
    d = dict(score)
    return SimpleNamespace(**d, key=f"{d['benchmark']}/{d['metric']}", to_dict=lambda: dict(d))
