"""One evaluation path: a finished run's record, `exgrpo eval` and the evaluate flow's function score a
checkpoint with one function and log the same names into the run the checkpoint belongs to (the flow's
Prefect end to end is in tests/test_flows.py). Each evaluation is a record of its own, by its settings, and
its scores are printed and written before MLflow is asked: a store that is down or lost the run leaves
them to `exgrpo sync`."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from exgrpo.cli import main

TOY = ["--set=task.max_operand=4", "--set=policy.hidden=16", "--set=train.batch_size=8", "--set=algorithm.group_size=4",
       "--max-steps", "4", "--set=train.eval_every_steps=4"]


@pytest.fixture
def tracked_toy_run(tmp_path, capsys):
    """A tracked toy run of 4 steps in a store of its own -> (store URI, its run dir, its MLflow run)."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path}/store/mlflow.db"
    assert main(["train", "experiments/toy-grpo.yaml", "--no-progress", "--tracking-uri", uri, "--output-dir",
                 str(tmp_path / "runs"), *TOY]) == 0
    capsys.readouterr()
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("toy-grpo").experiment_id])
    return uri, tmp_path / "runs" / "toy-grpo" / "seed0", run


def _checkpoint(run_dir):
    (checkpoint,) = sorted((run_dir / "checkpoints").glob("step_*.pt"))
    return checkpoint


def test_every_evaluation_logs_one_set_of_names_into_the_checkpoints_run(tracked_toy_run, tmp_path, capsys):
    from mlflow import MlflowClient

    from exgrpo.evaluation.metrics import EvalSettings
    from exgrpo.recorded_eval import evaluate_into_run

    uri, run_dir, run = tracked_toy_run
    client = MlflowClient(uri)
    # the run's own end: eval/<benchmark>/<metric>, greedy on val and the training probe, equal to the run's
    # own evaluation at its last step, each with its settings beside it
    evals = {k: v for k, v in run.data.metrics.items() if k.startswith("eval/")}
    assert set(evals) == {"eval/val/avg_at_1", "eval/val/pass_at_1", "eval/train/avg_at_1", "eval/train/pass_at_1"}
    assert evals["eval/val/avg_at_1"] == pytest.approx(run.data.metrics["val/accuracy"], abs=1e-7)
    assert evals["eval/train/avg_at_1"] == pytest.approx(run.data.metrics["train/accuracy"], abs=1e-7)
    assert run.data.tags["eval/val/avg_at_1.settings"].startswith("n_problems=")
    checkpoint = _checkpoint(run_dir)

    # `exgrpo eval` with no benchmark named: the same scores, into the same run, which holds them already
    assert main(["eval", "--checkpoint", str(checkpoint), "--tracking-uri", uri]) == 0
    out = capsys.readouterr().out
    assert "| val | avg_at_1 |" in out and "| train | avg_at_1 |" in out
    assert f"MLflow run {run.info.run_id} ({uri}) already holds these 4 eval/* metrics at step 4" in out
    assert [m.step for m in client.get_metric_history(run.info.run_id, "eval/val/avg_at_1")] == [4]

    # the flow's function, sampled: names of the same scheme that carry the settings, in the same run
    done = evaluate_into_run(str(checkpoint), "val", EvalSettings(n=2, temperature=1.0), tracking_uri=uri)
    assert (done.run_id, done.new_run) == (run.info.run_id, False)
    assert set(done.logged) == {"eval/val/avg_at_2/n2-t1-seed0", "eval/val/pass_at_1/n2-t1-seed0",
                                "eval/val/pass_at_2/n2-t1-seed0"}
    tags = client.get_run(run.info.run_id).data.tags
    assert "temperature=1.0" in tags["eval/val/avg_at_2/n2-t1-seed0.settings"]

    # a checkpoint outside any tracked run's directory: a new run of its own, tagged kind=evaluate
    moved = tmp_path / "elsewhere" / "checkpoints" / checkpoint.name
    moved.parent.mkdir(parents=True)
    shutil.copy(checkpoint, moved)
    assert main(["eval", "--checkpoint", str(moved), "--tracking-uri", uri, "--json", str(tmp_path / "s.json")]) == 0
    assert "to a new run of its own" in capsys.readouterr().out
    (own,) = client.search_runs([run.info.experiment_id], filter_string="tags.kind = 'evaluate'")
    assert own.info.status == "FINISHED" and own.data.tags["checkpoint"] == str(moved)
    assert own.data.metrics["eval/val/avg_at_1"] == evals["eval/val/avg_at_1"]
    assert {s["benchmark"] for s in json.loads((tmp_path / "s.json").read_text())} == {"val", "train"}


