"""Prefect flow: evaluate a checkpoint (toy tier: greedy val accuracy) and log it to MLflow.

    prefect deployment run 'evaluate/evaluate' --param checkpoint=runs/toy/seed0/checkpoints/step_0000100.pt
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger


def evaluate_checkpoint(checkpoint: str) -> tuple[Any, dict[str, float]]:
    """(config, metrics): rebuild the trainer from the config stored in the checkpoint and evaluate."""
    from exgrpo.backends.native import checkpoint as ckpt
    from exgrpo.backends.native.trainer import Trainer
    from exgrpo.config import ExperimentConfig

    state = ckpt.load_state(checkpoint)
    cfg = ExperimentConfig.model_validate_json(state["config"])
    trainer = Trainer(cfg)
    trainer.load_state_dict(state)
    return cfg, {**trainer.evaluate(), "step": float(trainer.step)}


@flow(name="evaluate", log_prints=True)
def evaluate_flow(checkpoint: str, run_id: str | None = None, tracking_uri: str | None = None) -> dict[str, Any]:
    """Evaluate ``checkpoint``; log ``eval/*`` into MLflow run ``run_id`` (default: a new run
    tagged kind=evaluate in the config's experiment)."""
    from exgrpo.tracking import Tracker, run_tags

    tracker = Tracker(tracking_uri)
    cfg, metrics = evaluate_checkpoint(checkpoint)
    step = int(metrics.pop("step"))
    if run_id is None:
        run_id = tracker.start_run(cfg.name, f"eval-seed{cfg.seed}-step{step}",
                                   run_tags(cfg, extra={"kind": "evaluate", "checkpoint": checkpoint}))
        tracker.log_metrics(run_id, {f"eval/{k.split('/', 1)[-1]}": v for k, v in metrics.items()}, step=step)
        tracker.end_run(run_id)
    else:
        tracker.log_metrics(run_id, {f"eval/{k.split('/', 1)[-1]}": v for k, v in metrics.items()}, step=step)
    get_run_logger().info("%s step %d: %s", checkpoint, step, metrics)
    return {"run_id": run_id, "step": step, **metrics}
