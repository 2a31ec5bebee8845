"""What a finished training run records in MLflow, whatever its backend: one list, one function
(:func:`log_finished_run`), called for native and veRL runs alike.

* the run directory's records (:data:`RECORD_FILES`): ``metrics/metrics.jsonl`` (every step), and a veRL
  run's ``config/verl_run.json`` (the veRL overrides derived from the config) and ``logs/verl.log``;
* ``checkpoints/``: the final policy as a native checkpoint file (``config``, ``model``, ``step``);
  a veRL run's is merged once from its FSDP shards into ``verl_global_step_N.pt`` beside them, and veRL's
  own checkpoint directory is what the ``checkpoint`` tag names;
* the final policy as an MLflow model (up to :data:`MAX_LOGGED_MODEL_PARAMS` parameters) with the run's
  params and every metric logged at its step, wherever it was logged from (a veRL job logs its own);
* the training and evaluation questions as dataset inputs;
* ``eval/*``: the final policy evaluated as the run evaluates (greedy val and train-probe accuracy).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from exgrpo.backends.base import policy_file
from exgrpo.config import ExperimentConfig


RECORD_FILES: dict[str, str] = {"metrics.jsonl": "metrics", "verl_run.json": "config", "verl.log": "logs"}
"""Files of a run directory that are artifacts of its MLflow run (file -> artifact folder), whichever
backend wrote them."""


def log_finished_run(tracker: Any, run_id: str, cfg: ExperimentConfig, result: Any, step: int, *,
                     load_policy: Callable[[Path], Any], evaluate: Callable[[Any], dict[str, float]],
                     log_checkpoint: bool = True, log_model: bool = True) -> None:
    """Record the finished run ``result`` (a TrainResult of any backend) on MLflow run ``run_id``.
    The caller evaluates: ``load_policy(file)`` rebuilds the final policy from its checkpoint file (a
    ``CheckpointPolicy``: its ``task`` and ``policy``), ``evaluate(loaded)`` gives its ``eval/*`` metrics."""
    client = tracker.client
    for name, folder in RECORD_FILES.items():
        record = Path(result.run_dir) / name if result.run_dir else None
        if record is not None and record.is_file():
            client.log_artifact(run_id, str(record), folder)
    if result.checkpoint is None:
        return
    policy_file = policy_checkpoint(Path(result.checkpoint))
    final = load_policy(policy_file)
    log_task_datasets(client, run_id, cfg, final.task)
    if log_checkpoint:
        client.log_artifact(run_id, str(policy_file), "checkpoints")
        client.set_tag(run_id, "checkpoint", str(result.checkpoint))
    tracker.log_metrics(run_id, evaluate(final), step=step)
    if log_model:
        log_final_model(tracker.uri, run_id, final.policy, step)


@contextlib.contextmanager
def _tracking_uri(uri: str):
    """MLflow's fluent API on ``uri`` for a moment: ``mlflow.set_tracking_uri`` also writes
    ``MLFLOW_TRACKING_URI`` into this process's environment, which every process started later
    inherits (a comparison's next run then logged to a server that had gone)."""
    import mlflow

    before_env, before = os.environ.get("MLFLOW_TRACKING_URI"), mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(before)
        if before_env is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = before_env


def policy_checkpoint(checkpoint: Path) -> Path:
    """The policy of a checkpoint as one checkpoint file (config, model, step; no optimiser or pool: it
    evaluates, it does not resume), as the backend that wrote it makes it
    (:func:`exgrpo.backends.base.policy_file`): a native ``step_*.pt`` is one already, a veRL
    ``global_step_N/`` directory has its FSDP shards merged once into ``verl_global_step_N.pt`` beside it."""
    file = policy_file(checkpoint)
    if file is None:
        raise FileNotFoundError(f"checkpoint {checkpoint} is a directory but not a veRL checkpoint")
    return file


def log_task_datasets(client: Any, run_id: str, cfg: ExperimentConfig, task: Any) -> None:
    """Record the run's training and evaluation questions as MLflow dataset inputs (contexts
    ``training`` / ``eval``; one row per question: id and text; the source names the generator and
    the task config, so the digest changes when the questions do)."""
    import mlflow.data
    import pandas as pd
    from mlflow.data.code_dataset_source import CodeDatasetSource
    from mlflow.entities import DatasetInput, InputTag

    source = CodeDatasetSource({"task": cfg.task.model_dump_json()})
    inputs = []
    with warnings.catch_warnings():  # mlflow's schema hint about integer columns is noise here
        warnings.simplefilter("ignore", UserWarning)
        for split, ids, context in (("train", task.train_ids, "training"), ("val", task.val_ids, "eval")):
            if not len(ids):
                continue
            frame = pd.DataFrame({"qid": [int(q) for q in ids], "question": [task.question_text(int(q)) for q in ids]})
            ds = mlflow.data.from_pandas(frame, source=source, name=f"{cfg.task.kind}-{split}")
            inputs.append(DatasetInput(ds._to_mlflow_entity(), [InputTag("mlflow.data.context", context)]))
    # Sibling runs of a compare log the same dataset at the same moment; MLflow checks for it and
    # then inserts it, so one of two concurrent writers can lose the race (an IntegrityError). The
    # retry then finds the row the other one wrote.
    from mlflow.exceptions import MlflowException

    for attempt in range(4):
        try:
            client.log_inputs(run_id, datasets=inputs)
            return
        except MlflowException:
            if attempt == 3:
                raise
            time.sleep(0.2 * (attempt + 1))


MAX_LOGGED_MODEL_PARAMS = 20_000_000
"""Policies up to this size are logged as an MLflow model; larger ones only as the checkpoint
artifact plus a ``model_uri`` tag (a 135M-parameter fp32 model would be ~540 MB per run)."""


def log_final_model(tracking_uri: str, run_id: str, policy: Any, step: int) -> None:
    """Log the trained policy as an MLflow PyTorch model (``name="model"``, a LoggedModel linked to
    the run at ``step``, with the run's params and every metric whose latest value is at ``step``),
    or, above :data:`MAX_LOGGED_MODEL_PARAMS`, tag where its checkpoint is.

    The LoggedModel is created here and linked to the run explicitly: ``log_model`` inside the run
    would read the whole history of every metric to find the values at ``step`` (one query per
    metric, every row of it: 0.1-0.2 s on a 100-step toy run, growing with the run's length); the
    run's latest values, one query, are those at the last step, whichever process logged them (a veRL
    job logs its steps itself). Each value is logged again with the model's id and its original
    timestamp, so the run's history gains no row (MLflow does the same)."""
    import mlflow
    import mlflow.pytorch
    from mlflow.entities import LoggedModelOutput, Metric

    n_params = sum(p.numel() for p in policy.parameters())
    client = mlflow.MlflowClient(tracking_uri)
    run = client.get_run(run_id)
    if n_params > MAX_LOGGED_MODEL_PARAMS:
        client.set_tag(run_id, "model_uri", run.data.tags.get("checkpoint", ""))
        return
    model = client.create_logged_model(run.info.experiment_id, name="model", source_run_id=run_id,
                                       params=dict(run.data.params))
    # mlflow.pytorch warns on every pickled save; the trade-off is stated once, in the README
    logging.getLogger("mlflow.pytorch").setLevel(logging.ERROR)
    with warnings.catch_warnings(), _tracking_uri(tracking_uri):
        warnings.simplefilter("ignore")
        info = mlflow.pytorch.log_model(policy, model_id=model.model_id, serialization_format="pickle",
                                        pip_requirements=["torch==2.13.0", "exgrpo-lab"])
    client.log_outputs(run_id, [LoggedModelOutput(model.model_id, step=step)])
    latest = [Metric.from_proto(m) for m in run.data.to_proto().metrics]  # RunData keeps no public list of them
    values = [Metric(m.key, m.value, m.timestamp, m.step, model_id=model.model_id) for m in latest if m.step == step]
    for i in range(0, len(values), 1000):
        client.log_batch(run_id, metrics=values[i:i + 1000])
    client.set_tag(run_id, "model_uri", info.model_uri)
