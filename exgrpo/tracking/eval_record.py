"""Benchmark scores of a checkpoint in its run's MLflow record: ``eval/<benchmark>/<metric>`` at the
checkpoint's step, each with its sampling settings beside it (a tag of the same name plus
``.settings``, and every score whole in the artifact ``evaluations/step_<N>.json``)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from exgrpo.atomic import write_text_atomic

SETTINGS = ("n_problems", "n_samples", "temperature", "top_p", "max_tokens", "template", "grader", "grader_version")
"""What of a score says how it was sampled and graded: recorded beside its value."""


def one_series_per_meaning(client: Any, run_id: str, named: dict[str, float], step: int) -> dict[str, float]:
    """What of an evaluation to log into a run that may hold the training's own evaluation at the same
    step: a value it has already is not logged twice; one that differs (other settings, another
    machine) goes under ``evaluate/`` beside it, so each series keeps one meaning."""
    out = {}
    for key, value in named.items():
        there = {m.step: m.value for m in client.get_metric_history(run_id, key)}
        if step not in there:
            out[key] = value
        elif abs(there[step] - value) > 1e-9:
            out["evaluate/" + key.split("/", 1)[1]] = value
    return out


def log_scores(tracker: Any, run_id: str, scores: list[Any], step: int) -> dict[str, float]:
    """Log ``scores`` (:class:`exgrpo.evaluation.metrics.Score`) on run ``run_id`` at ``step``; returns
    the metrics logged (keys as :func:`one_series_per_meaning` placed them)."""
    named = {f"eval/{s.key}": s.value for s in scores}
    logged = one_series_per_meaning(tracker.client, run_id, named, step)
    tracker.log_metrics(run_id, logged, step=step)
    by_key = {f"eval/{s.key}": s for s in scores}
    for key in logged:
        source = by_key[key if key in by_key else "eval/" + key.split("/", 1)[1]]
        tracker.client.set_tag(run_id, f"{key}.settings",
                               " ".join(f"{f}={getattr(source, f)}" for f in SETTINGS))
    with tempfile.TemporaryDirectory(prefix="exgrpo-eval-") as tmp:
        path = write_text_atomic(Path(tmp) / f"step_{step}.json",
                                 json.dumps({"step": step, "scores": [s.to_dict() for s in scores]}, indent=1))
        tracker.client.log_artifact(run_id, str(path), "evaluations")
    return logged
