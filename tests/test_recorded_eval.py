"""One evaluation path: a finished run's record, `exgrpo eval` and the evaluate flow's function score a
checkpoint with one function and log the same names into the run the checkpoint belongs to (the flow's
Prefect end to end is in tests/test_flows.py)."""

from __future__ import annotations

import json
import shutil

import pytest

from exgrpo.cli import main

TOY = ["--set=task.max_operand=4", "--set=policy.hidden=16", "--set=train.batch_size=8", "--set=algorithm.group_size=4",
       "--max-steps", "4", "--set=train.eval_every_steps=4"]


@pytest.fixture
def tracked_toy_run(tmp_path, capsys):
    """A tracked toy run of 4 steps in a store of its own -> (store URI, its run dir, its MLflow run)."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    assert main(["train", "experiments/toy-grpo.yaml", "--no-progress", "--tracking-uri", uri, "--output-dir",
                 str(tmp_path / "runs"), *TOY]) == 0
    capsys.readouterr()
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("toy-grpo").experiment_id])
    return uri, tmp_path / "runs" / "toy-grpo" / "seed0", run


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
    (checkpoint,) = sorted((run_dir / "checkpoints").glob("step_*.pt"))

    # `exgrpo eval` with no benchmark named: the same scores, into the same run, nothing logged twice
    assert main(["eval", "--checkpoint", str(checkpoint), "--tracking-uri", uri]) == 0
    out = capsys.readouterr().out
    assert "| val | avg_at_1 |" in out and "| train | avg_at_1 |" in out
    assert f"logged 0 eval/* metrics at step 4 to MLflow run {run.info.run_id}" in out
    assert [m.step for m in client.get_metric_history(run.info.run_id, "eval/val/avg_at_1")] == [4]

    # the flow's function, sampled: new names of the same scheme in the same run, with their settings
    done = evaluate_into_run(str(checkpoint), "val", EvalSettings(n=2, temperature=1.0), tracking_uri=uri)
    assert (done.run_id, done.new_run) == (run.info.run_id, False)
    assert {"eval/val/avg_at_2", "eval/val/pass_at_2"} <= set(done.logged)
    assert "eval/val/pass_at_1" not in done.logged  # the greedy one at that step keeps the name; another goes to evaluate/
    tags = client.get_run(run.info.run_id).data.tags
    assert "temperature=1.0" in tags["eval/val/avg_at_2.settings"]

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
