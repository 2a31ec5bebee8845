"""One veRL GRPO run of experiments/verl-tiny-grpo.yaml through the CLI, read by many tests: its steps,
its terminal, its checkpoints evaluated and registered, a second run of the seed, its MLflow record."""

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from verlutil import GRPO, ONE_VAL_QUESTION, _cli_val_score, _rows, _train, _train_in_a_terminal


@pytest.fixture(scope="module")
def grpo_run(tmp_path_factory, exgrpo_cache):
    """experiments/verl-tiny-grpo.yaml through the CLI in a terminal (6 steps, validation and
    checkpoints at 3 and 6); what the terminal showed is kept in ``terminal.txt`` beside the run. Ray's
    temp dirs go under a directory of their own (``RAY_TMPDIR``, named in ``ray_tmpdir.txt``), and the
    Hugging Face datasets cache the run was given is ``user-datasets-cache/``, both read after the run."""
    out = tmp_path_factory.mktemp("verl-grpo")
    ray_tmpdir = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # short: Ray's socket paths must fit 107 characters
    (out / "ray_tmpdir.txt").write_text(ray_tmpdir)
    env = {"RAY_TMPDIR": ray_tmpdir, "HF_DATASETS_CACHE": str(out / "user-datasets-cache")}
    try:
        (out / "terminal.txt").write_text(_train_in_a_terminal(GRPO, out, exgrpo_cache, env=env))
        yield out / "verl-tiny-grpo" / "seed0"
    finally:
        shutil.rmtree(ray_tmpdir, ignore_errors=True)


@pytest.fixture(scope="module")
def piped_grpo_run(tmp_path_factory, exgrpo_cache):
    """The same config and seed again, piped as into a log, tracked to the session's MLflow store.
    -> (its run directory, its console lines)."""
    out = tmp_path_factory.mktemp("verl-grpo-piped")
    res = _train(GRPO, out, exgrpo_cache, progress=True)
    return out / "verl-tiny-grpo" / "seed0", (res.stdout + res.stderr).splitlines()


@pytest.mark.slow
def test_verl_grpo_end_to_end_through_the_cli(grpo_run):
    run_dir = grpo_run
    rows = _rows(run_dir)
    assert [r["step"] for r in rows if "batch/solved" in r] == [1, 2, 3, 4, 5, 6]
    assert all(r["replay/questions"] == 0 and r["actor/off_token_fraction"] == 0 for r in rows if "batch/solved" in r)
    assert [r["step"] for r in rows if "val/accuracy" in r] == [3, 6]
    # weight sync: the hf rollout's log-probs equal the fp32 actor's recomputed ones after every update
    # (about 2.6e-7; 1.2e-3 with veRL's default bf16 compute, backend.verl.actor_dtype=bfloat16)
    assert max(r["training/rollout_probs_diff_mean"] for r in rows if "batch/solved" in r) < 1e-5


@pytest.mark.slow
def test_a_verl_run_leaves_no_ray_temp_dir_nor_datasets_cache_behind(grpo_run):
    """The private Ray of a veRL run on a CPU takes its temp dir under RAY_TMPDIR and removes it at the
    run's end; veRL's reads of the run's parquet files leave nothing in the user's datasets cache."""
    out = grpo_run.parents[1]
    ray_tmpdir = Path((out / "ray_tmpdir.txt").read_text())
    overrides = json.loads((grpo_run / "verl_run.json").read_text())["overrides"]
    (temp,) = [Path(o.split("=", 1)[1]) for o in overrides if o.startswith("+ray_kwargs.ray_init._temp_dir=")]
    assert temp.parent == ray_tmpdir and temp.name.startswith("exgrpo-ray-"), temp
    assert not temp.exists() and not list(ray_tmpdir.iterdir()), list(ray_tmpdir.rglob("*"))[:20]
    user_cache = out / "user-datasets-cache"
    assert not user_cache.exists() or not any(user_cache.iterdir()), list(user_cache.rglob("*"))[:20]


MEASUREMENTS = ("time/", "timing_s/", "timing_per_token_ms/", "perf/", "actor/perf/")
"""Metrics of how long and how much memory, not of what was learnt: they differ between any two runs."""


