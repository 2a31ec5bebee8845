"""The MLflow server going away, mid-run or before a run starts, loses nothing and stalls nothing.

A real `mlflow server` process on 127.0.0.1, killed (SIGKILL to its process group) during training
and started again on the same store. Before: training stalled for minutes in MLflow's HTTP retries,
the run was lost and stayed RUNNING.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from exgrpo import cli
from exgrpo.config import load_experiment
from exgrpo.launch import tracked_train
from exgrpo.tracking.sync import PENDING_FILE
from mlflowserver import Server

TOY = {"task.max_operand": 4, "policy.hidden": 16, "train.batch_size": 8, "algorithm.group_size": 4,
       "train.max_steps": 30, "train.epochs": 50}



@pytest.fixture
def server(tmp_path):
    (tmp_path / "mlflow").mkdir()
    srv = Server(tmp_path / "mlflow")
    srv.start()
    yield srv
    srv.kill()


def _end_record(uri: str, run_id: str) -> dict:
    """What a finished run recorded at its end: artifacts (with the checkpoint's files), the tags and
    metric names of its checkpoint, evaluation and model."""
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    run = client.get_run(run_id)
    return {"artifacts": sorted(a.path for a in client.list_artifacts(run_id)),
            "checkpoints": sorted(a.path for a in client.list_artifacts(run_id, "checkpoints")),
            "tags": sorted(k for k in run.data.tags if k in ("checkpoint", "model_uri")),
            "eval": sorted(k for k in run.data.metrics if k.startswith("eval/"))}


def _history(uri: str, run_id: str, key: str) -> list[int]:
    from mlflow import MlflowClient

    return sorted(m.step for m in MlflowClient(uri).get_metric_history(run_id, key))


def _points(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    """Every (step, value) MLflow holds for ``key``, repeats included."""
    from mlflow import MlflowClient

    return sorted((m.step, m.value) for m in MlflowClient(uri).get_metric_history(run_id, key))


def test_mlflow_killed_mid_run_and_restarted_loses_no_metric(server, tmp_path, caplog, monkeypatch):
    from exgrpo.tracking import step_logger

    monkeypatch.setattr(step_logger, "FLUSH_SECONDS", 0.0)  # write every step, so writes hit the outage
    cfg = load_experiment("experiments/toy-exgrpo.yaml", {**TOY, "output_dir": str(tmp_path / "runs")})

    def outage(step: int, _metrics: dict) -> None:
        if step == 5:
            server.kill()
        if step == 20:
            server.start()

    run = tracked_train(cfg, tracking_uri=server.url, callbacks=[outage], log_model=False)
    assert run.synced
    said = [r.getMessage() for r in caplog.records]
    assert any("MLflow is unreachable" in m for m in said) and any("reachable again" in m for m in said)
    from mlflow import MlflowClient

    info = MlflowClient(server.url).get_run(run.run_id).info
    assert info.status == "FINISHED"
    assert _history(server.url, run.run_id, "batch/solved") == list(range(1, 31))


def test_mlflow_down_at_the_end_is_finished_by_exgrpo_sync(server, tmp_path, capsys):
    cfg = load_experiment("experiments/toy-exgrpo.yaml", {**TOY, "output_dir": str(tmp_path / "runs")})

    def outage(step: int, _metrics: dict) -> None:
        if step == 5:
            server.kill()

    run = tracked_train(cfg, tracking_uri=server.url, callbacks=[outage], log_model=False)
    assert not run.synced and run.result.final_metrics["step"] == 30  # training finished regardless
    run_dir = Path(run.result.run_dir)
    assert (run_dir / PENDING_FILE).is_file()
    assert "exgrpo sync" in capsys.readouterr().out

    server.start()
    from mlflow import MlflowClient

    client = MlflowClient(server.url)
    assert client.get_run(run.run_id).info.status == "RUNNING"
    assert cli.main(["sync", str(tmp_path / "runs")]) == 0
    assert client.get_run(run.run_id).info.status == "FINISHED"
    assert _history(server.url, run.run_id, "batch/solved") == list(range(1, 31))
    assert not (run_dir / PENDING_FILE).exists()
    end = _end_record(server.url, run.run_id)  # the checkpoint and evaluation of any finished run
    assert end["checkpoints"] == ["checkpoints/step_0000030.pt"] and end["tags"] == ["checkpoint"], end
    assert "eval/val/avg_at_1" in end["eval"], end
    assert cli.main(["sync", str(tmp_path / "runs")]) == 0  # idempotent: nothing left
    assert _history(server.url, run.run_id, "batch/solved") == list(range(1, 31))


def test_sweep_driver_records_every_trial_and_goes_on_when_mlflow_dies(server, tmp_path, capsys):
    """MLflow dies after the first trial: the later trials are recorded FAIL in Optuna, the driver
    returns its result instead of a traceback, and its summary waits on disk for `exgrpo sync`, as a
    comparison's does; the same sweep command run again, MLflow back, registers the champion."""
    import optuna
    import ray

    from exgrpo.sweep import load_sweep, run_sweep

    sc = load_sweep({
        "study": {"name": "outage", "n_trials": 3, "parallel": 1, "pruner": "none", "sampler": "random"},
        "base": "experiments/toy.yaml",
        "base_overrides": {"name": "outage-sweep", "algorithm.replay": "buckets", "output_dir": str(tmp_path / "runs"),
                           "task.max_operand": 4, "policy.hidden": 16, "policy.layers": 1,
                           "train.batch_size": 8, "algorithm.group_size": 4},
        "budget_steps": 4,
        "space": {"algorithm.experience_ratio": {"type": "float", "low": 0.1, "high": 0.9}},
    })
    storage = f"sqlite:///{tmp_path}/optuna.db"
    seen = []

    def on_trial(out):
        seen.append(out["state"])
        if len(seen) == 1:
            server.kill()

    try:
        res = run_sweep(sc, storage=storage, tracking_uri=server.url, on_trial=on_trial)
        assert seen == ["COMPLETE", "FAIL", "FAIL"]
        assert res.counts == {"COMPLETE": 1, "PRUNED": 0, "FAIL": 2} and res.best_value is not None
        assert res.summary_error is not None
    finally:
        ray.shutdown()
    where = tmp_path / "runs" / "sweeps" / "outage"
    assert (where / PENDING_FILE).is_file() and (where / "trials.csv").is_file()
    assert f"exgrpo sync {where}" in capsys.readouterr().out

    server.start()
    assert cli.main(["sync", str(where)]) == 0
    from mlflow import MlflowClient

    client = MlflowClient(server.url)
    parent = client.get_run(res.parent_run_id)
    assert parent.info.status == "FINISHED" and parent.data.metrics["trials_fail"] == 2.0
    assert _points(server.url, res.parent_run_id, "trials_fail") == [(3, 2.0)]  # at the study's step, once
    assert "best/algorithm.experience_ratio" in parent.data.tags
    assert "sweep/trials.csv" in {a.path for a in client.list_artifacts(res.parent_run_id, "sweep")}
    assert "champion_model" not in parent.data.tags  # MLflow was down when the best trial was to be registered

    # the same command again, MLflow up: nothing to train, the summary written and the champion registered
    try:
        again = run_sweep(sc, storage=storage, tracking_uri=server.url)
    finally:
        ray.shutdown()
    assert again.outcomes == [] and again.summary_error is None
    assert again.champion == "models:/exgrpo-outage@champion"
    best_run = optuna.load_study(study_name="outage", storage=storage).best_trial.user_attrs["mlflow_run_id"]
    assert client.get_model_version_by_alias("exgrpo-outage", "champion").run_id == best_run
    parent = client.get_run(res.parent_run_id)
    assert parent.info.status == "FINISHED" and parent.data.tags["champion_model"].startswith(again.champion)
    assert _points(server.url, res.parent_run_id, "trials_fail") == [(3, 2.0)]  # written again, not twice


def test_compare_parent_run_is_kept_for_exgrpo_sync_when_mlflow_dies_at_the_end(server, tmp_path, capsys):
    from mlflow import MlflowClient

    from exgrpo.config import load_compare
    from exgrpo.compare.tracked import run_tracked_compare

    cc = load_compare("experiments/toy.yaml", {"name": "outage-cmp", "output_dir": str(tmp_path / "runs"),
                                               "task.max_operand": 4, "policy.hidden": 16, "policy.layers": 1,
                                               "train.batch_size": 8, "algorithm.group_size": 4, "train.max_steps": 3})
    cc = cc.model_copy(update={"arms": {"grpo": cc.arms["grpo"], "exgrpo": cc.arms["exgrpo"]}, "seeds": [0]})
    done = []

    def on_done(outcome):
        done.append(outcome)
        if len(done) == 2:  # every child finished and reached MLflow; the parent's statistics will not
            server.kill()

    res = run_tracked_compare(cc, tracking_uri=server.url, executor="process", workers=1, on_done=on_done)
    assert res.summary_error is not None and len(res.rows) == 2
    where = tmp_path / "runs" / "outage-cmp"
    assert (where / PENDING_FILE).is_file() and (where / "comparison.md").read_text().strip() == res.table.strip()
    assert f"exgrpo sync {where}" in capsys.readouterr().out

    server.start()
    assert cli.main(["sync", str(where)]) == 0
    parent = MlflowClient(server.url).get_run(res.parent_run_id)
    assert parent.info.status == "FINISHED" and "exgrpo/final_mean" in parent.data.metrics
    assert parent.data.tags["mlflow.note.content"] == res.description
    names = {a.path for a in MlflowClient(server.url).list_artifacts(res.parent_run_id)}
    assert {"comparison.md", "outcomes.json"} <= names


def test_a_comparison_run_that_starts_during_an_outage_trains_and_is_delivered_by_sync(server, tmp_path, capsys):
    """The server is killed once the first run has finished, so the second starts while it is down:
    it trains anyway, the comparison ends with its table naming the run whose record is pending, and
    after the server returns `exgrpo sync` leaves every run FINISHED with all of its steps."""
    from mlflow import MlflowClient

    from exgrpo.config import load_compare
    from exgrpo.compare.tracked import run_tracked_compare

    cc = load_compare("experiments/toy.yaml", {"name": "outage-start", "output_dir": str(tmp_path / "runs"),
                                               "task.max_operand": 4, "policy.hidden": 16, "policy.layers": 1,
                                               "train.batch_size": 8, "algorithm.group_size": 4, "train.max_steps": 5})
    cc = cc.model_copy(update={"arms": {"grpo": cc.arms["grpo"], "exgrpo": cc.arms["exgrpo"]}, "seeds": [0]})
    res = run_tracked_compare(cc, tracking_uri=server.url, executor="process", workers=1,
                              on_done=lambda o: server.kill())
    assert len(res.outcomes) == 2 and not res.failures  # both trained
    first, second = res.outcomes
    assert first.run_id and not first.records_pending
    assert second.run_id is None and second.records_pending
    assert f"MLflow records pending for 1 run(s): {second.arm} seed 0" in res.table
    assert "| grpo |" in res.table and "| exgrpo |" in res.table  # the table covers both arms
    out = capsys.readouterr().out
    assert f"cannot take run {second.arm}-seed0 now; it trains anyway" in out

    server.start()
    assert cli.main(["sync", str(tmp_path / "runs")]) == 0
    client = MlflowClient(server.url)
    runs = client.search_runs([res.experiment_id], "tags.arm != ''")
    assert sorted(r.data.tags["arm"] for r in runs) == ["exgrpo", "grpo"]
    for r in runs:
        assert r.info.status == "FINISHED" and r.data.tags["mlflow.parentRunId"] == res.parent_run_id
        assert _history(server.url, r.info.run_id, "batch/solved") == [1, 2, 3, 4, 5]
        assert r.data.params  # the curated params, also for the run created by sync
    # the run that sync delivered recorded its end as the other did: checkpoint, evaluation, model
    recorded, delivered = (_end_record(server.url, _run_of(runs, o.arm)) for o in (first, second))
    assert recorded == delivered and recorded["checkpoints"] and recorded["tags"] == ["checkpoint", "model_uri"]
    assert client.get_run(res.parent_run_id).info.status == "FINISHED"
    assert not list((tmp_path / "runs").rglob(PENDING_FILE))


def _run_of(runs, arm: str) -> str:
    return next(r.info.run_id for r in runs if r.data.tags["arm"] == arm)


def test_a_summary_mlflow_refuses_while_it_is_up_is_delivered_once_by_sync_which_ends_the_parent(server, tmp_path,
                                                                                                 capsys):
    """finish_parent with MLflow up but the summary refused (a tag key MLflow does not accept): the summary
    waits on disk for `exgrpo sync`, and the note says what failed instead of "unreachable". The sync
    delivers what MLflow takes once, at the summary's step, keeps what it refuses on disk and says so,
    and ends the parent with the summary's status; a second sync finds nothing to do."""
    import json

    from mlflow import MlflowClient

    from exgrpo.batch import ParentSummary, finish_parent
    from exgrpo.tracking import Tracker

    tracker = Tracker(server.url)
    parent = tracker.start_run("refused", "parent")
    where = tmp_path / "pending"
    summary = ParentSummary("FINISHED", {"best_value": 0.5}, step=3, tags={"bad?key": "x", "best/lr": "0.1"},
                            texts={"sweep/trials.csv": "number,value\n0,0.5\n"})
    error = finish_parent(tracker, parent, summary, where, "comparison")
    out = capsys.readouterr().out
    assert error and (where / PENDING_FILE).is_file()
    assert "MLflow did not take the comparison's summary" in out and "unreachable" not in out, out

    assert cli.main(["sync", str(where)]) == 0
    out = capsys.readouterr().out
    client = MlflowClient(server.url)
    run = client.get_run(parent)
    assert run.info.status == "FINISHED"
    assert _points(server.url, parent, "best_value") == [(3, 0.5)]  # once, at the summary's step
    assert run.data.tags["best/lr"] == "0.1" and "bad?key" not in run.data.tags
    assert "sweep/trials.csv" in {a.path for a in client.list_artifacts(parent, "sweep")}
    assert "MLflow refused tag 'bad?key'" in out and str(where / "mlflow_refused.json") in out, out
    kept = json.loads((where / "mlflow_refused.json").read_text())
    assert [(r["kind"], r["key"], r["value"]) for r in kept] == [("tag", "bad?key", "x")]
    assert not (where / PENDING_FILE).exists()

    assert cli.main(["sync", str(where)]) == 0  # idempotent: nothing left
    assert "nothing to sync" in capsys.readouterr().out
    assert _points(server.url, parent, "best_value") == [(3, 0.5)]


def test_only_a_request_mlflow_rejects_is_kept_as_refused_a_server_error_is_tried_again(server):
    """While MLflow is up, what rejects the request itself is kept as refused (every sync would meet it
    again): a value MLflow does not accept, a file too large for the artifact proxy, a file the marker names
    that is gone. What may pass is raised, so the marker stays and the value is sent by the next sync: a
    server error (its database locked, a restart), a login refused (a password rotated), a closed database
    connection the SQL store reports as a bad request, a dropped connection."""
    import requests
    import sqlalchemy.exc
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import (BAD_REQUEST, INTERNAL_ERROR, INVALID_PARAMETER_VALUE,
                                              TEMPORARILY_UNAVAILABLE, UNAUTHENTICATED)

    from exgrpo.tracking.sync import _Delivery

    def fails(error):
        def send():
            raise error
        return send

    def http_error(status: int) -> requests.HTTPError:
        response = requests.Response()
        response.status_code = status
        return requests.HTTPError(f"{status}", response=response)

    def wrapping(cause: Exception, code) -> MlflowException:
        try:
            raise MlflowException(str(cause), code) from cause
        except MlflowException as e:
            return e

    deliver = _Delivery(server.url)
    refused = {"bad?key": MlflowException("Invalid tag name", INVALID_PARAMETER_VALUE),
               "big.bin": http_error(413), "gone.txt": FileNotFoundError("gone.txt"),
               "twice": wrapping(sqlalchemy.exc.IntegrityError("INSERT", {}, Exception("UNIQUE")), BAD_REQUEST)}
    for key, error in refused.items():
        deliver("tag", key, "x", fails(error))
    assert [r["key"] for r in deliver.refused] == list(refused)
    for error in (MlflowException("database is locked", INTERNAL_ERROR),
                  MlflowException("try later", TEMPORARILY_UNAVAILABLE),
                  MlflowException("bad credentials", UNAUTHENTICATED),
                  wrapping(sqlalchemy.exc.InterfaceError("SELECT", {}, Exception("connection already closed")),
                           BAD_REQUEST),
                  http_error(503), requests.ConnectionError("connection reset by peer")):
        with pytest.raises(type(error)):
            deliver("metric", "loss", {"step": 1, "value": 0.5}, fails(error))
    assert [r["key"] for r in deliver.refused] == list(refused)


def test_a_ray_that_does_not_start_while_mlflow_is_down_is_the_error_the_user_sees(server, tmp_path, monkeypatch):
    """Ray does not start and MLflow is gone as well: the parent's error tag cannot be written, and
    Ray's one line is what is raised, not MLflow's."""
    import ray

    from exgrpo.batch import start_on_ray
    from exgrpo.cluster import ClusterError
    from exgrpo.tracking import Tracker

    if ray.is_initialized():  # a Ray an earlier test of this process started would be used instead
        ray.shutdown()
    deep = tmp_path / ("d" * 60) / ("e" * 60)  # too long for Ray's socket paths: Ray itself refuses to start
    deep.mkdir(parents=True)
    monkeypatch.setenv("RAY_TMPDIR", str(deep))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    tracker = Tracker(server.url)
    parent = tracker.start_run("ray-and-mlflow-down", "parent")
    server.kill()
    with pytest.raises(ClusterError) as e:
        start_on_ray(None, tracker.client, parent)
    assert str(e.value).startswith("the private local Ray did not start"), e.value
