"""The LM rollout engine against plain HF forward passes and HF ``generate`` (tiny random model)."""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

from exgrpo.policies.interfaces import Rollout, Scores  # noqa: E402
from exgrpo.policies.lm.engine import (  # noqa: E402
    RolloutEngine,
    SamplingParams,
    build_packed_batch,
    token_log_prob_entropy,
)
from exgrpo.policies.lm.policy import LMPolicy, LMPolicyConfig  # noqa: E402

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


DECODERS = pytest.mark.parametrize("decoder", ["static-kv", "static-kv-unpacked", "fused", "fused-unpacked", "hf"])


def engine(model, decoder="static-kv", **kw) -> RolloutEngine:
    """``<decoder>-unpacked``: that decoder on the model's own weights (no oneDNN packing)."""
    params = SamplingParams(**{"max_new_tokens": 14, "temperature": TEMP, **kw})
    prepack = not decoder.endswith("-unpacked")
    return RolloutEngine(model, PAD, EOS, params, decoder=decoder.removesuffix("-unpacked"), prepack=prepack)


def reference_row(model, prompt, response, temperature):
    """Unpadded single-row forward of prompt+response -> (log_prob, entropy) of the response tokens."""
    ids = torch.tensor([prompt + response])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : len(prompt) - 1 + len(response)]
    lp, ent, _ = token_log_prob_entropy(logits, torch.tensor(response), temperature)
    return lp, ent


@DECODERS
def test_rollout_log_prob_entropy_equal_full_forward(model, decoder):
    ro = engine(model, decoder).generate(PROMPTS, torch.Generator().manual_seed(3))
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


@DECODERS
def test_score_matches_rollout_and_is_differentiable(model, decoder):
    eng = engine(model, decoder)
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


@DECODERS
def test_greedy_equals_hf_generate(model, decoder):
    ro = engine(model, decoder).generate(PROMPTS, greedy=True)
    assert ro.finished.any() and not ro.finished.all(), "want rows that stop at EOS and rows that run out"
    batch = build_packed_batch(PROMPTS, None, None, PAD)
    hf = model.generate(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, do_sample=False, max_new_tokens=14,
        pad_token_id=PAD, eos_token_id=EOS,
    )[:, batch.prompt_width :]
    assert hf.shape == ro.tokens.shape
    assert torch.equal(hf, ro.tokens)


@DECODERS
def test_sampling_reproducible_with_generator(model, decoder):
    eng = engine(model, decoder)
    a = eng.generate(PROMPTS, torch.Generator().manual_seed(11))
    b = eng.generate(PROMPTS, torch.Generator().manual_seed(11))
    c = eng.generate(PROMPTS, torch.Generator().manual_seed(12))
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.mask, b.mask) and torch.equal(a.log_prob, b.log_prob)
    assert not torch.equal(a.tokens, c.tokens)
    # a generator's state, not the global RNG, drives sampling
    g = torch.Generator().manual_seed(11)
    torch.manual_seed(999)
    assert torch.equal(eng.generate(PROMPTS, g).tokens, a.tokens)


@DECODERS
def test_tiny_top_p_is_greedy(model, decoder):
    greedy = engine(model, decoder).generate(PROMPTS, greedy=True)
    nucleus = engine(model, decoder, top_p=1e-6).generate(PROMPTS, torch.Generator().manual_seed(0))
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


