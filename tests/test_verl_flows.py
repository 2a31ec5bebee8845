"""veRL runs driven by Prefect flows: a comparison of GRPO and ExGRPO through the compare flow, and a
train flow whose Ray Job fails."""

import asyncio

import pytest


from verlutil import EXGRPO


# ------------------------------------------------------------------------------------ Prefect -> Ray Job -> MLflow
@pytest.mark.slow
def test_a_train_flow_whose_ray_job_fails_ends_its_mlflow_run_failed(tmp_path, exgrpo_cache, monkeypatch):
    """The train flow submits the veRL run as a Ray Job; a job that fails (here veRL refuses an
    unknown setting) fails the flow and ends the MLflow run FAILED with the job id in the error.
    A job that succeeds, logging live, is tests/test_prefect_server.py's train-verl deployment run."""
    for k, v in {"PREFECT_HOME": str(tmp_path / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                 "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90", "EXGRPO_CACHE": str(exgrpo_cache)}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    import mlflow
    import ray

    from exgrpo.backends.verl import jobs
    from flows.train import train_flow

    monkeypatch.setattr(jobs, "_LOCAL_JOB_SERVER", None)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    try:
        with pytest.raises(Exception, match=r"Ray Job \S+ FAILED"):
            asyncio.run(train_flow(config=EXGRPO, overrides={"output_dir": str(tmp_path / "bad"), "name": "verl-bad",
                                                             "backend.verl.extra_overrides": ["actor_rollout_ref.actor.no_such_key=1"]},
                                   tracking_uri=uri))
    finally:
        ray.shutdown()  # the job server this test started
    client = mlflow.MlflowClient(uri)
    (bad,) = client.search_runs([client.get_experiment_by_name("verl-bad").experiment_id])
    assert bad.info.status == "FAILED" and "Ray Job" in bad.data.tags["error"] and bad.data.tags["ray_job_id"]


@pytest.mark.slow
def test_prefect_compare_flow_runs_grpo_and_exgrpo_on_verl_into_mlflow(tmp_path, exgrpo_cache, monkeypatch):
    """`exgrpo compare experiments/verl-tiny.yaml`'s path: the Prefect compare flow runs each arm as a
    Ray task that launches its own veRL run (a private Ray inside a Ray task); both runs log live to
    their MLflow child runs, ExGRPO's really replays, and the parent run gets the statistics."""
    for k, v in {"PREFECT_HOME": str(tmp_path / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                 "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90", "EXGRPO_CACHE": str(exgrpo_cache)}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    import mlflow
    import ray

    from flows.compare import compare_flow

    ray.shutdown()  # the Ray tasks must inherit this test's environment (EXGRPO_CACHE)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    overrides = {"output_dir": str(tmp_path / "runs"), "train.max_steps": 4, "train.eval_every_steps": 2,
                 "train.checkpoint_every": 4}
    try:
        out = compare_flow(config="experiments/verl-tiny.yaml", seeds=1, tracking_uri=uri, overrides=overrides)
        # resumed: both runs have ended, so neither trains again (no step 5), and each new child run
        # gets the whole history from metrics.jsonl without a "did not arrive live" warning
        again = compare_flow(config="experiments/verl-tiny.yaml", seeds=1, tracking_uri=uri, overrides=overrides,
                             resume=True)
    finally:
        ray.shutdown()
    assert "| grpo | 1 |" in out["table"] and "| exgrpo | 1 |" in out["table"]
    client = mlflow.MlflowClient(uri)
    parent = client.get_run(out["parent_run_id"])
    assert parent.info.status == "FINISHED" and "exgrpo/diff_vs_grpo" in parent.data.metrics
    runs = {arm.split("/")[0]: client.get_run(rid) for arm, rid in out["runs"].items()}
    for arm, run in runs.items():
        assert run.info.status == "FINISHED" and run.data.params["backend.name"] == "verl", arm
        assert [m.step for m in client.get_metric_history(run.info.run_id, "batch/solved")] == [1, 2, 3, 4]
        assert [m.step for m in client.get_metric_history(run.info.run_id, "val/accuracy")] == [2, 4]
        assert "live_metrics" not in run.data.tags  # logged by the job while it ran, nothing backfilled
    replayed = client.get_metric_history(runs["exgrpo"].info.run_id, "replay/questions")
    off = client.get_metric_history(runs["exgrpo"].info.run_id, "actor/off_token_fraction")
    assert max(m.value for m in replayed) > 0 and max(m.value for m in off) > 0
    assert max(m.value for m in client.get_metric_history(runs["grpo"].info.run_id, "replay/questions")) == 0

    assert again["table"] == out["table"]
    assert sorted(p.name for p in (tmp_path / "runs").glob("verl-tiny/verl-tiny-*/seed0/checkpoints/global_step_*")) == [
        "global_step_4", "global_step_4"]
    for rid in again["runs"].values():
        run = client.get_run(rid)
        assert [m.step for m in client.get_metric_history(rid, "batch/solved")] == [1, 2, 3, 4]
        assert "live_metrics" not in run.data.tags and run.data.tags["checkpoint"].endswith("global_step_4")
