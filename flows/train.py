"""Prefect flow: train one (config, seed) run into MLflow.

    prefect deployment run 'train/train' --param config=experiments/toy-exgrpo.yaml

The flow is ``async`` for one reason: Prefect's synchronous flow engine ends every flow run by
joining its heartbeat thread, which sleeps in whole seconds (``prefect/flow_engine.py:
_send_heartbeats``, Prefect 3.8.8 and 3.9.1), so each run waited up to 1 s after its work was done
(an empty synchronous flow run took 1.07 s here, an ``async`` one 0.13 s). The async engine sends the
same heartbeats and does not wait for the thread. The body is the same blocking call as before, in
the flow's own (main) thread, as the reward's in-process grading needs. From Python:
``asyncio.run(train_flow(...))``; deployments and workers run it as they run any flow.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import acreate_link_artifact

from flows import failed, user_errors
from exgrpo.config import load_run


@flow(name="train", log_prints=True)
async def train_flow(
    config: str | None = "experiments/toy-exgrpo.yaml",
    overrides: dict[str, Any] | None = None,
    seed: int | None = None,
    tracking_uri: str | None = None,
    resume: bool = False,
    ray_address: str | None = None,
    arm: str | None = None,
) -> dict[str, Any]:
    """One tracked training run: MLflow run with tags, params, per-step metrics and the checkpoint.
    ``config`` an experiment file, or a comparison file whose ``arm`` (default: its first) runs, said in
    the flow run's log. ``ray_address`` (else ``RAY_ADDRESS``): the Ray cluster the run (a veRL job, or
    a native run as a Ray task) goes to."""
    from exgrpo.launch import launch_run  # torch: when the flow runs, not when Prefect reads it

    overrides = dict(overrides or {})
    if seed is not None:
        overrides["seed"] = seed
    try:
        cfg, note = load_run(config, overrides, arm)
        if cfg.backend.name == "verl" and "backend.verl.launch" not in overrides:
            # the flow launches veRL runs as Ray Jobs: the MLflow run exists first, the job's log streams here
            cfg, note = load_run(config, {**overrides, "backend.verl.launch": "ray_job"}, arm)
    except user_errors() as e:
        return failed(e)
    if note is not None:
        print(note)
    from prefect.runtime import flow_run

    # the tag lets the evaluate deployment (triggered by this flow run's completion) find the run
    tags = {"prefect_flow_run_id": str(flow_run.id)} if flow_run.id else None
    try:  # the same checks in the same order as `exgrpo train`, before the run's record exists
        run = launch_run(cfg, tracking_uri=tracking_uri, ray_address=ray_address, resume=resume,
                         progress=cfg.backend.name == "verl", tags=tags)
    except user_errors() as e:
        return failed(e)
    final = {k: v for k, v in run.result.final_metrics.items() if k.startswith(("val/", "batch/solved"))}
    get_run_logger().info("%s seed %d: %s (mlflow run %s)", cfg.name, cfg.seed, final, run.run_id)
    await acreate_link_artifact(run.url, link_text=f"MLflow: {cfg.name} seed {cfg.seed}")
    return {"run_id": run.run_id, "checkpoint": str(run.result.checkpoint), **final}


if __name__ == "__main__":
    import asyncio

    asyncio.run(train_flow())
