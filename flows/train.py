"""Prefect flow: train one (config, seed) run into MLflow.

    prefect deployment run 'train/train' --param config=experiments/toy-exgrpo.yaml
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_link_artifact


@flow(name="train", log_prints=True)
def train_flow(
    config: str | None = "experiments/toy-exgrpo.yaml",
    overrides: dict[str, Any] | None = None,
    seed: int | None = None,
    tracking_uri: str | None = None,
    resume: bool = False,
) -> dict[str, Any]:
    """One tracked training run: MLflow run with tags, params, per-step metrics and the checkpoint."""
    from exgrpo.config import load_experiment
    from exgrpo.tracking import tracked_train

    overrides = dict(overrides or {})
    if seed is not None:
        overrides["seed"] = seed
    cfg = load_experiment(config, overrides)
    if cfg.backend.name == "verl" and "backend.verl.launch" not in overrides:
        # the flow launches veRL runs as Ray Jobs: the MLflow run exists first, the job's log streams here
        cfg = load_experiment(config, {**overrides, "backend.verl.launch": "ray_job"})
    from prefect.runtime import flow_run

    # the tag lets the evaluate deployment (triggered by this flow run's completion) find the run
    tags = {"prefect_flow_run_id": str(flow_run.id)} if flow_run.id else None
    run = tracked_train(cfg, tracking_uri=tracking_uri, resume=resume, progress=cfg.backend.name == "verl", tags=tags)
    final = {k: v for k, v in run.result.final_metrics.items() if k.startswith(("val/", "batch/solved"))}
    get_run_logger().info("%s seed %d: %s (mlflow run %s)", cfg.name, cfg.seed, final, run.run_id)
    create_link_artifact(run.url, link_text=f"MLflow: {cfg.name} seed {cfg.seed}")
    return {"run_id": run.run_id, "checkpoint": str(run.result.checkpoint), **final}


if __name__ == "__main__":
    train_flow()
