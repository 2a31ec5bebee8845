"""An evaluation recorded in MLflow: the one path of ``exgrpo eval`` and of the evaluate flow.

:func:`score_named` scores a checkpoint (:func:`exgrpo.evaluation.runner.score_checkpoint`);
:func:`record_evaluation` then logs its scores (:func:`exgrpo.tracking.eval_record.log_scores`:
``eval/<benchmark>/<metric>`` at the checkpoint's step, names that carry the settings key when they are
not the run's own, each with its sampling settings) into the MLflow run they belong to: the run named,
else the run whose directory holds the checkpoint, else a new run tagged ``kind=evaluate``.
:func:`evaluate_into_run` does both. Scoring never waits on the store: a log that fails (the store down,
or without the run) leaves the evaluation in a marker that ``exgrpo sync`` delivers
(:func:`exgrpo.tracking.sync.write_pending`). A finished training run records its own evaluation with
the same functions (:func:`exgrpo.launch.record_finished`), so every ``eval/*`` series has one name and
one meaning wherever it was made.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from exgrpo.errors import one_line
from exgrpo.evaluation.metrics import EvalSettings
from exgrpo.evaluation.runner import Evaluation, score_checkpoint
from exgrpo.sqlite_wal import sqlite_file
from exgrpo.tracking import Tracker, run_tags
from exgrpo.tracking.eval_record import log_scores, pending_evaluation
from exgrpo.tracking.mlflow_tracking import TrackingError, check_reachable, resolve_tracking_uri
from exgrpo.tracking.registry import MODELS_PREFIX, checkpoint_at
from exgrpo.tracking.run_record import RunRecord, read_record
from exgrpo.tracking.sync import write_pending


@dataclass
class RecordedEvaluation:
    """An evaluation and where it was logged, or where it waits to be."""

    evaluation: Evaluation
    tracking_uri: str
    run_id: str | None
    """The run logged into (None: a new run that the store could not create yet)."""
    logged: dict[str, float]
    """The metrics logged (keys as :func:`exgrpo.tracking.eval_record.place` placed them)."""
    new_run: bool
    """True when the scores went to a run of their own (``kind=evaluate``)."""
    held: dict[str, float] = field(default_factory=dict)
    """The metrics the run held already at that step (not logged again)."""
    pending: Path | None = None
    """Where the evaluation waits for ``exgrpo sync`` when the log failed (None: it was logged)."""
    error: str | None = None
    """Why the log failed, on one line."""
    note: str | None = None
    """A line for the user about where the scores went (e.g. a store named other than the run's record)."""


def score_named(checkpoint: str, spec: str | None = None, settings: EvalSettings = EvalSettings(), *,
                tracking_uri: str | None = None, workers: int = 2,
                python: str | None = None) -> tuple[Evaluation, RunRecord | None]:
    """``checkpoint`` (a path or ``models:/<name>@<alias>``, downloaded for the evaluation only) scored on
    ``spec`` (None: as its run evaluates), and the record of the run whose directory holds it (None: none).
    A registered checkpoint from a store that cannot serve it is one line (:class:`TrackingError`), at once:
    MLflow's own client would retry a server that is down for minutes."""
    if checkpoint.startswith(MODELS_PREFIX):
        check_reachable(resolve_tracking_uri(tracking_uri))
    with checkpoint_at(checkpoint, tracking_uri) as path:
        done = score_checkpoint(path, spec, settings, workers=workers, python=python)
        return done, read_record(_run_dir(path))


def _run_dir(path: Path | str) -> Path:
    """The run directory of a checkpoint file or veRL ``global_step_N/`` (``<run>/checkpoints/<it>``)."""
    return Path(path).resolve().parent.parent


def _pending_dir(checkpoint: str, done: Evaluation) -> Path:
    """A directory of its own for an evaluation that waits for ``exgrpo sync`` (which removes it), beside,
    never in place of, a marker the run has: ``evaluation-step_<N>-*`` in the run directory of a checkpoint
    path, in the config's output directory for a registered one (whose download is gone by then)."""
    base = Path(done.config.output_dir) if checkpoint.startswith(MODELS_PREFIX) else _run_dir(checkpoint)
    base.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"evaluation-step_{done.step}-", dir=base))


