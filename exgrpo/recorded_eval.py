"""An evaluation recorded in MLflow: the one path of ``exgrpo eval`` and of the evaluate flow.

:func:`evaluate_into_run` scores a checkpoint (:func:`exgrpo.evaluation.runner.score_checkpoint`) and
logs its scores (:func:`exgrpo.tracking.eval_record.log_scores`: ``eval/<benchmark>/<metric>`` at the
checkpoint's step, each with its sampling settings) into the MLflow run they belong to: the run named,
else the run whose directory holds the checkpoint, else a new run tagged ``kind=evaluate``. A finished
training run records its own evaluation with the same two functions (:func:`exgrpo.launch.record_finished`),
so every ``eval/*`` series has one name and one meaning wherever it was made.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from exgrpo.evaluation.metrics import EvalSettings
from exgrpo.evaluation.runner import Evaluation, score_checkpoint
from exgrpo.tracking import Tracker, run_tags
from exgrpo.tracking.eval_record import log_scores
from exgrpo.tracking.mlflow_tracking import resolve_tracking_uri
from exgrpo.tracking.registry import checkpoint_at
from exgrpo.tracking.run_record import RunRecord, read_record


@dataclass
class RecordedEvaluation:
    """An evaluation and where it was logged."""

    evaluation: Evaluation
    tracking_uri: str
    run_id: str
    logged: dict[str, float]
    """The metrics logged (keys as :func:`exgrpo.tracking.eval_record.one_series_per_meaning` placed them)."""
    new_run: bool
    """True when the scores went to a run of their own (``kind=evaluate``)."""


def score_named(checkpoint: str, spec: str | None = None, settings: EvalSettings = EvalSettings(), *,
                tracking_uri: str | None = None, workers: int = 2,
                python: str | None = None) -> tuple[Evaluation, RunRecord | None]:
    """``checkpoint`` (a path or ``models:/<name>@<alias>``, downloaded for the evaluation only) scored on
    ``spec`` (None: as its run evaluates), and the record of the run whose directory holds it (None: none)."""
    with checkpoint_at(checkpoint, tracking_uri) as path:
        done = score_checkpoint(path, spec, settings, workers=workers, python=python)
        return done, read_record(Path(path).resolve().parent.parent)


def evaluate_into_run(checkpoint: str, spec: str | None = None, settings: EvalSettings = EvalSettings(), *,
                      run_id: str | None = None, tracking_uri: str | None = None, workers: int = 2,
                      python: str | None = None) -> RecordedEvaluation:
    """:func:`score_named`, its scores logged into ``run_id``, else into the run whose directory holds the
    checkpoint, else into a new run tagged ``kind=evaluate`` in the run's experiment."""
    done, found = score_named(checkpoint, spec, settings, tracking_uri=tracking_uri, workers=workers, python=python)
    if run_id:
        uri = resolve_tracking_uri(tracking_uri)
    elif found is not None:
        uri, run_id = found.tracking_uri, found.run_id
    else:
        uri = resolve_tracking_uri(tracking_uri)
    tracker = Tracker(uri)
    new_run = run_id is None
    if new_run:
        cfg = done.config
        run_id = tracker.start_run(cfg.name, f"eval-seed{cfg.seed}-step{done.step}",
                                   run_tags(cfg, extra={"kind": "evaluate", "checkpoint": checkpoint}))
    try:
        logged = log_scores(tracker, run_id, done.scores, done.step)
    except BaseException:
        if new_run:
            tracker.end_run(run_id, "FAILED")
        raise
    if new_run:
        tracker.end_run(run_id)
    return RecordedEvaluation(done, uri, run_id, logged, new_run)
