"""A decode loop with a preallocated KV cache for Llama-family HF models (Llama, Qwen2, Mistral).

Why it exists: on a CPU, ``transformers``' per-step forward spends much of a small model's decode
step outside the matmuls (a 4-D mask rebuilt every step, a dynamic cache that grows by
concatenation, the attention-interface dispatch). This module runs the same weights through the
same sub-modules (``q_proj``, ``input_layernorm``, ``mlp``, ``lm_head``, the model's own rotary
embedding) with:

* one key/value buffer per layer, allocated once for prompt + response, written a column per step;
* the attention mask built once and updated in place (one column per step);
* rows dropping out of the batch once they have finished (:meth:`StaticKVDecoder.drop` compacts the
  cache; the engine calls it as rows end), so a batch of short answers stops paying for its longest;
* optionally (``prepack=True``, the engine's default) the projection weights reordered once per
  rollout into oneDNN's blocked layout, q/k/v and gate/up fused into one product each. The math is
  the same fp32 product; what changes is the kernel. With a few rows per step (a decode step is an
  (n, d) @ (d, d') product with n = 16 on SmolLM2) MKL's ``sgemm`` reaches ~15-20 GFLOP/s on weights
  that do not fit in cache, oneDNN on pre-packed weights several times that (``bench/bench_rollout.py``).

It reads the model's parameters when it is built (``prepack=False``: directly, no copy; ``True``: a
packed copy), so build one per rollout: it always decodes the weights of that moment. Only the
batch layout and the GEMM kernel differ from a full forward, so its log-probs equal a re-score of
the same responses up to float rounding (tests check 1e-5 on the tiny LM).

Layout: as :mod:`exgrpo.policies.lm.engine` (prompts left-padded to P, responses appended
column by column; padding after a row's EOS is never attended to).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "StaticKVDecoder", "can_prepack", "distinct_rows", "pack_weight", "packed_linear", "rms_norm", "rotate_half",
    "supports_static_kv",
]

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


def can_prepack() -> bool:
    """True when this torch build has oneDNN's packed fp32 linear (the x86 CPU wheels do)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def pack_weight(weight: torch.Tensor, rows: int) -> torch.Tensor:
    """W (d_out, d_in) reordered once into oneDNN's blocked layout for ``rows``-row inputs."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), rows)


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x (..., d_in) @ W^T + b with W from :func:`pack_weight`: the same fp32 product, oneDNN's kernel."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


class _Projection:
    """x @ W^T + b of one or more ``nn.Linear`` sharing an input, as one product (outputs concatenated).

    ``prepack``: W is reordered once into oneDNN's layout for ``rows``-row inputs; otherwise the
    modules' own parameters are used as they are (no copy)."""

    def __init__(self, linears: list[nn.Linear], prepack: bool, rows: int) -> None:
        self.linears, self.prepack = linears, prepack
        self.sizes = [lin.out_features for lin in linears]
        if prepack:
            weight = torch.cat([lin.weight.detach() for lin in linears]) if len(linears) > 1 else linears[0].weight.detach()
            biases = [lin.bias for lin in linears]
            self.bias = None if all(b is None for b in biases) else torch.cat(
                [b.detach() if b is not None else weight.new_zeros(lin.out_features) for b, lin in zip(biases, linears, strict=True)])
            self.weight = pack_weight(weight, rows)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., d_in) -> (..., sum of d_out_i): the linears' outputs side by side."""
        if self.prepack:
            return packed_linear(x, self.weight, self.bias)
        ys = [lin(x) for lin in self.linears]
        return ys[0] if len(ys) == 1 else torch.cat(ys, dim=-1)

    def parts(self, x: torch.Tensor) -> list[torch.Tensor]:
        """x (..., d_in) -> each linear's output (..., d_out_i): views of one product when packed,
        the modules' own outputs otherwise (no concatenation to split again)."""
        if self.prepack:
            return list(self(x).split(self.sizes, dim=-1))
        return [lin(x) for lin in self.linears]


