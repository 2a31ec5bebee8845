"""The training forward over responses without their padding (Llama-family HF models).

Why it exists: a GRPO batch's responses are right-padded to the longest one (SmolLM2's batch: 64
columns, ~40 real tokens a row), and a padded forward pays the padding's share of every linear
layer, of the LM head and of the vocabulary-sized log-softmax and its backward, for tokens no loss
reads. Here the responses run as one flat list of their real tokens (M of them) through the model's
own sub-modules (``embed_tokens``, the norms, ``q_proj`` ... ``o_proj``, ``mlp``, the rotary
embedding); only attention sees a padded (N, S) grid, because it needs the rows. Each row attends
to its prompt's cached keys and values (computed beforehand, each distinct prompt once, by the
model's own forward: see :meth:`RolloutEngine.score`) and to its own earlier tokens.

Same numbers as a padded forward up to float rounding (tests: log-probs, entropies and every
parameter gradient). Deterministic at any thread count: the scatter to the grid is ``index_copy``
and the gather back ``index_select`` (their backward passes touch each cell once).

With ``checkpoint_layers`` (``policy.gradient_checkpointing``) the backward keeps each decoder layer's
input only and runs the layer's forward again to get the rest (:func:`torch.utils.checkpoint.checkpoint`,
non-reentrant): the same kernels on the same inputs, so the same numbers, for about one more forward
of the layers per update. What it saves is most of the forward's memory: a SmolLM2 layer keeps about
10,000 values per token of its own (norms, q/k/v, attention, the MLP's 1,536-wide products) against
the 576 of its input.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from exgrpo.policies.lm.static_kv import rms_norm, rotate_half, supports_static_kv

__all__ = ["forward_responses", "supports_unpadded"]


def supports_unpadded(model: nn.Module) -> bool:
    """True for the models :func:`forward_responses` reproduces: the static-KV decoder's Llama family,
    without attention dropout (the grid's softmax would drop other entries than the model's own)."""
    cfg = getattr(model, "config", None)
    return supports_static_kv(model) and not float(getattr(cfg, "attention_dropout", 0.0) or 0.0) > 0.0


def _to_grid(x: torch.Tensor, slots: torch.Tensor, n: int, s: int) -> torch.Tensor:
    """(M, H, D) real tokens -> (N, H, S, D) grid, zeros on padding cells."""
    grid = x.new_zeros((n * s, *x.shape[1:])).index_copy(0, slots, x)
    return grid.view(n, s, *x.shape[1:]).transpose(1, 2)


def _attention(
    attn: nn.Module, h: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], prompt_k: torch.Tensor,
    prompt_v: torch.Tensor, mask: torch.Tensor, slots: torch.Tensor, n: int, s: int,
) -> torch.Tensor:
    """h (M, d) normed hidden states of the real tokens -> (M, d) the attention block's output.

    prompt_k / prompt_v (N, Hkv, P, D): each row's prompt keys (rotated) and values;
    mask (N, 1, S, P + S) bool: which keys each grid query sees; rope (cos, sin) (M, 1, D)."""
    m, hd = h.shape[0], attn.head_dim
    q = attn.q_proj(h).view(m, -1, hd)  # (M, H, D)
    k = attn.k_proj(h).view(m, -1, hd)  # (M, Hkv, D)
    v = attn.v_proj(h).view(m, -1, hd)  # (M, Hkv, D)
    cos, sin = rope
    q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
    keys = torch.cat([prompt_k, _to_grid(k, slots, n, s)], dim=2)  # (N, Hkv, P + S, D)
    values = torch.cat([prompt_v, _to_grid(v, slots, n, s)], dim=2)
    groups = q.shape[1] // keys.shape[1]  # query heads per key/value head (HF's repeat_kv order)
    queries = _to_grid(q, slots, n, s)
    keys, values = keys.repeat_interleave(groups, dim=1), values.repeat_interleave(groups, dim=1)
    if torch.is_autocast_enabled("cpu"):
        # under bf16 autocast the products are bf16 all the same, but CPU's flash attention runs its backward
        # 2x slower in bf16 than in fp32 at these sizes (tens of queries a row): it runs in fp32 here
        with torch.autocast("cpu", enabled=False):
            out = F.scaled_dot_product_attention(queries.float(), keys.float(), values.float(), attn_mask=mask,
                                                 scale=attn.scaling)
    else:
        out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, scale=attn.scaling)  # (N, H, S, D)
    out = out.transpose(1, 2).reshape(n * s, -1).index_select(0, slots)  # (M, H * D)
    return attn.o_proj(out)


def _layer(
    layer: nn.Module, x: torch.Tensor, prompt_k: torch.Tensor, prompt_v: torch.Tensor,
    rope: tuple[torch.Tensor, torch.Tensor], mask: torch.Tensor, slots: torch.Tensor, n: int, s: int,
) -> torch.Tensor:
    """One decoder layer over the real tokens: x (M, d) -> (M, d) (shapes as in :func:`_attention`)."""
    x = x + _attention(layer.self_attn, rms_norm(layer.input_layernorm, x), rope, prompt_k, prompt_v, mask, slots, n, s)
    return x + layer.mlp(rms_norm(layer.post_attention_layernorm, x))


def forward_responses(
    model: nn.Module,
    prompt_keys: list[torch.Tensor],
    prompt_values: list[torch.Tensor],
    prompt_mask: torch.Tensor,
    tokens: torch.Tensor,
    mask: torch.Tensor,
    start: torch.Tensor,
    checkpoint_layers: bool = False,
) -> torch.Tensor:
    """The model's final hidden states at the real tokens of (N, S) right-padded inputs.

    prompt_keys / prompt_values: per layer (N, Hkv, P, D), each row's prompt cache (as HF's cache
    holds it: keys rotated); prompt_mask (N, P) bool, its real columns; tokens (N, S) long with
    mask (N, S) bool (True on a prefix of each row); start (N,) the position of each row's first
    token; ``checkpoint_layers``: recompute each layer's activations in the backward instead of keeping
    them (when a gradient is being recorded). -> (M, d), M = mask.sum(), the real tokens in row-major
    order, after the final norm."""
    n, s = tokens.shape
    slots = mask.reshape(-1).nonzero().squeeze(1)  # (M,) each real token's cell in the (N * S) grid
    inner = model.model
    x = inner.embed_tokens(tokens.reshape(-1).index_select(0, slots))  # (M, d)
    pos = (start[:, None] + torch.arange(s)).reshape(-1).index_select(0, slots)  # (M,)
    cos, sin = inner.rotary_emb(x[None], pos[None])  # (1, M, D) each
    rope = (cos[0][:, None], sin[0][:, None])  # (M, 1, D): broadcast over heads
    # a grid query sees its prompt's real tokens and its row's real tokens up to itself (a padding
    # cell's query sees the same as the row's last token: finite, and never read)
    causal = torch.ones((s, s), dtype=torch.bool).tril()
    attn_mask = torch.cat(
        [prompt_mask[:, None, :].expand(n, s, -1), causal[None] & mask[:, None, :]], dim=-1
    )[:, None]  # (N, 1, S, P + S)
    recompute = checkpoint_layers and torch.is_grad_enabled()
    for layer, k_p, v_p in zip(inner.layers, prompt_keys, prompt_values, strict=True):
        if recompute:
            x = checkpoint(_layer, layer, x, k_p, v_p, rope, attn_mask, slots, n, s, use_reentrant=False)
        else:
            x = _layer(layer, x, k_p, v_p, rope, attn_mask, slots, n, s)
    return rms_norm(inner.norm, x)