# ---------------------------------------------------------------------- the static-KV decoder
def test_static_kv_equals_hf_decoder_on_qwen2_with_biases():
    """Qwen2 blocks (q/k/v biases, another rotary base): same greedy tokens, log-probs = a re-score."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from exgrpo.policies.lm.fused_kv import supports_fused_kv
    from exgrpo.policies.lm.static_kv import supports_static_kv

    torch.manual_seed(4)
    cfg = Qwen2Config(
        vocab_size=10, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, max_position_embeddings=64, rope_theta=500.0, pad_token_id=PAD, bos_token_id=BOS,
        eos_token_id=EOS, tie_word_embeddings=False,
    )
    qwen = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():
        qwen.lm_head.weight.mul_(5.0)
        for layer in qwen.model.layers:  # non-zero biases, so a decoder that skipped them would differ
            layer.self_attn.q_proj.bias.normal_(0, 0.5)
            layer.self_attn.k_proj.bias.normal_(0, 0.5)
    assert supports_static_kv(qwen) and supports_fused_kv(qwen)
    slow = engine(qwen, "hf")
    for fast in (engine(qwen, d) for d in ("static-kv", "static-kv-unpacked", "fused", "fused-unpacked")):
        assert torch.equal(fast.generate(PROMPTS, greedy=True).tokens, slow.generate(PROMPTS, greedy=True).tokens)
        ro = fast.generate(PROMPTS, torch.Generator().manual_seed(2))
        with torch.no_grad():
            sc = fast.score(PROMPTS, ro.tokens, ro.mask)
        torch.testing.assert_close(sc.log_prob, ro.log_prob, atol=1e-5, rtol=0)
        torch.testing.assert_close(sc.entropy, ro.entropy, atol=1e-5, rtol=0)


@pytest.mark.parametrize("decoder", ["static-kv", "fused"])
def test_prepacked_weights_are_used_and_follow_each_update(model, decoder):
    """The packed (static-kv) or rewritten (fused) copy of the weights is taken per rollout: after an
    optimizer-like update the next rollout decodes the new weights (as the unpacked static-KV
    decoder, which reads the parameters themselves, does), not a stale copy."""
    from exgrpo.policies.lm import fused_kv, static_kv

    assert static_kv.can_prepack(), "this torch build has no oneDNN packed linear: the fast path is off"
    model = copy.deepcopy(model)
    args = (model, torch.tensor([[BOS, 3, 4]]), torch.ones(1, 3, dtype=torch.long), torch.arange(3)[None], 4)
    dec = static_kv.StaticKVDecoder(*args, prepack=True)
    assert dec.head.prepack and all(p["qkv"].prepack and p["gate_up"].prepack for p in dec.proj)
    fused = fused_kv.FusedKVDecoder(*args, prepack=True)
    assert fused.head_fused.prepack and all(w.qkv.prepack and w.down.prepack for w in fused.weights)
    packed, unpacked = engine(model, decoder), engine(model, "static-kv-unpacked")
    before = packed.generate(PROMPTS, greedy=True).tokens
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    after = packed.generate(PROMPTS, greedy=True).tokens
    assert not torch.equal(before, after)
    assert torch.equal(after, unpacked.generate(PROMPTS, greedy=True).tokens)


@pytest.mark.parametrize("decoder", ["static-kv", "fused"])
def test_static_kv_drops_finished_rows_from_the_batch(model, monkeypatch, decoder):
    from exgrpo.policies.lm import static_kv

    sizes = []
    real_drop = static_kv.StaticKVDecoder.drop

    def drop(self, keep):  # the real method, with the batch size it leaves recorded
        real_drop(self, keep)
        sizes.append(self.rows.numel())

    monkeypatch.setattr(static_kv.StaticKVDecoder, "drop", drop)
    ro = engine(model, decoder).generate(PROMPTS, torch.Generator().manual_seed(3))
    assert sizes and sizes == sorted(sizes, reverse=True) and sizes[-1] < len(PROMPTS)
    # every row that finished before the last step left the batch; the rest ran on
    lengths = ro.mask.sum(1)
    assert sizes[-1] >= int((lengths == lengths.max()).sum())


@pytest.mark.parametrize("decoder", ["static-kv", "static-kv-unpacked", "fused", "fused-unpacked"])
def test_static_kv_prefills_each_distinct_prompt_once(model, monkeypatch, decoder):
    """A GRPO batch (each prompt K times, the trainer's layout): the prefill runs the distinct
    prompts only, and every row decodes as if it had its own (greedy = the hf decoder's tokens,
    sampled log-probs = a full-forward re-score)."""
    from exgrpo.policies.lm import static_kv

    prompts = [p for p in PROMPTS[:5] for _ in range(3)]  # 15 rows, 5 distinct
    widths = []
    real_forward = static_kv.StaticKVDecoder._forward

    def forward(self, x, pos, mask):  # the real method, with the rows of each call recorded
        widths.append((x.shape[0], x.shape[1]))
        return real_forward(self, x, pos, mask)

    monkeypatch.setattr(static_kv.StaticKVDecoder, "_forward", forward)
    fast = engine(model, decoder)
    greedy = fast.generate(prompts, greedy=True)
    assert widths[0][0] == 5, widths[:2]  # the prefill ran 5 rows, not 15
    assert torch.equal(greedy.tokens, engine(model, "hf").generate(prompts, greedy=True).tokens)
    ro = fast.generate(prompts, torch.Generator().manual_seed(5))
    assert len({tuple(r) for r in ro.tokens[:3].tolist()}) > 1, "rows of one prompt must sample apart"
    with torch.no_grad():
        sc = fast.score(prompts, ro.tokens, ro.mask)
    torch.testing.assert_close(sc.log_prob, ro.log_prob, atol=1e-5, rtol=0)
    torch.testing.assert_close(sc.entropy, ro.entropy, atol=1e-5, rtol=0)


def test_static_kv_falls_back_to_hf_for_other_architectures():
    from transformers import GPT2Config, GPT2LMHeadModel

    from exgrpo.policies.lm.static_kv import supports_static_kv

    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=10, n_embd=32, n_layer=1, n_head=2, n_positions=64)).eval()
    assert not supports_static_kv(gpt2)
    a = engine(gpt2, "static-kv").generate(PROMPTS, torch.Generator().manual_seed(1))
    b = engine(gpt2, "hf").generate(PROMPTS, torch.Generator().manual_seed(1))
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.log_prob, b.log_prob)


def test_fused_runs_as_static_kv_where_it_cannot_fuse(model):
    """A Llama with an o_proj bias (attention_bias) is outside what the fused step computes: the
    engine runs the static-KV decoder for it, bit for bit; the tests' model is inside it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from exgrpo.policies.lm.fused_kv import FusedKVDecoder, supports_fused_kv
    from exgrpo.policies.lm.static_kv import StaticKVDecoder

    assert supports_fused_kv(model) and engine(model, "fused")._own_decoder() is FusedKVDecoder
    torch.manual_seed(5)
    biased = LlamaForCausalLM(LlamaConfig(
        vocab_size=10, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, attention_bias=True, pad_token_id=PAD, bos_token_id=BOS,
        eos_token_id=EOS,
    )).eval()
    assert not supports_fused_kv(biased) and engine(biased, "fused")._own_decoder() is StaticKVDecoder
    a = engine(biased, "fused").generate(PROMPTS, torch.Generator().manual_seed(1))
    b = engine(biased, "static-kv").generate(PROMPTS, torch.Generator().manual_seed(1))
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.log_prob, b.log_prob)