def rms_norm(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A Llama-family RMSNorm (``weight * x / sqrt(mean(x^2) + eps)``) through ``F.rms_norm`` for
    float32 (the module's values; one call, though on CPU torch still runs it as several kernels:
    profiled, no faster); other dtypes run the module."""
    if x.dtype != torch.float32 or norm.weight.dtype != torch.float32:
        return norm(x)
    return F.rms_norm(x, norm.weight.shape, norm.weight, norm.variance_epsilon)


def distinct_rows(rows: list[tuple]) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (first, inverse): ``first`` (U,) the index of each distinct row's first occurrence, in
    order of appearance; ``inverse`` (N,) the position in ``first`` of each row's distinct row."""
    slot: dict[tuple, int] = {}
    first, inverse = [], []
    for i, r in enumerate(rows):
        if r not in slot:
            slot[r] = len(first)
            first.append(i)
        inverse.append(slot[r])
    return torch.tensor(first, dtype=torch.long), torch.tensor(inverse, dtype=torch.long)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(..., D) -> (-x[D/2:], x[:D/2]) side by side: the rotary embedding's half turn (as HF's)."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class StaticKVDecoder:
    """Prefill + one-token steps for a fixed batch of rows; ``drop`` removes finished rows.

    Usage (one rollout)::

        dec = StaticKVDecoder(model, input_ids, attention_mask, position_ids, max_new_tokens, prepack=True)
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
        prepack: bool = False,
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
        self._prepare_weights(prepack and can_prepack())

    def _prepare_weights(self, prepack: bool) -> None:
        """The products a forward runs, per layer: (q|k|v), o, (gate|up), down; and the LM head
        (packed for oneDNN with ``prepack``, else the modules' own weights)."""
        n = self.input_ids.shape[0]
        self.proj = [
            {
                "qkv": _Projection([layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj], prepack, n),
                "o": _Projection([layer.self_attn.o_proj], prepack, n),
                "gate_up": _Projection([layer.mlp.gate_proj, layer.mlp.up_proj], prepack, n),
                "down": _Projection([layer.mlp.down_proj], prepack, n),
            }
            for layer in self.layers
        ]
        self.head = _Projection([self.model.lm_head], prepack, n)

    # ------------------------------------------------------------------ one layer
    def _attend(self, i: int, layer: nn.Module, h: torch.Tensor, rope: tuple, mask: torch.Tensor) -> torch.Tensor:
        """h (n, S, d) normed hidden states; rope = (cos, sin) (n, 1, S, D) at their positions;
        writes S cache columns from ``self.col``; mask over the first C cache columns: prefill
        (n, 1, S, C) bool, decode (n, 1, 1, C) additive float -> (n, S, d)."""
        attn = layer.self_attn
        n, s, _ = h.shape
        qkv = self.proj[i]["qkv"](h)  # (n, S, (H + 2 Hkv) D): queries, keys, values side by side
        heads = self.n_heads + self.n_kv
        qk = qkv[..., : heads * self.head_dim].reshape(n, s, heads, self.head_dim).transpose(1, 2)  # (n, H+Hkv, S, D)
        v = qkv[..., heads * self.head_dim:].reshape(n, s, self.n_kv, self.head_dim).transpose(1, 2)  # (n, Hkv, S, D)
        cos, sin = rope
        qk = qk * cos + rotate_half(qk) * sin  # queries and keys rotated together
        q, k = qk[:, : self.n_heads], qk[:, self.n_heads:]  # (n, H, S, D), (n, Hkv, S, D)
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
        return self.proj[i]["o"](out)

    def _mlp(self, i: int, layer: nn.Module, h: torch.Tensor) -> torch.Tensor:
        """The gated MLP of Llama-family blocks: down(act(gate(h)) * up(h))."""
        gate, up = self.proj[i]["gate_up"].parts(h)
        return self.proj[i]["down"](layer.mlp.act_fn(gate) * up)

    def _forward(self, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Embedded tokens x (n, S, d) at positions pos (n, S) -> last position's logits (n, V)."""
        rope = (self.cos[pos][:, None], self.sin[pos][:, None])  # (n, 1, S, D) each
        for i, layer in enumerate(self.layers):
            x = x + self._attend(i, layer, rms_norm(layer.input_layernorm, x), rope, mask)
            x = x + self._mlp(i, layer, rms_norm(layer.post_attention_layernorm, x))
        self.col += x.shape[1]
        return self.head(rms_norm(self.model.model.norm, x[:, -1]))

    # ------------------------------------------------------------------ public steps
    @torch.no_grad()
    def prefill(self) -> torch.Tensor:
        """Run the prompts; (N, V) logits predicting each row's first response token.

        Each distinct prompt runs once (a GRPO batch holds every prompt K times); its cache columns
        and logits are then copied to the rows that share it."""
        n, p = self.input_ids.shape
        rows = torch.cat([self.input_ids, self.prompt_mask.long()], dim=1).tolist()  # a prompt with its padding
        first, inverse = distinct_rows([tuple(r) for r in rows])  # (U,), (N,): all distinct -> the identity
        u = len(first)
        full_k, full_v = self.k, self.v
        self.k, self.v = [t[:u] for t in full_k], [t[:u] for t in full_v]  # views: the prefill writes rows 0..U-1
        causal = torch.ones((p, p), dtype=torch.bool).tril()
        prompt_mask = self.prompt_mask[first]
        # a padding query attends to itself only (keeps its row finite; nothing real attends to it)
        mask = (causal[None] & prompt_mask[:, None, :]) | torch.eye(p, dtype=torch.bool)[None]
        x = self.model.model.embed_tokens(self.input_ids[first])
        logits = self._forward(x, self.position_ids[first], mask[:, None])  # (U, V)
        if u < n:  # index_select copies before the write, so rows 0..U-1 are read intact
            for k in full_k:  # (N, Hkv, D, width): prompt columns last
                k[..., :p] = k[:u, ..., :p].index_select(0, inverse)
            for v in full_v:  # (N, Hkv, width, D)
                v[:, :, :p] = v[:u, :, :p].index_select(0, inverse)
        self.k, self.v = full_k, full_v
        return logits.index_select(0, inverse)

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