def test_evaluations_with_other_settings_are_records_of_their_own(tracked_toy_run, tmp_path, capsys):
    from mlflow import MlflowClient

    uri, run_dir, run = tracked_toy_run
    client, run_id = MlflowClient(uri), run.info.run_id
    own = [(m.step, m.value) for m in client.get_metric_history(run_id, "eval/val/pass_at_1")]
    for temperature in ("1.0", "0.7"):
        assert main(["eval", "--checkpoint", str(_checkpoint(run_dir)), "--benchmarks", "val", "--n", "4",
                     "--temperature", temperature]) == 0
        assert f"logged 4 eval/* metrics at step 4 to MLflow run {run_id}" in capsys.readouterr().out
    tags = client.get_run(run_id).data.tags
    for key, temperature in (("n4-t1-seed0", 1.0), ("n4-t0.7-seed0", 0.7)):
        for metric in ("avg_at_4", "pass_at_1", "pass_at_2", "pass_at_4"):  # none dropped for being equal
            assert [m.step for m in client.get_metric_history(run_id, f"eval/val/{metric}/{key}")] == [4]
            assert f"temperature={temperature}" in tags[f"eval/val/{metric}/{key}.settings"]
    # the run's own evaluation keeps its names, its one point and its file
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "eval/val/pass_at_1")] == own
    assert not [k for k in client.get_run(run_id).data.metrics if k.startswith("evaluate/")]
    files = sorted(a.path for a in client.list_artifacts(run_id, "evaluations"))
    assert len(files) == 3 and "evaluations/step_4.json" in files, files
    (tmp_path / "dl").mkdir()
    read = [json.loads(open(client.download_artifacts(run_id, f, str(tmp_path / "dl"))).read()) for f in files]
    assert sorted(s["temperature"] for r in read for s in r["scores"][:1]) == [0.0, 0.7, 1.0]


class _CutShort:
    """A real tracker whose ``method`` (of the tracker or its MLflow client) fails once, as a store that goes
    away in the middle of a log."""

    def __init__(self, tracker, method: str) -> None:
        self.tracker, self.method, self.failed = tracker, method, False
        self.client = self if method != "log_metrics" else tracker.client

    def __getattr__(self, name):
        attr = getattr(self.tracker.client if self.client is self else self.tracker, name)
        if name != self.method or self.failed:
            return attr

        def fail(*args, **kwargs):
            self.failed = True
            raise ConnectionError("the store went away")
        return fail


