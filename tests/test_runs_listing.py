"""`exgrpo runs`: recent top-level runs of a real MLflow store, one line each."""

import time

import mlflow

from exgrpo import cli


def test_runs_lists_parents_and_single_runs_newest_first(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = mlflow.MlflowClient(uri)
    exp = client.create_experiment("toy")
    single = client.create_run(exp, run_name="exgrpo-seed0", tags={"kind": "run"}).info.run_id
    client.log_metric(single, "final/val/accuracy", 0.3125)
    client.set_terminated(single, "FINISHED")
    time.sleep(0.05)  # distinct start times: the listing is newest first
    parent = client.create_run(exp, run_name="compare-toy",
                               tags={"kind": "compare", "arms": "grpo,exgrpo", "metric": "val/accuracy"}).info.run_id
    client.create_run(exp, run_name="grpo-seed0", tags={"mlflow.parentRunId": parent})  # a child: not listed
    client.log_metric(parent, "grpo/final_mean", 0.25)
    client.log_metric(parent, "exgrpo/final_mean", 0.5)
    client.set_terminated(parent, "FINISHED")

    assert cli.main(["runs", "--tracking-uri", uri]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and lines[0].startswith("started")
    assert "compare-toy" in lines[1] and "val/accuracy: grpo 0.2500, exgrpo 0.5000" in lines[1] and parent in lines[1]
    assert "exgrpo-seed0" in lines[2] and "final/val/accuracy 0.3125" in lines[2] and "FINISHED" in lines[2]

    assert cli.main(["runs", "--tracking-uri", uri, "--experiment", "nope"]) == 2
    assert "no MLflow experiment named 'nope'" in capsys.readouterr().err
