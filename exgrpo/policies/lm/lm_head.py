"""Token log-probs and entropies through the LM head, a few rows at a time (the training forward's last step).

Why it exists: the plain way (``lm_head(hidden)``, then :func:`~.engine.token_log_prob_entropy`) holds
vocabulary-sized fp32 tensors for every response token until the backward: logits, their log-softmax,
its exponential and their product, with their gradients later. SmolLM2's 49,152-entry vocabulary makes
them 200 KB a token, about 0.4 GB of a SmolLM2 mini-batch of 250 tokens, the largest part of what its
training forward keeps, and each is written and read again by the backward.

:class:`ChunkedLogProbEntropy` computes the same two numbers per token (of ``softmax(logits / T)``)
for :data:`CHUNK_ELEMENTS`-sized blocks of rows and keeps only the inputs (hidden states and the head's
weight): the backward recomputes each block's logits, at the price of one more product of the head.
Gradients, with ``z = logits / T``, ``p = softmax(z)``, ``H = -sum p log p``:

    d log p_y / dz = onehot(y) - p
    d H / dz       = -p * (log p + H)

Precision: under ``torch.autocast("cpu", bfloat16)`` the products run in bf16 from the fp32 weights and
hidden states, as autocast's ``linear`` would, and the softmax arithmetic in fp32; the head's weight
gradient is summed over blocks in fp32. The same numbers as the plain way up to float rounding (tests).
"""

from __future__ import annotations

from typing import Final

import torch

__all__ = ["CHUNK_ELEMENTS", "ChunkedLogProbEntropy", "head_log_prob_entropy"]

CHUNK_ELEMENTS: Final[int] = 1 << 22
"""Logits computed at once: rows x vocabulary <= this (16 MB of fp32; SmolLM2: 85 rows a block)."""


def _compute_dtype() -> torch.dtype | None:
    """The dtype autocast gives CPU products here (None outside autocast)."""
    return torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None


class ChunkedLogProbEntropy(torch.autograd.Function):
    """(M, d) hidden states, (V, d) head weight, (M,) token ids -> (M,) log-probs and (M,) entropies."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, tokens: torch.Tensor, temperature: float,
                dtype: torch.dtype | None):
        rows = max(1, CHUNK_ELEMENTS // weight.shape[0])
        w = weight if dtype is None else weight.to(dtype)
        log_prob = hidden.new_empty(hidden.shape[0], dtype=torch.float32)
        entropy = torch.empty_like(log_prob)
        with torch.autocast("cpu", enabled=False):
            for start in range(0, hidden.shape[0], rows):
                h = hidden[start:start + rows]
                z = (h if dtype is None else h.to(dtype)) @ w.t()  # (m, V)
                lp = torch.log_softmax(z.float() / temperature, dim=-1)
                y = tokens[start:start + rows]
                log_prob[start:start + rows] = lp.gather(-1, y[:, None]).squeeze(-1)
                entropy[start:start + rows] = -(lp.exp() * lp).sum(-1)
        ctx.save_for_backward(hidden, weight, tokens, entropy)
        ctx.temperature, ctx.dtype, ctx.rows = temperature, dtype, rows
        return log_prob, entropy

    @staticmethod
    def backward(ctx, grad_log_prob: torch.Tensor, grad_entropy: torch.Tensor):
        hidden, weight, tokens, entropy = ctx.saved_tensors
        dtype, rows, temp = ctx.dtype, ctx.rows, ctx.temperature
        w = weight if dtype is None else weight.to(dtype)
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32) if ctx.needs_input_grad[1] else None
        with torch.autocast("cpu", enabled=False):
            for start in range(0, hidden.shape[0], rows):
                end = start + rows
                h = hidden[start:end] if dtype is None else hidden[start:end].to(dtype)
                lp = torch.log_softmax((h @ w.t()).float() / temp, dim=-1)  # (m, V)
                p = lp.exp()
                # d/dz of g_lp * log p_y + g_H * H, then / T for the logits
                grad_z = p.mul_(-(grad_log_prob[start:end, None] + grad_entropy[start:end, None]
                                  * (lp + entropy[start:end, None])))
                grad_z.scatter_add_(-1, tokens[start:end, None], grad_log_prob[start:end, None])
                grad_logits = grad_z.div_(temp).to(h.dtype)
                if grad_hidden is not None:
                    grad_hidden[start:end] = grad_logits @ w
                if grad_weight is not None:
                    grad_weight += (grad_logits.t() @ h).float()
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None


def head_log_prob_entropy(head: torch.nn.Module, hidden: torch.Tensor, tokens: torch.Tensor,
                          temperature: float) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(M,) log-probs and entropies of ``tokens`` after ``head`` (an ``nn.Linear`` without bias) over
    ``hidden`` (M, d), block by block (:class:`ChunkedLogProbEntropy`); None where the logits fit in one
    block (M x V <= :data:`CHUNK_ELEMENTS`: nothing to save, and the plain computation keeps its rounding, so
    a small model's runs keep their numbers), or for a head it does not reproduce (a bias, or not a plain
    linear layer)."""
    if type(head) is not torch.nn.Linear or head.bias is not None:
        return None
    if hidden.shape[0] * head.weight.shape[0] <= CHUNK_ELEMENTS:
        return None
    return ChunkedLogProbEntropy.apply(hidden, head.weight, tokens.long(), float(temperature), _compute_dtype())
