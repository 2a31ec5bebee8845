"""The static-KV decoder with a decode step of fewer kernels (``policy.decoder: fused``).

Why it exists: on a small model the decode step of :class:`~.static_kv.StaticKVDecoder` is ~130
small kernels per token (``bench/bench_rollout.py``'s profile of tiny-lm: the linears near the
core's fp32 peak, the rest a long tail of 5-50 us kernels). This decoder computes the same function
with fewer of them, by preparing the weights once per rollout:

* q/k/v and gate/up are one product each (their weights concatenated, or packed for oneDNN with
  ``prepack``), and the residual adds ride on the o and down products (``torch.addmm``);
* the query and key rows of each head are reordered so that the rotary embedding's pairs
  (dimension j and j + D/2) sit side by side: the rotation is then one complex multiplication
  (``view_as_complex``) instead of mul, rotate-half, mul and add. Attention scores are dot products
  over the head dimension, so reordering it in both queries and keys changes nothing (the cache
  holds keys in that order; values are untouched);
* the RMSNorms are 5 kernels and read their weight and epsilon once, not per call.

What it does not fold, on purpose: folding the norm weights into the next product, or the attention
scale into the query rows, saves a kernel each but measured log-probs 1.5-1.8e-5 from a full-forward
re-score on tiny-lm, against ~1e-5 for this decoder and the static-KV one.

Prefill, the cache layout, rows dropping out and the decode attention are the static-KV decoder's.
It is not bit-identical to it (fused adds round differently), so it is its own decoder value and the
static-KV decoder stays as it was (its golden fixture pins it); greedy tokens and log-probs agree
with a full forward up to float rounding (tests, and bench_rollout.py's checks).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from exgrpo.policies.lm.static_kv import StaticKVDecoder, pack_weight, packed_linear

__all__ = ["FusedKVDecoder", "supports_fused_kv"]


def supports_fused_kv(model: nn.Module) -> bool:
    """True for the models this decoder can run: the static-KV decoder's Llama family in float32, whose
    rotary embedding turns the whole head with the usual duplicated-halves cos/sin and whose MLP is SiLU-gated."""
    cfg = model.config
    if model.model.embed_tokens.weight.dtype != torch.float32:
        return False  # the fused step's batched products take fp32 (a bfloat16 model runs as static-kv)
    if getattr(cfg, "hidden_act", "silu") != "silu" or getattr(cfg, "attention_bias", False):
        return False  # another activation, or an o_proj bias (Llama's option; Qwen2's q/k/v biases are fine)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    probe = torch.zeros((1, 4, head_dim), dtype=model.model.embed_tokens.weight.dtype)
    cos, _ = model.model.rotary_emb(probe, torch.arange(4)[None])  # (1, 4, D) when the whole head turns
    half = head_dim // 2
    return cos.shape[-1] == head_dim and torch.equal(cos[..., :half], cos[..., half:])


class _Linear:
    """x @ W^T (+ b) (+ residual) with a weight prepared once: plain (``torch.addmm``, the residual
    fused in) or packed for oneDNN (``prepack``; the residual added after)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, prepack: bool, rows: int) -> None:
        self.prepack = prepack
        self.bias = bias
        if prepack:
            self.weight = pack_weight(weight, rows)
        else:
            self.weight_t = weight.t()  # (d_in, d_out) view, as F.linear reads it

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """x (n, d_in) -> (n, d_out) [+ residual (n, d_out)]."""
        if self.prepack:
            y = packed_linear(x, self.weight, self.bias)
            return y if residual is None else y.add_(residual)
        if residual is None:
            return x @ self.weight_t if self.bias is None else torch.addmm(self.bias, x, self.weight_t)
        return torch.addmm(residual, x, self.weight_t)  # callers pass no bias with a residual


def _interleave(d: int) -> torch.Tensor:
    """(d,) the order [0, d/2, 1, d/2 + 1, ...]: rotary pairs (j, j + d/2) side by side."""
    half = d // 2
    return torch.stack([torch.arange(half), torch.arange(half) + half], dim=1).reshape(d)


def _rms_norm(x: torch.Tensor, norm: tuple[torch.Tensor, float]) -> torch.Tensor:
    """x (n, d), norm = (weight (d,), eps) -> weight * x / sqrt(mean(x^2) + eps): a Llama-family
    RMSNorm in 5 kernels."""
    weight, eps = norm
    return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True).add_(eps))).mul_(weight)


def _norm_params(norm: nn.Module) -> tuple[torch.Tensor, float]:
    """An RMSNorm module's (weight, eps), read once (attribute lookups on modules cost per call)."""
    return norm.weight.detach(), float(norm.variance_epsilon)


@dataclass(frozen=True)
class _LayerWeights:
    """One decoder layer as the fused step reads it."""

    qkv: _Linear
    """-> (n, (H + 2 Hkv) D): queries, keys, values; q/k rows of each head in rotary-pair order."""
    o: _Linear
    gate_up: _Linear
    """-> (n, 2 I): the gate, then the up projection."""
    down: _Linear
    norm_attn: tuple[torch.Tensor, float]
    norm_mlp: tuple[torch.Tensor, float]
    scaling: float
    """The attention scale (1/sqrt(D) for these models)."""
    inter: int
    """I, the MLP width."""