def test_inverse_cdf_sampling_follows_the_distribution():
    from scipy.stats import chisquare

    from exgrpo.policies.lm.engine import _inverse_cdf_index, _sample_inverse_cdf

    probs = torch.tensor([0.0, 0.5, 0.0, 0.2, 0.25, 0.05, 0.0])
    draws = _sample_inverse_cdf(probs.expand(200_000, -1), torch.Generator().manual_seed(0))
    counts = torch.bincount(draws, minlength=probs.numel())
    assert counts[probs == 0].sum() == 0, "a zero-probability token was drawn"
    nz = probs > 0
    assert chisquare(counts[nz].numpy(), (probs[nz] * draws.numel()).numpy()).pvalue > 1e-3
    # unnormalised input (a nucleus-truncated row) samples the renormalised distribution
    draws = _sample_inverse_cdf((probs * 3.0).expand(50_000, -1), torch.Generator().manual_seed(1))
    assert torch.bincount(draws, minlength=probs.numel())[probs == 0].sum() == 0
    # the ends: u = 0 takes the first token of nonzero mass, u * total rounding up to the total the last
    u = torch.tensor([[0.0], [0.6], [1.0]], dtype=torch.float64)
    assert _inverse_cdf_index(probs.expand(3, -1), u).tolist() == [1, 3, 5]


