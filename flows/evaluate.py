"""Prefect flow: evaluate a checkpoint and log its scores to MLflow, as ``exgrpo eval`` does.

    prefect deployment run 'evaluate/evaluate' --param checkpoint=runs/toy/seed0/checkpoints/step_0000100.pt

By default as the run evaluates (greedy on its held-out split and its training probe:
``eval/val/avg_at_1``, ``eval/train/avg_at_1``); ``benchmarks`` and ``settings`` name others, as
``exgrpo eval``'s options do. Both call the same functions (:mod:`exgrpo.recorded_eval`):
the same scores under the same names, into the run named, else the checkpoint's own run, else a new run
tagged ``kind=evaluate``.

A checkpoint is a native ``step_*.pt`` or a veRL run's ``global_step_N/`` (its FSDP shards merged:
:mod:`exgrpo.backends.verl.actor_weights`); a veRL run of an external HF model (``policy.path`` or ``backend.verl.model_path``)
is merged into an HF directory and scored by the job environment's vLLM (:mod:`exgrpo.evaluation.hf_eval`). The evaluate deployment also runs by itself when a run of
the train or train-verl deployment completes (a
deployment trigger in prefect.yaml on Prefect's ``prefect.flow-run.Completed`` event): it is given
the train flow run, finds the MLflow run that flow created (tag ``prefect_flow_run_id``) and its
final checkpoint, and logs ``eval/*`` on that same run (a value the run already has at that step is not
logged twice; other settings than the run's own get names that carry them, ``eval/val/pass_at_1/n4-t0.7-seed0``).
The scores are computed and logged to the flow run before MLflow is asked; a log that fails leaves them for
``exgrpo sync`` (the result's ``pending``).

``async`` as the train flow is (see :mod:`flows.train`): a synchronous flow run waits up to 1 s for
Prefect's heartbeat thread at its end. From Python: ``asyncio.run(evaluate_flow(...))``.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger

from exgrpo.errors import redact_uri
from exgrpo.evaluation.metrics import EvalSettings
from exgrpo.tracking import Tracker

__all__ = ["evaluate_flow", "find_train_run"]


def find_train_run(train_flow_run: str, tracking_uri: str | None) -> tuple[str, str, str | None]:
    """(checkpoint, MLflow run id, tracking URI) of the run a train flow run created; ``train_flow_run``
    is the flow run's id or its event resource id (``prefect.flow-run.<id>``)."""
    from uuid import UUID

    from prefect.client.orchestration import get_client

    flow_run_id = train_flow_run.rsplit(".", 1)[-1]
    with get_client(sync_client=True) as client:
        params = client.read_flow_run(UUID(flow_run_id)).parameters
    uri = tracking_uri or params.get("tracking_uri")
    mlflow = Tracker(uri).client
    exps = [e.experiment_id for e in mlflow.search_experiments()]
    runs = mlflow.search_runs(exps, filter_string=f"tags.prefect_flow_run_id = '{flow_run_id}'")
    if not runs:
        raise LookupError(f"no MLflow run is tagged prefect_flow_run_id={flow_run_id} in "
                          f"{redact_uri(Tracker(uri).uri)}")
    run = runs[0]
    checkpoint = run.data.tags.get("checkpoint")
    if not checkpoint:
        raise LookupError(f"MLflow run {run.info.run_id} has no checkpoint tag (did the train run finish?)")
    return checkpoint, run.info.run_id, uri


@flow(name="evaluate", log_prints=True)
async def evaluate_flow(checkpoint: str | None = None, run_id: str | None = None, tracking_uri: str | None = None,
                        train_flow_run: str | None = None, benchmarks: str | None = None,
                        settings: EvalSettings = EvalSettings()) -> dict[str, Any]:
    """Evaluate ``checkpoint`` (a path or ``models:/<name>@<alias>``) on ``benchmarks`` (None: as its run
    evaluates) sampled with ``settings``; log ``eval/<benchmark>/<metric>`` into MLflow run ``run_id``
    (default: the checkpoint's own run, else a new run tagged kind=evaluate). With ``train_flow_run`` (what
    the trigger passes), the checkpoint and the run are those of that train flow run."""
    if train_flow_run is not None:
        checkpoint, run_id, tracking_uri = find_train_run(train_flow_run, tracking_uri)
    if checkpoint is None:
        raise ValueError("evaluate: give checkpoint=<path to step_N.pt or a veRL global_step_N/> (or "
                         "train_flow_run=<flow run id>)")
    # torch: when the flow runs, not when Prefect reads it
    from exgrpo.recorded_eval import record_evaluation, score_named

    evaluation, found = score_named(checkpoint, benchmarks, settings, tracking_uri=tracking_uri)
    scores = {s.key: s.value for s in evaluation.scores}
    logger = get_run_logger()
    logger.info("%s step %d: %s", checkpoint, evaluation.step, scores)
    done = record_evaluation(evaluation, checkpoint, found, run_id=run_id, tracking_uri=tracking_uri)
    if done.pending is not None:
        from exgrpo.errors import redact_uri

        logger.warning("the scores are not in MLflow (%s); `exgrpo sync %s` logs them", redact_uri(done.error or ""),
                       done.pending)
    return {"run_id": done.run_id, "step": evaluation.step, "scores": scores, "logged": done.logged,
            "pending": str(done.pending) if done.pending else None}
