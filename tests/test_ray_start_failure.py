"""A private local Ray that does not start (a loaded machine's timeout, a temp dir too deep for Ray's
sockets) ends a sweep or a comparison in one line that says what to do, and its MLflow parent run
FAILED with that line: the start is one function for both (exgrpo.batch.start_on_ray)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from exgrpo.cluster import ClusterError, local_start_failure

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def deep_tmpdir(tmp_path):
    """A RAY_TMPDIR too long for Ray's socket paths (107 characters): Ray itself refuses to start."""
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    return deep


def _parent(uri: str):
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    exps = [e.experiment_id for e in client.search_experiments()]
    (run,) = [r for r in client.search_runs(exps) if r.data.tags.get("kind") in ("sweep", "compare")]
    return run


def test_a_sweep_whose_local_ray_does_not_start_ends_in_one_line_and_a_failed_parent(tmp_path, deep_tmpdir):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    env = {**os.environ, "RAY_TMPDIR": str(deep_tmpdir)}
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run([sys.executable, "-m", "exgrpo.cli", "sweep", "experiments/toy-sweep.yaml", "--no-prefect",
                          "--n-trials", "1", "--storage", f"sqlite:///{tmp_path}/optuna.db", "--tracking-uri", uri,
                          "--set", f"base.output_dir={tmp_path / 'runs'}"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr[-3000:]
    line = out.stderr.strip().splitlines()[-1]
    assert line.startswith("error: the private local Ray did not start (OSError: ") and "AF_UNIX" in line, out.stderr
    assert "set RAY_TMPDIR to a short directory" in line and "Traceback" not in out.stderr
    parent = _parent(uri)
    assert parent.info.status == "FAILED" and parent.data.tags["error"] == line.removeprefix("error: ")


def test_a_comparison_whose_local_ray_does_not_start_ends_in_one_line_and_a_failed_parent(tmp_path, deep_tmpdir,
                                                                                           monkeypatch):
    import ray

    from exgrpo.compare.tracked import run_tracked_compare
    from exgrpo.config import load_compare

    if ray.is_initialized():  # a Ray an earlier test of this process started would be used instead
        ray.shutdown()
    monkeypatch.setenv("RAY_TMPDIR", str(deep_tmpdir))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cc = load_compare("experiments/toy.yaml", {"output_dir": str(tmp_path / "runs"), "train.max_steps": 1})
    with pytest.raises(ClusterError) as e:
        run_tracked_compare(cc.select("grpo", "1"), tracking_uri=uri, executor="ray")
    assert str(e.value).startswith("the private local Ray did not start (OSError: ") and "\n" not in str(e.value)
    parent = _parent(uri)
    assert parent.info.status == "FAILED" and parent.data.tags["error"] == str(e.value)


def test_a_start_that_timed_out_is_told_to_wait_for_a_quieter_machine_or_use_a_cluster():
    line = local_start_failure(TimeoutError("Timed out after 60 s waiting for the GCS to start"))
    assert line.startswith("the private local Ray did not start (TimeoutError: Timed out after 60 s")
    assert "when the machine is quieter" in line and "--ray-address" in line
    other = local_start_failure(RuntimeError("raylet died"))
    assert "RuntimeError: raylet died" in other and "Ray's own logs" in other