def test_shared_prompt_scoring_equals_one_packed_forward_with_gradients(model):
    """K rows per prompt scored on one forward of each distinct prompt: same log-probs, entropies
    and parameter gradients as the packed single forward (up to float rounding)."""
    rows = [p for p in PROMPTS[:4] for _ in range(3)]  # 4 distinct prompts x 3 samples, ragged lengths
    eng = engine(model)
    ro = eng.generate(rows, torch.Generator().manual_seed(7))
    params = list(model.parameters())
    outs, grads = [], []
    for share in (False, True):
        sc = eng.score(rows, ro.tokens, ro.mask, full=True, share_prompts=share)
        outs.append(sc)
        grads.append(torch.autograd.grad((sc.log_prob * torch.linspace(-1, 1, sc.log_prob.numel()).view_as(sc.log_prob)).sum()
                                         + sc.entropy.sum(), params))
    torch.testing.assert_close(outs[1].log_prob, outs[0].log_prob, atol=1e-5, rtol=0)
    torch.testing.assert_close(outs[1].entropy, outs[0].entropy, atol=1e-5, rtol=0)
    torch.testing.assert_close(outs[1].full_log_prob, outs[0].full_log_prob, atol=1e-5, rtol=0)
    assert (outs[1].log_prob[~ro.mask] == 0).all()
    for g_shared, g_packed in zip(grads[1], grads[0], strict=True):
        torch.testing.assert_close(g_shared, g_packed, atol=1e-5, rtol=1e-4)
    # rows in any order, and a batch whose prompts are all distinct (the packed path), agree too
    perm = torch.randperm(len(rows), generator=torch.Generator().manual_seed(0))
    sc = eng.score([rows[i] for i in perm], ro.tokens[perm], ro.mask[perm], share_prompts=True)
    torch.testing.assert_close(sc.log_prob, outs[0].log_prob[perm], atol=1e-5, rtol=0)


def _saved_for_backward(fn, weights: list[torch.Tensor]) -> tuple[object, int]:
    """(what ``fn()`` returns, the bytes of the tensors autograd saved for the backward while it ran,
    each storage once, ``weights`` left out)."""
    seen: dict[int, int] = {}
    own = {w.untyped_storage().data_ptr() for w in weights}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in own:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sum(seen.values())


def test_gradient_checkpointing_recomputes_the_same_numbers_and_keeps_far_less(model):
    """``policy.gradient_checkpointing``: the unpadded forward's layers keep their inputs only and run
    again in the backward. The same log-probs, entropies and parameter gradients, bit for bit (the
    same kernels on the same inputs), and the tensors held for the backward, measured by autograd's
    own hooks (the weights aside), shrink to a fraction (here 2 layers of width 32 over 80 tokens;
    SmolLM2's 30 layers keep some forty values a token each otherwise)."""
    rows = [p for p in PROMPTS[:4] for _ in range(3)] + PROMPTS[4:6]
    ro = engine(model).generate(rows, torch.Generator().manual_seed(7))
    params = [p for p in model.parameters() if p.requires_grad]
    weights = torch.linspace(-1, 1, ro.mask.numel()).view_as(ro.mask)
    outs, grads, kept = [], [], []
    for recompute in (False, True):
        eng = RolloutEngine(model, PAD, EOS, SamplingParams(max_new_tokens=14, temperature=TEMP), unpadded=True,
                            checkpoint_layers=recompute)
        sc, saved = _saved_for_backward(lambda: eng.score(rows, ro.tokens, ro.mask, share_prompts=True), params)  # noqa: B023
        outs.append(sc)
        kept.append(saved)
        grads.append(torch.autograd.grad((sc.log_prob * weights).sum() + sc.entropy.sum(), params))
    assert torch.equal(outs[1].log_prob, outs[0].log_prob) and torch.equal(outs[1].entropy, outs[0].entropy)
    for g_recomputed, g_kept in zip(grads[1], grads[0], strict=True):
        assert torch.equal(g_recomputed, g_kept)
    print("bytes kept for the backward, kept vs recomputed:", kept)
    assert kept[1] < 0.5 * kept[0], kept
    with torch.no_grad():  # no gradient recorded: nothing to recompute, the plain forward
        plain = RolloutEngine(model, PAD, EOS, SamplingParams(max_new_tokens=14, temperature=TEMP), unpadded=True,
                              checkpoint_layers=True).score(rows, ro.tokens, ro.mask, share_prompts=True)
    assert torch.equal(plain.log_prob, outs[0].log_prob)


