"""Live MLflow metrics of a veRL job: the tailer of veRL's metric file, and the caller's backfill."""

import json
import threading

import mlflow

from exgrpo.backends.verl.live import LiveMetrics, StepFeed, verl_row
from exgrpo.tracking.mlflow_tracking import backfill_steps
from exgrpo.tracking.step_logger import MLflowStepLogger


def _run(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = mlflow.MlflowClient(uri)
    exp = client.create_experiment("live")
    return uri, client, client.create_run(exp).info.run_id


def _line(step, solved):
    rec = {"step": step, "data": {"batch/solved": solved, "val-core/arith/acc/mean@1": 0.5, "note": "x", "flag": True}}
    return (json.dumps(rec) + "\n").encode()


def test_verl_row_uses_metrics_md_names():
    step, row = verl_row(json.loads(_line(3, 0.25)))
    assert step == 3
    assert row == {"step": 3.0, "batch/solved": 0.25, "val-core/arith/acc/mean_at_1": 0.5, "val/accuracy": 0.5}


def test_tailer_logs_complete_lines_as_they_are_written(tmp_path):
    uri, client, run_id = _run(tmp_path)
    path = tmp_path / "metrics.jsonl"
    live = LiveMetrics(path, uri, run_id)
    assert live.poll() == 0  # veRL has not opened its file yet
    with path.open("wb", buffering=0) as f:
        f.write(_line(1, 0.5))
        half = _line(2, 0.75)
        f.write(half[:10])  # a line being written
        assert live.poll() == 1
        live.logger.flush(force=True)
        assert [(m.step, m.value) for m in client.get_metric_history(run_id, "batch/solved")] == [(1, 0.5)]
        f.write(half[10:])
        f.write(_line(3, 1.0))
    assert live.stop()
    assert [m.step for m in client.get_metric_history(run_id, "batch/solved")] == [1, 2, 3]
    assert [m.value for m in client.get_metric_history(run_id, "val/accuracy")] == [0.5, 0.5, 0.5]


def test_the_thread_delivers_without_being_asked(tmp_path):
    uri, client, run_id = _run(tmp_path)
    path = tmp_path / "metrics.jsonl"
    live = LiveMetrics(path, uri, run_id, poll_seconds=0.05).start()
    path.write_bytes(_line(1, 0.5))
    import time

    deadline = time.monotonic() + 20
    while not client.get_metric_history(run_id, "batch/solved") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [m.step for m in client.get_metric_history(run_id, "batch/solved")] == [1]
    assert live.stop()


def test_backfill_logs_only_the_steps_that_never_arrived_and_says_so(tmp_path, capsys):
    uri, client, run_id = _run(tmp_path)
    history = [{"step": float(s), "batch/solved": s / 4} for s in (1, 2, 3)]
    logger = MLflowStepLogger(client, run_id)
    logger(1, history[0])
    logger.flush(force=True)
    assert backfill_steps(client, run_id, history, logger) == 2
    logger.flush(force=True)
    assert [m.step for m in client.get_metric_history(run_id, "batch/solved")] == [1, 2, 3]
    assert client.get_run(run_id).data.tags["live_metrics"] == "partial"
    assert "logged 1 of 3 steps to MLflow" in capsys.readouterr().out
    assert backfill_steps(client, run_id, history, logger) == 0  # nothing twice


def test_step_logger_writes_every_flush_every_steps_or_once_flush_seconds_have_passed(tmp_path):
    uri, client, run_id = _run(tmp_path)
    by_count = MLflowStepLogger(client, run_id, flush_every=3, flush_seconds=3600, background=False)
    for step in (1, 2):
        by_count(step, {"batch/solved": step / 4, "val/accuracy": 0.5})  # evaluation steps wait too
    assert client.get_metric_history(run_id, "batch/solved") == []
    by_count(3, {"batch/solved": 0.75})
    assert [m.step for m in client.get_metric_history(run_id, "batch/solved")] == [1, 2, 3]

    run2 = client.create_run(client.get_run(run_id).info.experiment_id).info.run_id
    by_time = MLflowStepLogger(client, run2, flush_every=1000, flush_seconds=0.0, background=False)
    by_time(1, {"batch/solved": 0.25})
    assert [m.step for m in client.get_metric_history(run2, "batch/solved")] == [1]


class _Recording:
    """The real client, noting the thread of each ``log_batch`` and holding it until ``go`` is set."""

    def __init__(self, client):
        self.client, self.threads, self.go = client, [], threading.Event()

    def log_batch(self, run_id, metrics):
        self.threads.append(threading.current_thread().name)
        assert self.go.wait(20)
        return self.client.log_batch(run_id, metrics=metrics)


def test_step_logger_writes_on_a_helper_thread_and_the_final_flush_waits_for_it(tmp_path):
    uri, client, run_id = _run(tmp_path)
    rec = _Recording(client)
    logger = MLflowStepLogger(rec, run_id, flush_every=1, flush_seconds=3600)
    logger(1, {"batch/solved": 0.25})  # handed over: the helper blocks in log_batch, training goes on
    for step in (2, 3):  # buffered while the helper is busy
        logger(step, {"batch/solved": step / 4})
    assert rec.threads == ["exgrpo-mlflow-steps_0"] and client.get_metric_history(run_id, "batch/solved") == []
    rec.go.set()
    assert logger.flush(force=True)
    assert [m.step for m in client.get_metric_history(run_id, "batch/solved")] == [1, 2, 3]
    assert rec.threads[1:] == [threading.current_thread().name]  # what was left: written by the final flush
    assert logger._writer is None  # the helper is gone with the run


def test_a_failed_helper_write_goes_back_to_the_front_of_the_buffer(tmp_path, monkeypatch):
    """A real MLflow client of a port nothing listens on: the helper's write fails, its metrics are
    buffered again ahead of the newer ones, one warning; the server's store later gets all in order."""
    from netutil import free_port

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    dead = mlflow.MlflowClient(f"http://127.0.0.1:{free_port()}")
    said = []
    logger = MLflowStepLogger(dead, "0" * 32, flush_every=1, flush_seconds=3600, retry_seconds=3600, warn=said.append)
    logger(1, {"batch/solved": 0.25})
    logger._in_flight[0].result(timeout=60)  # the helper's write has failed
    logger(2, {"batch/solved": 0.5})  # settles the failure; offline now: no new attempt before retry_seconds
    assert logger.offline and len(said) == 1 and "MLflow is unreachable" in said[0]
    assert [m.step for m in logger._buf] == [1, 2] and logger._in_flight is None
    assert not logger.flush(force=True)  # still unreachable: nothing lost, nothing delivered
    assert [m.step for m in logger._buf] == [1, 2] and len(said) == 1
    uri, client, run_id = _run(tmp_path)  # the store answers again
    logger.client, logger.run_id = client, run_id
    assert logger.flush(force=True) and not logger.offline
    assert [m.step for m in client.get_metric_history(run_id, "batch/solved")] == [1, 2]
    assert said[-1].startswith("MLflow is reachable again")


def test_step_feed_hands_each_written_step_to_the_callbacks_once_and_keeps_the_first_error(tmp_path):
    """The caller's side (live progress, a sweep's pruning): steps in order, once each; a callback that
    raises stops the delivery and the feed says the job must stop."""
    path = tmp_path / "attempt_000.jsonl"
    seen, stop_at = [], 3

    class Pruned(Exception):
        pass

    def prune(step, row):
        seen.append((step, row["batch/solved"]))
        if step == stop_at:
            raise Pruned(f"pruned at step {step}")

    feed = StepFeed(path, [prune])
    assert feed.poll() and feed.steps == 0  # no file yet
    with path.open("wb", buffering=0) as f:
        f.write(_line(1, 0.5) + _line(2, 0.25)[:7])
        assert feed.poll() and seen == [(1, 0.5)]
        f.write(_line(2, 0.25)[7:] + b"not json\n" + _line(3, 0.75) + _line(4, 1.0))
        assert not feed.poll()
        assert isinstance(feed.error, Pruned) and feed.steps == 2
        f.write(_line(5, 1.0))
        assert not feed.poll()  # nothing after the error
    assert seen == [(1, 0.5), (2, 0.25), (3, 0.75)]
