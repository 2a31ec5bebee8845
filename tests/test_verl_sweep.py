"""veRL runs as sweep trials: an Optuna sweep through the CLI with its champion, and the callbacks that
see a running job's steps (a pruner stops it)."""

import json
import subprocess
import sys
import time

import pytest

from exgrpo.config import load_experiment

from verlutil import GRPO, ONE_VAL_QUESTION, _cli_val_score, _env


@pytest.mark.slow
@pytest.mark.parametrize("trials", [1, pytest.param(2, marks=pytest.mark.full)])
def test_a_verl_sweep_through_the_cli_registers_a_champion_that_evaluates_to_the_best_value(tmp_path, exgrpo_cache,
                                                                                            trials):
    """`exgrpo sweep experiments/verl-tiny-sweep.yaml` (trials of 3 steps, the paper's defaults first):
    each trial a veRL run in a Ray task with its own MLflow run; the best trial's global_step_3 is
    registered as the study's champion, and `exgrpo eval` of models:/exgrpo-verl-tiny-sweep@champion
    scores what the sweep measured for that trial. ``make test`` runs one trial (the whole path: a trial,
    its record, the champion's registration and evaluation by name); the full form, two (the champion
    chosen between them), about two minutes more."""
    import mlflow
    import optuna

    storage, uri = f"sqlite:///{tmp_path}/optuna.db", f"sqlite:///{tmp_path}/mlflow.db"
    cmd = [sys.executable, "-m", "exgrpo.cli", "sweep", "experiments/verl-tiny-sweep.yaml", "--n-trials", str(trials),
           "--set", "budget_steps=3", "--set", f"base.output_dir={tmp_path / 'runs'}", "--storage", storage,
           "--tracking-uri", uri, "--no-prefect"]
    res = subprocess.run(cmd, capture_output=True, text=True, env=_env(exgrpo_cache), timeout=1200)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    summary = json.loads(res.stdout[res.stdout.rindex("\n{") + 1:])
    assert summary["counts"]["COMPLETE"] == trials and summary["champion"] == "models:/exgrpo-verl-tiny-sweep@champion"
    study = optuna.load_study(study_name="verl-tiny-sweep", storage=storage)
    assert len(study.trials) == trials and study.trials[0].params["algorithm.bucket_rbound"] == 3  # the paper's K-1 first
    client = mlflow.MlflowClient(uri)
    runs = {t.number: client.get_run(t.user_attrs["mlflow_run_id"]) for t in study.trials}
    assert all(r.info.status == "FINISHED" and r.data.tags["checkpoint"].endswith("global_step_3") for r in runs.values())
    assert all([m.step for m in client.get_metric_history(r.info.run_id, "batch/solved")] == [1, 2, 3]
               for r in runs.values())

    value, _ = _cli_val_score(summary["champion"], exgrpo_cache, "--tracking-uri", uri)
    assert value == pytest.approx(study.best_value, abs=ONE_VAL_QUESTION)


@pytest.mark.slow
@pytest.mark.parametrize("launch", ["process", "ray_job"])
def test_verl_callbacks_see_each_step_while_the_job_runs_and_a_pruning_callback_stops_it(tmp_path, exgrpo_cache, monkeypatch,
                                                                                         launch):
    """The caller's callbacks (live progress, a sweep's pruning) get veRL's steps as the job writes
    them, not after it ends; one that raises Optuna's TrialPruned stops the job, whose private Ray
    goes with it, and train() raises it (tracked_train then ends the MLflow run KILLED)."""
    import optuna

    from exgrpo.backends.base import train

    monkeypatch.setenv("EXGRPO_CACHE", str(exgrpo_cache))
    # no validation nor checkpoint at step 3, where it is pruned: nothing here reads them
    cfg = load_experiment(GRPO, {"output_dir": str(tmp_path), "backend.verl.launch": launch,
                                 "train.eval_every_steps": None, "train.checkpoint_every": 0})
    metric_file = tmp_path / "verl-tiny-grpo" / "seed0" / "verl_metrics" / "attempt_000.jsonl"

    def written() -> list[int]:
        return [json.loads(x)["step"] for x in metric_file.read_text().splitlines() if x.endswith("}")]

    seen = []

    def prune(step, row):
        seen.append((step, max(written())))
        if step == 3:
            raise optuna.TrialPruned("pruned at step 3")

    import ray

    from exgrpo.backends.verl import jobs

    monkeypatch.setattr(jobs, "_LOCAL_JOB_SERVER", None)  # ray_job: a job server of this test's own
    try:
        with pytest.raises(optuna.TrialPruned, match="pruned at step 3"):
            train(cfg, callbacks=[prune], progress=False)
    finally:
        ray.shutdown()
    assert [s for s, _ in seen] == [1, 2, 3]
    assert seen[0][1] < 6, seen  # step 1 arrived while the job had steps left to write
    assert max(written()) < 6  # stopped before its last step
    spec = json.loads((tmp_path / "verl-tiny-grpo" / "seed0" / "verl_run.json").read_text())
    ray_tmp = next(o.split("=", 1)[1] for o in spec["overrides"] if "_temp_dir=" in o)
    def ray_processes() -> str:
        return subprocess.run(["pgrep", "-af", ray_tmp], capture_output=True, text=True, check=False).stdout

    deadline = time.time() + 60
    while time.time() < deadline and ray_processes():
        time.sleep(1)
    left = ray_processes()
    assert not left, f"the stopped job's Ray processes are still running:\n{left}"