def _check_database(uri: str) -> None:
    """A sqlite store whose file is gone (moved, or never there) cannot hold an existing run; opening it
    would only make an empty store in its place."""
    db = sqlite_file(uri)
    if db is not None and not db.is_file():
        raise TrackingError(f"the store {uri} has no database file {db} (moved or removed?)")


def record_evaluation(done: Evaluation, checkpoint: str, found: RunRecord | None = None, *,
                      run_id: str | None = None, tracking_uri: str | None = None) -> RecordedEvaluation:
    """Log ``done`` (:func:`score_named` of ``checkpoint``; ``found``: the record of its run directory) into
    ``run_id``, else the run ``found`` names, else a new run tagged ``kind=evaluate`` in the run's
    experiment; in the store ``tracking_uri``, else the one ``found`` names, else ``MLFLOW_TRACKING_URI``,
    else the project's. A log that fails leaves the evaluation in a marker of its own for ``exgrpo sync``
    (the returned ``pending``) and raises nothing."""
    uri = resolve_tracking_uri(tracking_uri if tracking_uri or found is None else found.tracking_uri)
    run_id = run_id or (found.run_id if found is not None else None)
    note = None
    if found is not None and run_id == found.run_id and uri != found.tracking_uri:
        note = (f"note: logging into run {run_id} of {uri} (--tracking-uri); the checkpoint's run directory "
                f"records it in {found.tracking_uri}")
    new_run, cfg = run_id is None, done.config
    entry = pending_evaluation(done.scores, done.step, done.settings, done.subsets)
    created = None
    try:
        if not new_run:
            _check_database(uri)
        tracker = Tracker(uri)
        if new_run:
            created = run_id = tracker.start_run(cfg.name, f"eval-seed{cfg.seed}-step{done.step}",
                                                 run_tags(cfg, extra={"kind": "evaluate", "checkpoint": checkpoint}))
        else:
            tracker.client.get_run(run_id)  # a store without the run says so here, before anything is logged
        placed = log_scores(tracker, run_id, done.scores, done.step, done.settings, done.subsets)
        if new_run:
            tracker.end_run(run_id)
    except Exception as e:  # noqa: BLE001 - the scores are the user's already; the log waits for `exgrpo sync`
        creation = None
        if new_run and created is None:
            creation = {"experiment": cfg.name, "run_name": f"eval-seed{cfg.seed}-step{done.step}", "parent_run_id": None,
                        "tags": run_tags(cfg, extra={"kind": "evaluate", "checkpoint": checkpoint}),
                        "params": {}, "config": cfg.model_dump(mode="json")}
        where = _pending_dir(checkpoint, done)
        # an existing run keeps its status (None); a run of the evaluation's own is finished by the sync
        write_pending(where, uri, run_id, "FINISHED" if new_run else None, create=creation, evaluations=[entry])
        return RecordedEvaluation(done, uri, run_id, {}, new_run, pending=where, error=one_line(e), note=note)
    return RecordedEvaluation(done, uri, run_id, placed.logged, new_run, placed.held, note=note)


def evaluate_into_run(checkpoint: str, spec: str | None = None, settings: EvalSettings = EvalSettings(), *,
                      run_id: str | None = None, tracking_uri: str | None = None, workers: int = 2,
                      python: str | None = None) -> RecordedEvaluation:
    """:func:`score_named`, then :func:`record_evaluation`: the scores logged into ``run_id``, else into the
    run whose directory holds the checkpoint, else into a new run tagged ``kind=evaluate`` in the run's
    experiment (or left for ``exgrpo sync``, when the log fails)."""
    done, found = score_named(checkpoint, spec, settings, tracking_uri=tracking_uri, workers=workers, python=python)
    return record_evaluation(done, checkpoint, found, run_id=run_id, tracking_uri=tracking_uri)
