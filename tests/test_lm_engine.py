"""The LM rollout engine against plain HF forward passes and HF ``generate`` (tiny random model)."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from exgrpo.backends.native.interfaces import Rollout, Scores  # noqa: E402
from exgrpo.backends.native.lm.engine import (  # noqa: E402
    RolloutEngine,
    SamplingParams,
    build_packed_batch,
    token_log_prob_entropy,
)
from exgrpo.backends.native.lm.policy import LMPolicy, LMPolicyConfig  # noqa: E402

PAD, BOS, EOS = 0, 1, 2
TEMP = 0.7
PROMPTS = [
    [BOS, 5, 6], [BOS, 7, 8, 9, 3, 4, 5], [BOS], [BOS, 4, 4, 4, 9], [BOS, 9, 8], [BOS, 3, 3, 3, 3, 3], [BOS, 6],
    [BOS, 5, 5, 7, 8],
]


@pytest.fixture(scope="module")
def model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(3)  # seed and scale chosen so rows stop at EOS at different steps (greedy and sampled)
    cfg = LlamaConfig(
        vocab_size=10, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS,
        tie_word_embeddings=False,
    )
    m = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # sharper logits than the 0.02-std init, so greedy decoding is not near ties
        m.lm_head.weight.mul_(5.0)
    return m


def engine(model, **kw) -> RolloutEngine:
    return RolloutEngine(model, PAD, EOS, SamplingParams(**{"max_new_tokens": 14, "temperature": TEMP, **kw}))


def reference_row(model, prompt, response, temperature):
    """Unpadded single-row forward of prompt+response -> (log_prob, entropy) of the response tokens."""
    ids = torch.tensor([prompt + response])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : len(prompt) - 1 + len(response)]
    lp, ent, _ = token_log_prob_entropy(logits, torch.tensor(response), temperature)
    return lp, ent


def test_rollout_log_prob_entropy_equal_full_forward(model):
    ro = engine(model).generate(PROMPTS, torch.Generator().manual_seed(3))
    n, t = ro.tokens.shape
    lengths = ro.mask.sum(1)
    assert n == len(PROMPTS) and t == int(lengths.max())
    assert ro.finished.any() and (lengths < t).any() and len(set(lengths.tolist())) > 2, "need ragged EOS stops"
    # the mask is a prefix through EOS; nothing after it
    for i in range(n):
        L = int(lengths[i])
        assert ro.mask[i, :L].all() and not ro.mask[i, L:].any()
        assert (ro.tokens[i, L:] == PAD).all() and (ro.log_prob[i, L:] == 0).all() and (ro.entropy[i, L:] == 0).all()
        if ro.finished[i]:
            assert ro.tokens[i, L - 1] == EOS and EOS not in ro.tokens[i, : L - 1].tolist()
        else:
            assert L == 14

    with torch.no_grad():
        # (a) each row alone, no padding at all
        for i, p in enumerate(PROMPTS):
            L = int(lengths[i])
            lp, ent = reference_row(model, p, ro.tokens[i, :L].tolist(), TEMP)
            torch.testing.assert_close(ro.log_prob[i, :L], lp, atol=1e-5, rtol=0)
            torch.testing.assert_close(ro.entropy[i, :L], ent, atol=1e-5, rtol=0)
        # (b) one batched forward in an independent layout: [prompt; response] contiguous, right-padded
        seqs = [p + ro.tokens[i, : int(lengths[i])].tolist() for i, p in enumerate(PROMPTS)]
        width = max(map(len, seqs))
        ids = torch.full((n, width), PAD)
        am = torch.zeros((n, width), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = torch.tensor(s)
            am[i, : len(s)] = 1
        logits = model(input_ids=ids, attention_mask=am).logits
        for i, p in enumerate(PROMPTS):
            L = int(lengths[i])
            lp, ent, _ = token_log_prob_entropy(logits[i, len(p) - 1 : len(p) - 1 + L], ro.tokens[i, :L], TEMP)
            torch.testing.assert_close(ro.log_prob[i, :L], lp, atol=1e-5, rtol=0)
            torch.testing.assert_close(ro.entropy[i, :L], ent, atol=1e-5, rtol=0)


def test_score_matches_rollout_and_is_differentiable(model):
    eng = engine(model)
    ro = eng.generate(PROMPTS, torch.Generator().manual_seed(5))
    sc = eng.score(PROMPTS, ro.tokens, ro.mask, full=True)
    torch.testing.assert_close(sc.log_prob.detach(), ro.log_prob, atol=1e-5, rtol=0)
    torch.testing.assert_close(sc.entropy.detach(), ro.entropy, atol=1e-5, rtol=0)
    assert sc.full_log_prob.shape == (*ro.tokens.shape, 10)
    gathered = sc.full_log_prob.gather(-1, ro.tokens[..., None]).squeeze(-1)
    torch.testing.assert_close(torch.where(ro.mask, gathered, 0.0), sc.log_prob)
    # padding beyond T and a wider right pad do not change anything
    wide_tok = torch.cat([ro.tokens, torch.full((len(PROMPTS), 3), 7)], 1)
    wide_mask = torch.cat([ro.mask, torch.zeros((len(PROMPTS), 3), dtype=torch.bool)], 1)
    sc2 = eng.score(PROMPTS, wide_tok, wide_mask)
    torch.testing.assert_close(sc2.log_prob[:, : ro.tokens.shape[1]], sc.log_prob, atol=1e-6, rtol=0)
    assert (sc2.log_prob[:, ro.tokens.shape[1] :] == 0).all()
    model.zero_grad()
    (sc.log_prob.sum() + sc.entropy.sum()).backward()
    assert model.model.embed_tokens.weight.grad is not None
    model.zero_grad()


def test_greedy_equals_hf_generate(model):
    ro = engine(model).generate(PROMPTS, greedy=True)
    assert ro.finished.any() and not ro.finished.all(), "want rows that stop at EOS and rows that run out"
    batch = build_packed_batch(PROMPTS, None, None, PAD)
    hf = model.generate(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, do_sample=False, max_new_tokens=14,
        pad_token_id=PAD, eos_token_id=EOS,
    )[:, batch.prompt_width :]
    assert hf.shape == ro.tokens.shape
    assert torch.equal(hf, ro.tokens)


def test_sampling_reproducible_with_generator(model):
    eng = engine(model)
    a = eng.generate(PROMPTS, torch.Generator().manual_seed(11))
    b = eng.generate(PROMPTS, torch.Generator().manual_seed(11))
    c = eng.generate(PROMPTS, torch.Generator().manual_seed(12))
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.mask, b.mask) and torch.equal(a.log_prob, b.log_prob)
    assert not torch.equal(a.tokens, c.tokens)
    # a generator's state, not the global RNG, drives sampling
    g = torch.Generator().manual_seed(11)
    torch.manual_seed(999)
    assert torch.equal(eng.generate(PROMPTS, g).tokens, a.tokens)


def test_tiny_top_p_is_greedy(model):
    greedy = engine(model).generate(PROMPTS, greedy=True)
    nucleus = engine(model, top_p=1e-6).generate(PROMPTS, torch.Generator().manual_seed(0))
    assert torch.equal(greedy.tokens, nucleus.tokens)
    torch.testing.assert_close(greedy.log_prob, nucleus.log_prob)


def test_packed_batch_layout_and_validation():
    tok = torch.tensor([[4, 5, 2], [6, 0, 0]])
    mask = torch.tensor([[True, True, True], [True, False, False]])
    b = build_packed_batch([[1, 3], [1, 3, 3, 3]], tok, mask, PAD)
    assert b.prompt_width == 4
    assert b.input_ids.tolist() == [[0, 0, 1, 3, 4, 5, 2], [1, 3, 3, 3, 6, 0, 0]]
    assert b.attention_mask.tolist() == [[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0, 0]]
    assert b.position_ids.tolist() == [[0, 0, 0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 4, 4]]
    with pytest.raises(ValueError, match="right-padded"):
        build_packed_batch([[1], [1]], tok, torch.tensor([[True, False, True], [True, False, False]]), PAD)
    with pytest.raises(ValueError, match="empty"):
        build_packed_batch([[1], []], tok, mask, PAD)
    with pytest.raises(TypeError):
        build_packed_batch(torch.ones(2, 3, dtype=torch.long), tok, mask, PAD)


def test_lm_policy_protocol(model):
    pol = LMPolicy(model, PAD, EOS, LMPolicyConfig(max_new_tokens=9, temperature=TEMP))
    assert pol.max_response_length == 9
    assert {n for n, _ in pol.named_parameters()} == {"model." + n for n, _ in model.named_parameters()}
    with torch.no_grad():
        ro = pol.generate(PROMPTS, torch.Generator().manual_seed(1))
    assert isinstance(ro, Rollout) and ro.tokens.shape[1] <= 9
    sc = pol.score(PROMPTS, ro.tokens, ro.mask)
    assert isinstance(sc, Scores) and sc.full_log_prob is None and sc.log_prob.requires_grad
    torch.testing.assert_close(sc.log_prob.detach(), ro.log_prob, atol=1e-5, rtol=0)