@pytest.mark.slow
def test_two_verl_runs_of_one_seed_learn_the_same_at_every_step(grpo_run, piped_grpo_run):
    """The hf rollout samples each request from (seed, step, row): a second run of the same config and
    seed, piped instead of in a terminal, equals the first at every step in every metric but timings."""
    first, again = _rows(grpo_run), _rows(piped_grpo_run[0])

    def learnt(rows):
        return [{k: v for k, v in r.items() if not k.startswith(MEASUREMENTS)} for r in rows]

    assert len(first) == 6 and learnt(again) == learnt(first)
    assert any(r["actor/pg_loss"] != 0 for r in first)  # the runs trained: equality is not of zeros


@pytest.mark.slow
def test_a_verl_run_in_a_terminal_shows_a_step_bar_and_keeps_verls_output_in_its_log(grpo_run):
    """A person at a terminal sees the run's steps (a bar to 6/6 and a line per validation), not
    veRL's own console output (a line of ~100 metrics per step), which goes to verl.log."""
    shown = (grpo_run.parents[1] / "terminal.txt").read_text()
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", shown)  # without the terminal's colour and cursor codes
    assert f"its output: {grpo_run / 'verl.log'}" in plain
    assert "6/6" in plain
    assert re.search(r"step\s+3\s+val acc 0\.\d{4}", plain) and re.search(r"step\s+6\s+val acc 0\.\d{4}", plain)
    assert "step:1 - " not in plain and "actor/entropy" not in plain
    assert "step:1 - " in (grpo_run / "verl.log").read_text()


def _record(run):
    """What an MLflow run holds, by kind: artifact folders, a logged model, dataset contexts, eval/* keys."""
    import mlflow

    client = mlflow.MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    return {
        "status": run.info.status,
        "artifacts": sorted(a.path for folder in ("", "config", "logs", "metrics")
                            for a in client.list_artifacts(run.info.run_id, folder or None) if not a.is_dir),
        "checkpoint_files": [Path(a.path).suffix for a in client.list_artifacts(run.info.run_id, "checkpoints")],
        "models": len(run.outputs.model_outputs) if run.outputs else 0,
        "datasets": sorted(d.tags[0].value for d in run.inputs.dataset_inputs),
        "eval": sorted(k for k in run.data.metrics if k.startswith("eval/")),
        "model_metrics": sorted(m.key for m in client.get_logged_model(run.outputs.model_outputs[0].model_id).metrics)
        if run.outputs and run.outputs.model_outputs else [],
    }


def _scored(checkpoint) -> dict[str, float]:
    """The checkpoint's scores as every evaluation makes them (no benchmark named: as the run evaluates)."""
    from exgrpo.evaluation.runner import score_checkpoint

    return {s.key: s.value for s in score_checkpoint(checkpoint).scores}


def _run_of(run_dir):
    import mlflow

    client = mlflow.MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    exps = [e.experiment_id for e in client.search_experiments()]
    (run,) = [r for r in client.search_runs(exps) if r.data.tags.get("checkpoint", "").startswith(str(run_dir))]
    return run