@pytest.mark.parametrize("cut", ["log_artifact", "log_metrics"])
def test_an_evaluation_log_cut_short_is_completed_whole_by_repeating_it(tracked_toy_run, cut):
    """A log of an evaluation cut short (the store gone between two calls), then repeated as `exgrpo sync`
    repeats it: the run ends with each value once, its settings tag and exactly one artifact holding it,
    wherever the cut fell."""
    from mlflow import MlflowClient

    from exgrpo.evaluation.metrics import Score
    from exgrpo.tracking import Tracker
    from exgrpo.tracking.eval_record import log_scores

    uri, _, run = tracked_toy_run
    run_id, real = run.info.run_id, Tracker(uri)
    scores = [Score("val", m, v, 16, 4, 0.7, 1.0, 8, "plain", "exact", "1") for m, v in
              (("avg_at_4", 0.25), ("pass_at_4", 0.5))]
    settings = {"n": 4, "temperature": 0.7, "top_p": 1.0, "seed": 0}
    cut_short = _CutShort(real, cut)
    with pytest.raises(ConnectionError):
        log_scores(cut_short, run_id, scores, 9, settings)
    assert cut_short.failed
    again = log_scores(real, run_id, scores, 9, settings)
    client = MlflowClient(uri)
    tags = client.get_run(run_id).data.tags
    for metric, value in (("avg_at_4", 0.25), ("pass_at_4", 0.5)):
        name = f"eval/val/{metric}/n4-t0.7-seed0"
        assert [(m.step, m.value) for m in client.get_metric_history(run_id, name)] == [(9, value)]
        assert "temperature=0.7" in tags[f"{name}.settings"]
    files = [a.path for a in client.list_artifacts(run_id, "evaluations") if "step_9" in a.path]
    assert files == ["evaluations/step_9-n4-t0.7-seed0.json"] and again.artifact == files[0], (files, again)


def _move_store(tmp_path):
    """The run's store moved away (as a directory is moved): the run's record names a store that is gone."""
    (tmp_path / "store").rename(tmp_path / "store-moved")
    return f"sqlite:///{tmp_path}/store-moved/mlflow.db"


def test_eval_of_a_run_whose_store_lost_it_keeps_its_scores_and_sync_delivers_them(tracked_toy_run, tmp_path, capsys):
    from mlflow import MlflowClient

    from exgrpo.tracking.sync import pending_runs

    uri, run_dir, run = tracked_toy_run
    _move_store(tmp_path)
    scores = tmp_path / "scores.json"
    # a command of its own, as a user runs it: this process's MLflow still has the moved file open
    said = subprocess.run([sys.executable, "-m", "exgrpo.cli", "eval", "--checkpoint", str(_checkpoint(run_dir)),
                           "--benchmarks", "val", "--n", "2", "--temperature", "1.0", "--json", str(scores)],
                          capture_output=True, text=True, timeout=600)
    assert said.returncode == 0, said.stderr
    assert "| val | avg_at_2 |" in said.stdout
    assert {s["metric"] for s in json.loads(scores.read_text())} == {"avg_at_2", "pass_at_1", "pass_at_2"}
    (line,) = said.stderr.strip().splitlines()
    assert "exgrpo sync" in line and "--no-tracking" in line and run.info.run_id in line
    assert not (tmp_path / "store").exists()  # no empty store made where the run was recorded
    (pending,) = pending_runs(run_dir)

    (tmp_path / "store-moved").rename(tmp_path / "store")  # the store is back
    assert main(["sync", str(pending)]) == 0
    client = MlflowClient(uri)
    after = client.get_run(run.info.run_id)
    assert after.info.status == "FINISHED" and after.info.end_time == run.info.end_time
    assert {k: [m.step for m in client.get_metric_history(run.info.run_id, k)]
            for k in after.data.metrics if k.endswith("/n2-t1-seed0")} == {
        "eval/val/avg_at_2/n2-t1-seed0": [4], "eval/val/pass_at_1/n2-t1-seed0": [4], "eval/val/pass_at_2/n2-t1-seed0": [4]}
    assert len(client.list_artifacts(run.info.run_id, "evaluations")) == 2
    assert pending_runs(run_dir) == [] and not pending.exists()


