"""A store the commands cannot use is one line and exit 2, from every command that tracks, before any work.

The two stores a user meets: ``file://`` (MLflow's old default, which the project does not support) and
a server that is not there, named with a password (which the line must not show).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from exgrpo.cli import main
from netutil import free_port

PASSWORD = "S3CRETPW"


def _bad_store(kind: str, tmp_path: Path) -> str:
    if kind == "file":
        return f"file://{tmp_path}/mlruns"
    return f"http://alice:{PASSWORD}@127.0.0.1:{free_port()}"


COMMANDS = {
    "train": ["train", "experiments/toy-exgrpo.yaml", "--output-dir", "{runs}"],
    "compare": ["compare", "experiments/toy.yaml", "--seeds", "1", "--output-dir", "{runs}"],
    "compare --no-prefect": ["compare", "experiments/toy.yaml", "--seeds", "1", "--output-dir", "{runs}",
                             "--no-prefect", "--tracking-uri", "{uri}"],
    "sweep": ["sweep", "experiments/toy-sweep.yaml", "--storage", "sqlite:///{runs}/optuna.db"],
    "sweep --no-prefect": ["sweep", "experiments/toy-sweep.yaml", "--storage", "sqlite:///{runs}/optuna.db",
                           "--no-prefect"],
    "eval": ["eval", "--checkpoint", "models:/exgrpo-toy-sweep@champion"],
    "runs": ["runs"],
    "dashboard": ["dashboard", "--experiment", "toy", "--out", "{runs}/report.html"],
}
"""Every command that records into or reads from the MLflow store (``doctor`` reports a store it cannot
use as one of its findings; ``sync`` uses the store each run recorded, not this one)."""


@pytest.mark.parametrize("store", ["file", "unreachable"])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_store_the_command_cannot_use_is_one_line_and_exit_2(command, store, tmp_path, monkeypatch, capsys):
    uri = _bad_store(store, tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # as a user's shell sets it
    runs = tmp_path / "runs"
    argv = [a.format(runs=runs, uri=uri) for a in COMMANDS[command]]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and len(err.strip().splitlines()) == 1, err[-3000:]
    assert ("file store is not supported" if store == "file" else "is not reachable") in errors[0], errors[0]
    assert PASSWORD not in out + err
    assert not runs.exists() or not any(p.name != "optuna.db" for p in runs.rglob("*")), "work began"


@pytest.mark.e2e
def test_compare_no_prefect_records_into_the_tracking_uri_it_is_given(tmp_path, capsys):
    """``--no-prefect`` runs without Prefect, as ``sweep --no-prefect`` does; a ``--tracking-uri`` given
    with it is where its parent and child runs go."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    assert main(["compare", "experiments/toy.yaml", "--seeds", "1", "--arms", "grpo", "--no-prefect", "--no-progress",
                 "--set", "task.max_operand=4", "--set", "policy.hidden=16", "--set", "train.batch_size=8",
                 "--set", "algorithm.group_size=4", "--set", "train.max_steps=2", "--set", "name=cmp-no-prefect",
                 "--output-dir", str(tmp_path / "runs"), "--tracking-uri", uri]) == 0
    out = capsys.readouterr().out
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("cmp-no-prefect")
    assert exp is not None, out[-2000:]
    runs = client.search_runs([exp.experiment_id])
    (parent,) = [r for r in runs if r.data.tags.get("kind") == "compare"]
    (child,) = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert parent.info.status == child.info.status == "FINISHED"
    assert "MLflow parent run: " in out and parent.info.run_id in out