@pytest.mark.slow
def test_exgrpo_train_records_the_same_things_in_mlflow_on_both_backends(piped_grpo_run, exgrpo_cache, tmp_path):
    """`exgrpo train` tracks to MLflow on either backend, and a veRL run's record has every kind a
    native run's has: metrics and config artifacts, the final policy as a checkpoint file (merged from
    veRL's shards) and as an MLflow model, the questions as dataset inputs, eval/* scores. The veRL run
    is piped, as in a log: its console is a line per step and the job's own lines, under 100 lines
    for 6 steps (veRL's own output stays in verl.log)."""
    grpo_run, console = piped_grpo_run
    assert len(console) < 100, "\n".join(console)
    assert [line for line in console if line.startswith("step ")][-1].startswith("step 6/6  batch pass@1 ")
    assert "step:6 - " in (grpo_run / "verl.log").read_text()  # veRL's own output, kept whole in its log
    _train(GRPO, tmp_path, exgrpo_cache, "--set", "backend.name=native", "--max-steps", "2")
    native = _run_of(tmp_path / "verl-tiny-grpo" / "seed0")
    verl = _run_of(grpo_run)
    records, native_record = _record(verl), _record(native)
    # the veRL run's own records besides: the overrides derived from the config and the job's log
    assert native_record.pop("artifacts") == ["config/resolved_config.json", "metrics/metrics.jsonl"]
    assert records.pop("artifacts") == ["config/resolved_config.json", "config/verl_run.json", "logs/verl.log",
                                        "metrics/metrics.jsonl"]
    # the logged model carries the last step's metrics on both backends (the veRL job logs its own),
    # the shared quantities under one name
    shared = {"batch/solved", "actor/pg_loss", "val/accuracy", "time/step_seconds", "time/rollout_seconds",
              "final/val/accuracy", "eval/val/avg_at_1"}
    assert shared <= set(records.pop("model_metrics")) and shared <= set(native_record.pop("model_metrics"))
    assert records == native_record
    assert records == {"status": "FINISHED", "checkpoint_files": [".pt"], "models": 1,
                       "datasets": ["eval", "training"],
                       "eval": ["eval/train/avg_at_1", "eval/train/pass_at_1", "eval/val/avg_at_1", "eval/val/pass_at_1"]}
    assert verl.data.params["backend.verl.rollout"] == "hf" and "backend.verl.rollout" not in native.data.params
    # the veRL run's checkpoint tag names veRL's own directory; its policy file evaluates to its eval/*
    assert verl.data.tags["checkpoint"] == str(grpo_run / "checkpoints" / "global_step_6")
    merged = grpo_run / "checkpoints" / "verl_global_step_6.pt"
    assert verl.data.metrics["eval/val/avg_at_1"] == pytest.approx(_scored(merged)["val/avg_at_1"])


@pytest.mark.slow
def test_a_verl_checkpoint_evaluates_as_the_run_validated_it_and_registers_as_a_champion(grpo_run, exgrpo_cache, tmp_path,
                                                                                          monkeypatch):
    """`exgrpo eval` and the evaluate flow read veRL's global_step_N (FSDP shards merged, weights_only,
    the run's config): the rebuilt policy holds exactly the actor's weights, and its greedy val
    accuracy is the one veRL's own validation logged at that step. Registered as a sweep champion,
    it resolves to a file with the same weights and the same scores."""
    import mlflow

    from exgrpo.backends.verl.actor_weights import policy_state
    from exgrpo.evaluation.runner import load_checkpoint_policy
    from exgrpo.tracking.registry import register_champion, resolve_checkpoint

    monkeypatch.setenv("EXGRPO_CACHE", str(exgrpo_cache))
    validated = {int(r["step"]): r["val/accuracy"] for r in _rows(grpo_run) if "val/accuracy" in r}
    assert sorted(validated) == [3, 6]
    steps = {step: grpo_run / "checkpoints" / f"global_step_{step}" for step in validated}
    weights = {step: policy_state(d)["model"] for step, d in steps.items()}
    assert any(not torch.equal(weights[3][k], weights[6][k]) for k in weights[3])  # two different policies
    scores = {}
    for step, acc in validated.items():
        loaded = load_checkpoint_policy(steps[step]).policy.state_dict()
        assert loaded.keys() == weights[step].keys() and all(torch.equal(loaded[k], weights[step][k]) for k in loaded)
        restored = load_checkpoint_policy(steps[step])
        assert restored.config.backend.name == "verl" and restored.step == step
        scores[step] = _scored(steps[step])
        assert scores[step]["val/avg_at_1"] == pytest.approx(acc, abs=ONE_VAL_QUESTION)
    value, problems = _cli_val_score(str(steps[6]), exgrpo_cache)
    assert problems == 64
    assert value == pytest.approx(validated[6], abs=ONE_VAL_QUESTION)

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    run_id = client.create_run(client.create_experiment("verl-sweep")).info.run_id
    name, version = register_champion(client, "verl-sweep", run_id, steps[6])
    registered = resolve_checkpoint(f"models:/{name}@champion", f"sqlite:///{tmp_path}/mlflow.db")
    assert registered.name == "verl_global_step_6.pt" and version == "1"
    loaded = load_checkpoint_policy(registered).policy.state_dict()
    assert all(torch.equal(loaded[k], weights[6][k]) for k in weights[6])
    assert _scored(registered) == scores[6]