def test_eval_whose_mlflow_server_is_stopped_keeps_its_scores_for_sync(tracked_toy_run, tmp_path, capsys):
    from netutil import free_port

    from exgrpo.tracking.sync import pending_runs

    _uri, run_dir, run = tracked_toy_run
    record = json.loads((run_dir / "mlflow_run.json").read_text())
    port = free_port()
    stopped = f"http://alice:S3CRETPW@127.0.0.1:{port}"  # the server the run was tracked to, stopped
    (run_dir / "mlflow_run.json").write_text(json.dumps({**record, "tracking_uri": stopped}))
    scores = tmp_path / "scores.json"
    assert main(["eval", "--checkpoint", str(_checkpoint(run_dir)), "--json", str(scores)]) == 0
    said = capsys.readouterr()
    assert "| val | avg_at_1 |" in said.out and json.loads(scores.read_text())
    (line,) = said.err.strip().splitlines()
    assert f"http://alice:***@127.0.0.1:{port}" in line and "exgrpo sync" in line and "--no-tracking" in line
    assert "S3CRETPW" not in said.out + said.err
    (pending,) = pending_runs(run_dir)
    assert main(["sync", str(pending)]) == 1  # still down: one line, and the record stays
    assert len(capsys.readouterr().err.strip().splitlines()) == 1 and pending_runs(run_dir) == [pending]


def test_eval_logs_into_the_store_tracking_uri_names(tracked_toy_run, tmp_path, capsys):
    from mlflow import MlflowClient

    _uri, run_dir, run = tracked_toy_run
    moved = _move_store(tmp_path)
    assert main(["eval", "--checkpoint", str(_checkpoint(run_dir)), "--benchmarks", "val", "--n", "2",
                 "--temperature", "1.0", "--tracking-uri", moved]) == 0
    said = capsys.readouterr()
    assert f"logged 3 eval/* metrics at step 4 to MLflow run {run.info.run_id} ({moved})" in said.out
    (note,) = said.err.strip().splitlines()
    assert moved in note and f"{tmp_path}/store/mlflow.db" in note
    assert "eval/val/avg_at_2/n2-t1-seed0" in MlflowClient(moved).get_run(run.info.run_id).data.metrics


@pytest.fixture
def toy_checkpoint(tmp_path, capsys):
    assert main(["train", "experiments/toy-grpo.yaml", "--no-progress", "--no-tracking", "--output-dir",
                 str(tmp_path / "runs"), *TOY]) == 0
    capsys.readouterr()
    return _checkpoint(tmp_path / "runs" / "toy-grpo" / "seed0")


def test_a_subset_of_the_runs_split_scores_that_many_problems(toy_checkpoint, tmp_path, capsys):
    def scored(spec: str) -> dict[str, int]:
        out = tmp_path / "s.json"
        assert main(["eval", "--checkpoint", str(toy_checkpoint), "--no-tracking", "--benchmarks", spec,
                     "--json", str(out)]) == 0
        return {s["benchmark"]: s["n_problems"] for s in json.loads(out.read_text())}

    whole = scored("val,train")
    assert scored("val:3,train") == {"val": 3, "train": whole["train"]}
    assert scored(f"train:{whole['train']}")["train"] == whole["train"]
    capsys.readouterr()
    for spec, said in ((f"val:{whole['val'] + 1}", f"has {whole['val']}"), ("val:0", "positive integer"),
                       ("val:x", "positive integer"), ("val,val:3", "twice")):
        assert main(["eval", "--checkpoint", str(toy_checkpoint), "--no-tracking", "--benchmarks", spec]) == 2, spec
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert said in line and line.startswith("error: "), line


def test_a_settings_key_names_what_differs_from_the_runs_own_settings():
    from exgrpo.evaluation.metrics import EvalSettings
    from exgrpo.tracking.eval_record import settings_key

    assert settings_key(None) == settings_key(EvalSettings()) == settings_key(EvalSettings(seed=3)) == ""
    assert settings_key(EvalSettings(n=4, temperature=0.7)) == "n4-t0.7-seed0"
    assert settings_key(EvalSettings(n=4)) == "n4"  # greedy: the seed decides nothing
    assert settings_key(EvalSettings(temperature=1.0, top_p=0.95, max_tokens=64, seed=2)) == "t1-top_p0.95-max64-seed2"
    assert settings_key(EvalSettings(), subset=100) == "sub100-seed0"  # the seed draws the subset
