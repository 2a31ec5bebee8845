"""The LM head's log-probs and entropies a block of rows at a time equal the plain computation, with
their gradients, in fp32 and under bf16 autocast, across several blocks."""

from __future__ import annotations

import pytest
import torch

from exgrpo.policies.lm import lm_head
from exgrpo.policies.lm.engine import token_log_prob_entropy
from exgrpo.policies.lm.precision import bf16_matmul, cpu_flags


def _case(seed: int = 0, m: int = 37, d: int = 24, v: int = 301):
    g = torch.Generator().manual_seed(seed)
    head = torch.nn.Linear(d, v, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(v, d, generator=g) * 0.3)
    hidden = torch.randn(m, d, generator=g, requires_grad=True)
    tokens = torch.randint(0, v, (m,), generator=g)
    w_lp, w_ent = torch.randn(m, generator=g), torch.randn(m, generator=g)  # weights of a loss of both outputs
    return head, hidden, tokens, w_lp, w_ent


def _grads(head, hidden, tokens, w_lp, w_ent, chunked: bool, temp: float):
    head.weight.grad, hidden.grad = None, None
    if chunked:
        lp, ent = lm_head.head_log_prob_entropy(head, hidden, tokens, temp)
    else:
        lp, ent, _ = token_log_prob_entropy(head(hidden), tokens, temp)
    ((lp * w_lp).sum() + (ent * w_ent).sum()).backward()
    return lp.detach(), ent.detach(), hidden.grad.clone(), head.weight.grad.clone()


@pytest.mark.parametrize("temp", [1.0, 0.7])
def test_blocks_of_rows_give_the_plain_log_probs_entropies_and_gradients_in_fp32(monkeypatch, temp):
    monkeypatch.setattr(lm_head, "CHUNK_ELEMENTS", 301 * 8)  # 8 rows a block: five blocks, the last one short
    case = _case()
    plain = _grads(*case, chunked=False, temp=temp)
    blocks = _grads(*case, chunked=True, temp=temp)
    for got, want, name in zip(blocks, plain, ("log_prob", "entropy", "hidden grad", "weight grad"), strict=True):
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4, msg=name)


@pytest.mark.skipif(not bf16_matmul(cpu_flags()), reason="bf16 autocast needs a CPU with bf16 matmul")
def test_blocks_of_rows_under_bf16_autocast_agree_with_autocasts_own_head_to_bf16_rounding(monkeypatch):
    monkeypatch.setattr(lm_head, "CHUNK_ELEMENTS", 301 * 8)
    case = _case(seed=1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain = _grads(*case, chunked=False, temp=1.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        blocks = _grads(*case, chunked=True, temp=1.0)
    for got, want, name in zip(blocks, plain, ("log_prob", "entropy", "hidden grad", "weight grad"), strict=True):
        assert got.dtype == want.dtype, name
        torch.testing.assert_close(got, want, atol=3e-2, rtol=3e-2, msg=name)


def test_a_head_with_a_bias_is_left_to_the_plain_computation(monkeypatch):
    monkeypatch.setattr(lm_head, "CHUNK_ELEMENTS", 9)
    head = torch.nn.Linear(4, 9, bias=True)
    assert lm_head.head_log_prob_entropy(head, torch.zeros(2, 4), torch.zeros(2, dtype=torch.long), 1.0) is None


def test_logits_that_fit_in_one_block_are_left_to_the_plain_computation(monkeypatch):
    """A small vocabulary's logits (the tiny LM's) keep the plain computation's rounding, so its runs keep their
    numbers; past one block, the blocks take over."""
    head, hidden, tokens, _, _ = _case()
    monkeypatch.setattr(lm_head, "CHUNK_ELEMENTS", 37 * 301)
    assert lm_head.head_log_prob_entropy(head, hidden, tokens, 1.0) is None
    monkeypatch.setattr(lm_head, "CHUNK_ELEMENTS", 37 * 301 - 1)
    assert lm_head.head_log_prob_entropy(head, hidden, tokens, 1.0) is not None
