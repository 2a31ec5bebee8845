"""A decode loop with a preallocated KV cache for Llama-family HF models (Llama, Qwen2, Mistral).

Why it exists: on a CPU, ``transformers``' per-step forward spends much of a small model's decode
step outside the matmuls (a 4-D mask rebuilt every step, a dynamic cache that grows by
concatenation, the attention-interface dispatch). This module runs the same weights through the
same sub-modules (``q_proj``, ``input_layernorm``, ``mlp``, ``lm_head``, the model's own rotary
embedding) with:

* one key/value buffer per layer, allocated once for prompt + response, written a column per step;
* the attention mask built once and updated in place (one column per step);
* rows dropping out of the batch once they have finished (:meth:`StaticKVDecoder.drop` compacts the
  cache; the engine calls it as rows end), so a batch of short answers stops paying for its longest.

It reads the model's parameters directly (no copy), so it always decodes the current weights.
Only the batch layout differs from a full forward, so its log-probs equal a re-score of the same
responses up to float rounding (tests check 1e-5).

Layout: as :mod:`exgrpo.backends.native.lm.engine` (prompts left-padded to P, responses appended
column by column; padding after a row's EOS is never attended to).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["StaticKVDecoder", "supports_static_kv"]

_FAMILIES = frozenset({"llama", "qwen2", "mistral"})


def supports_static_kv(model: nn.Module) -> bool:
    """True for the causal LMs this decoder can run: Llama-family blocks, full attention, no cache tricks."""
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "model_type", None) not in _FAMILIES:
        return False
    if getattr(cfg, "use_sliding_window", False) and getattr(cfg, "sliding_window", None):
        return False
    inner = getattr(model, "model", None)
    return all(hasattr(inner, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb")) and hasattr(model, "lm_head")


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class StaticKVDecoder:
    """Prefill + one-token steps for a fixed batch of rows; ``drop`` removes finished rows.

    Usage (one rollout)::

        dec = StaticKVDecoder(model, input_ids, attention_mask, position_ids, max_new_tokens)
        logits = dec.prefill()                 # (N, V): next-token logits of each prompt
        logits = dec.step(next_tokens)         # (n, V) for the rows still in the batch
        dec.drop(keep)                         # keep: (n,) bool over the current rows
    """

    def __init__(
        self,
        model: nn.Module,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        max_new_tokens: int,
    ) -> None:
        cfg = model.config
        self.model = model
        self.layers = list(model.model.layers)
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.groups = self.n_heads // self.n_kv
        n, p = input_ids.shape
        width = p + max_new_tokens
        dtype = model.model.embed_tokens.weight.dtype
        self.input_ids, self.position_ids = input_ids, position_ids
        self.prompt_mask = attention_mask.bool()  # (N, P) real prompt tokens (the prefill's keys)
        # (N, width) additive score bias over the cache columns: 0 where a query may attend (real prompt
        # tokens, response columns as they are written), -inf elsewhere
        self.key_bias = torch.full((n, width), float("-inf"), dtype=dtype)
        self.key_bias[:, :p].masked_fill_(self.prompt_mask, 0.0)
        # keys stored transposed, so a decode step's q @ k^T reads them contiguously
        self.k = [torch.zeros((n, self.n_kv, self.head_dim, width), dtype=dtype) for _ in self.layers]  # (N, Hkv, D, width)
        self.v = [torch.zeros((n, self.n_kv, width, self.head_dim), dtype=dtype) for _ in self.layers]  # (N, Hkv, width, D)
        self.col = 0  # next cache column to write (the prefill writes 0..P-1)
        self.pos = position_ids[:, -1].clone()  # (N,) position of each row's last real token
        self.rows = torch.arange(n)  # (n,) original row index of each row still in the batch
        # cos/sin of every position a row can reach: (width, D)
        probe = torch.zeros((1, width, self.head_dim), dtype=dtype)
        cos, sin = model.model.rotary_emb(probe, torch.arange(width)[None])
        self.cos, self.sin = cos[0], sin[0]

    # ------------------------------------------------------------------ one layer
    def _attend(self, i: int, layer: nn.Module, h: torch.Tensor, rope: tuple, mask: torch.Tensor) -> torch.Tensor:
        """h (n, S, d) normed hidden states; rope = (cos, sin) (n, 1, S, D) at their positions;
        writes S cache columns from ``self.col``; mask over the first C cache columns: prefill
        (n, 1, S, C) bool, decode (n, 1, 1, C) additive float -> (n, S, d)."""
        attn = layer.self_attn
        n, s, _ = h.shape
        q = attn.q_proj(h).view(n, s, self.n_heads, self.head_dim).transpose(1, 2)  # (n, H, S, D)
        k = attn.k_proj(h).view(n, s, self.n_kv, self.head_dim).transpose(1, 2)  # (n, Hkv, S, D)
        v = attn.v_proj(h).view(n, s, self.n_kv, self.head_dim).transpose(1, 2)
        cos, sin = rope
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        c0, c1 = self.col, self.col + s
        self.k[i][..., c0:c1] = k.transpose(-1, -2)
        self.v[i][:, :, c0:c1] = v
        keys_t, values = self.k[i][..., :c1], self.v[i][:, :, :c1]  # (n, Hkv, D, C), (n, Hkv, C, D)
        if s == 1:  # decode: the G query heads of a KV head attend together, no KV copy
            q = q.reshape(n, self.n_kv, self.groups, self.head_dim)  # head h = kv * G + g (HF's repeat_kv order)
            scores = torch.matmul(q, keys_t).mul_(attn.scaling).add_(mask)  # (n, Hkv, G, C); mask = bias
            out = torch.matmul(scores.softmax(-1), values).reshape(n, 1, self.n_heads * self.head_dim)
        else:  # prefill
            keys = keys_t.transpose(-1, -2).repeat_interleave(self.groups, dim=1)
            values = values.repeat_interleave(self.groups, dim=1)
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=attn.scaling)
            out = out.transpose(1, 2).reshape(n, s, self.n_heads * self.head_dim)
        return attn.o_proj(out)

    def _forward(self, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Embedded tokens x (n, S, d) at positions pos (n, S) -> last position's logits (n, V)."""
        rope = (self.cos[pos][:, None], self.sin[pos][:, None])  # (n, 1, S, D) each
        for i, layer in enumerate(self.layers):
            x = x + self._attend(i, layer, layer.input_layernorm(x), rope, mask)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        self.col += x.shape[1]
        return self.model.lm_head(self.model.model.norm(x[:, -1]))

    # ------------------------------------------------------------------ public steps
    @torch.no_grad()
    def prefill(self) -> torch.Tensor:
        """Run the prompts; (N, V) logits predicting each row's first response token."""
        p = self.input_ids.shape[1]
        causal = torch.ones((p, p), dtype=torch.bool).tril()
        # a padding query attends to itself only (keeps its row finite; nothing real attends to it)
        mask = (causal[None] & self.prompt_mask[:, None, :]) | torch.eye(p, dtype=torch.bool)[None]
        x = self.model.model.embed_tokens(self.input_ids)
        return self._forward(x, self.position_ids, mask[:, None])

    @torch.no_grad()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Append one token per current row (n,) -> (n, V) next-token logits."""
        self.key_bias[:, self.col] = 0.0
        self.pos = self.pos + 1
        mask = self.key_bias[:, None, None, : self.col + 1]  # (n, 1, 1, C) additive
        x = self.model.model.embed_tokens(tokens[:, None])
        return self._forward(x, self.pos[:, None], mask)

    def drop(self, keep: torch.Tensor) -> None:
        """Keep only the rows where ``keep`` (n,) is True (the cache is copied once)."""
        idx = keep.nonzero().squeeze(1)
        self.rows = self.rows[idx]
        self.pos = self.pos[idx]
        self.key_bias = self.key_bias[idx]
        self.k = [t.index_select(0, idx) for t in self.k]
        self.v = [t.index_select(0, idx) for t in self.v]