def _qwen2_model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(4)
    cfg = Qwen2Config(
        vocab_size=10, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS,
        tie_word_embeddings=True, use_sliding_window=False,
    )
    m = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():  # q/k/v carry biases in this family: make them count
        for layer in m.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.5)
        m.model.embed_tokens.weight.mul_(5.0)
    return m


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_unpadded_scoring_equals_the_padded_forward_with_gradients(model, family):
    """Responses scored without their padding (flat real tokens, attention on the row grid): same
    log-probs, entropies and parameter gradients as the padded single forward, for ragged rows
    (some a single token), repeated and distinct prompts, in any row order."""
    from exgrpo.policies.lm.unpadded import supports_unpadded

    m = model if family == "llama" else _qwen2_model()
    assert supports_unpadded(m)
    rows = [p for p in PROMPTS[:4] for _ in range(3)] + PROMPTS[4:6]  # 4 prompts x 3 samples + 2 distinct
    ro = engine(m).generate(rows, torch.Generator().manual_seed(7))
    tokens, mask = ro.tokens.clone(), ro.mask.clone()
    mask[1, 1:] = False  # a one-token response
    tokens[1, 1:] = PAD
    assert mask.sum(1).min() == 1 and mask.sum(1).max() == tokens.shape[1] and not mask.all()
    params = [p for p in m.parameters() if p.requires_grad]
    weights = torch.linspace(-1, 1, mask.numel()).view_as(mask)
    outs, grads = [], []
    for unpadded, share in ((False, False), (True, True), (True, False)):  # the padded forward first
        eng = RolloutEngine(m, PAD, EOS, SamplingParams(max_new_tokens=14, temperature=TEMP), unpadded=unpadded)
        sc = eng.score(rows, tokens, mask, share_prompts=share)
        outs.append(sc)
        grads.append(torch.autograd.grad((sc.log_prob * weights).sum() + sc.entropy.sum(), params))
    for sc, g in zip(outs[1:], grads[1:], strict=True):  # prompts shared, and every row's prompt run
        torch.testing.assert_close(sc.log_prob, outs[0].log_prob, atol=1e-5, rtol=0)
        torch.testing.assert_close(sc.entropy, outs[0].entropy, atol=1e-5, rtol=0)
        assert (sc.log_prob[~mask] == 0).all() and (sc.entropy[~mask] == 0).all()
        for g_unpadded, g_padded in zip(g, grads[0], strict=True):
            torch.testing.assert_close(g_unpadded, g_padded, atol=1e-5, rtol=1e-4)
    perm = torch.randperm(len(rows), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        sc = eng.score([rows[i] for i in perm], tokens[perm], mask[perm], share_prompts=True)
        torch.testing.assert_close(sc.log_prob, outs[0].log_prob[perm], atol=1e-5, rtol=0)
        one = eng.score(rows, tokens[:, :1], mask[:, :1], share_prompts=True)  # T = 1: the prompts alone
        torch.testing.assert_close(one.log_prob, outs[0].log_prob[:, :1], atol=1e-5, rtol=0)


def test_every_name_the_lm_package_exports_resolves():
    """``exgrpo.policies.lm`` resolves its names lazily; each one in ``__all__`` must import
    (CharTokenizer pointed at a module that no longer existed)."""
    import exgrpo.policies.lm as lm

    for name in lm.__all__:
        assert getattr(lm, name).__name__ == name