class FusedKVDecoder(StaticKVDecoder):
    """:class:`~.static_kv.StaticKVDecoder` whose ``step`` runs on weights prepared once per rollout
    (see the module doc). Same construction and usage: ``prefill()``, then ``step(tokens)`` and
    ``drop(keep)``."""

    def _prepare_weights(self, prepack: bool) -> None:
        """The static-KV decoder's products on the model's own weights, for the prefill (it runs once,
        so nothing is packed for it), and the decode step's: q/k/v and gate/up concatenated (or
        packed, with ``prepack``), the q/k rows of each head in rotary-pair order."""
        super()._prepare_weights(False)
        model, n = self.model, self.input_ids.shape[0]
        d, half = self.head_dim, self.head_dim // 2
        # (width, D/2) complex: cos + i sin of each position's rotary angles
        self.turn = torch.complex(self.cos[:, :half].contiguous(), self.sin[:, :half].contiguous())
        self.perm = _interleave(d)
        heads_qk = self.n_heads + self.n_kv
        qk_rows = (torch.arange(heads_qk)[:, None] * d + self.perm[None]).reshape(-1)  # reorder each q/k head
        self.weights: list[_LayerWeights] = []
        with torch.no_grad():
            for layer in self.layers:
                attn, mlp = layer.self_attn, layer.mlp
                w = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])  # (d_qkv, d)
                b = None if attn.q_proj.bias is None else torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias])
                rows = torch.cat([qk_rows, torch.arange(heads_qk * d, w.shape[0])])
                w = w[rows]
                b = None if b is None else b[rows]
                gate_up = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])
                self.weights.append(_LayerWeights(
                    qkv=_Linear(w, b, prepack, n),
                    o=_Linear(attn.o_proj.weight, None, prepack, n),
                    gate_up=_Linear(gate_up, None, prepack, n),
                    down=_Linear(mlp.down_proj.weight, None, prepack, n),
                    norm_attn=_norm_params(layer.input_layernorm),
                    norm_mlp=_norm_params(layer.post_attention_layernorm),
                    scaling=float(attn.scaling),
                    inter=mlp.gate_proj.out_features,
                ))
            self.head_fused = _Linear(model.lm_head.weight, getattr(model.lm_head, "bias", None), prepack, n)
        self.final_norm = _norm_params(model.model.norm)
        self.embed = model.model.embed_tokens.weight

    def _attend(self, i: int, layer: nn.Module, h: torch.Tensor, rope: tuple, mask: torch.Tensor) -> torch.Tensor:
        """The static-KV prefill's attention (the decode step does not call it), then the keys it
        cached reordered as this decoder's queries are: head dimension in rotary-pair order."""
        out = super()._attend(i, layer, h, rope, mask)
        c0, c1 = self.col, self.col + h.shape[1]
        keys = self.k[i]  # (U, Hkv, D, width) during the prefill: the distinct prompts' rows
        keys[..., c0:c1] = keys[..., c0:c1].index_select(2, self.perm)
        return out

    @torch.no_grad()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Append one token per current row (n,) -> (n, V) next-token logits."""
        n = tokens.shape[0]
        h, hkv, d, g = self.n_heads, self.n_kv, self.head_dim, self.groups
        col = self.col
        self.key_bias[:, col] = 0.0
        self.pos = self.pos + 1
        mask = self.key_bias[:, None, None, : col + 1]  # (n, 1, 1, C) additive
        turn = self.turn.index_select(0, self.pos)[:, None]  # (n, 1, D/2)
        x = self.embed.index_select(0, tokens)  # (n, d_model)
        for i, w in enumerate(self.weights):
            qkv = w.qkv(_rms_norm(x, w.norm_attn))  # (n, (H + 2 Hkv) D); q/k in pair order
            qk = torch.view_as_complex(qkv[:, : (h + hkv) * d].view(n, h + hkv, d // 2, 2))
            qk = torch.view_as_real(qk * turn).view(n, h + hkv, d)  # rotated queries and keys
            self.k[i][..., col] = qk[:, h:]
            self.v[i][:, :, col] = qkv[:, (h + hkv) * d:].view(n, hkv, d)
            q = qk[:, :h].view(n, hkv, g, d)  # head h = kv * G + g (HF's repeat_kv order)
            scores = torch.matmul(q, self.k[i][..., : col + 1]).mul_(w.scaling).add_(mask)  # (n, Hkv, G, C)
            out = torch.matmul(scores.softmax(-1), self.v[i][:, :, : col + 1]).view(n, h * d)
            x = w.o(out, residual=x)
            gate_up = w.gate_up(_rms_norm(x, w.norm_mlp))  # (n, 2 I)
            x = w.down(F.silu(gate_up[:, : w.inter]).mul_(gate_up[:, w.inter:]), residual=x)
        self.col = col + 1
        return self.head_fused(_rms_norm(x, self.final_norm))
