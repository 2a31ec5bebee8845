"""A rollout/scoring engine for HF causal LMs (any ``transformers`` ``*ForCausalLM``), CPU-first.

Layout (the one padding convention of this module)
--------------------------------------------------
Every batch the model sees is built by :func:`build_packed_batch`::

    column:   0 ........ P-1 | P ............ P+T-1
    row i:    pad.. prompt_i | response_i ... pad..
              (LEFT-padded)  | (RIGHT-padded)

``attention_mask`` is 1 exactly on prompt and response tokens and ``position_ids`` count real
tokens only (0 at each row's first prompt token), so a row's numbers do not depend on how much
padding surrounds it. Because every prompt ends at column P-1, the logits at column P-1+t predict
response token t for *every* row: the response region is a plain (N, T) slice that lines up with
the right-padded ``response_tokens``/``response_mask``, and every reduction uses that one mask in
that one layout (no left/right mixing; cf. exgrpo-spec.md §11.1).

Generation uses the same layout: the prefill is ``build_packed_batch`` with an empty response,
then one column per step is appended to the KV cache, with attention 1 on real response tokens
and 0 on the padding written after a row's EOS. So after a rollout the cache holds exactly the
packed batch that :meth:`RolloutEngine.score` rebuilds, and behaviour log-probs match a re-score.

Log-probs and entropies
-----------------------
Both are of the **temperature-scaled** distribution ``softmax(logits / temperature)``: the
distribution sampled from when ``top_p = 1`` (the default). With ``top_p < 1`` tokens are drawn
from the nucleus-truncated, renormalised version, but the reported log-probs/entropies stay those
of the untruncated tempered distribution (as in veRL/vLLM), so ``score`` at the same temperature
reproduces them and importance ratios compare like with like. Greedy rollouts report the same
quantities (the argmax token's tempered log-prob). All are float32, 0 on padding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from exgrpo.policies.lm.fused_kv import FusedKVDecoder, supports_fused_kv
from exgrpo.policies.lm.lm_head import head_log_prob_entropy
from exgrpo.policies.lm.static_kv import StaticKVDecoder, distinct_rows, supports_static_kv
from exgrpo.policies.lm.unpadded import forward_responses, supports_unpadded
from exgrpo.config.options import Decoder

__all__ = [
    "GenerationOutput",
    "PackedBatch",
    "RolloutEngine",
    "SamplingParams",
    "ScoreOutput",
    "build_packed_batch",
    "token_log_prob_entropy",
]


@dataclass(frozen=True)
class SamplingParams:
    """How responses are sampled."""

    max_new_tokens: int = 32
    """Longest response (tokens, EOS included)."""
    temperature: float = 1.0
    """Logits are divided by this before softmax (> 0); also used by ``score``."""
    top_p: float = 1.0
    """Nucleus sampling mass in (0, 1]; 1 disables truncation."""

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={self.max_new_tokens} must be >= 1")
        if not self.temperature > 0:
            raise ValueError(f"temperature={self.temperature} must be > 0 (use greedy=True for argmax decoding)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p} must be in (0, 1]")


@dataclass
class PackedBatch:
    """[left-padded prompt ; right-padded response], shapes (N, P+T)."""

    input_ids: torch.Tensor
    """(N, P+T) long, pad_id wherever attention_mask is 0."""
    attention_mask: torch.Tensor
    """(N, P+T) long, 1 on prompt and response tokens."""
    position_ids: torch.Tensor
    """(N, P+T) long, index among the row's real tokens (0 on leading padding)."""
    prompt_width: int
    """P: the longest prompt; prompts end at column P-1, responses start at column P."""


@dataclass
class GenerationOutput:
    """One response per prompt row. T = the longest response of the batch (<= max_new_tokens)."""

    tokens: torch.Tensor
    """(N, T) long, right-padded response ids (pad_id after the end)."""
    mask: torch.Tensor
    """(N, T) bool, True on response tokens, the EOS token included; a row without EOS ran to
    max_new_tokens (truncated)."""
    log_prob: torch.Tensor
    """(N, T) float32, log-prob of each sampled token under softmax(logits / temperature); 0 on padding."""
    entropy: torch.Tensor
    """(N, T) float32, entropy of softmax(logits / temperature) at each position; 0 on padding."""
    finished: torch.Tensor
    """(N,) bool, True where the row ended with EOS."""


@dataclass
class ScoreOutput:
    """The model's view of given responses (same (N, T) layout as the responses)."""

    log_prob: torch.Tensor
    """(N, T) float32 token log-probs (0 on padding), differentiable."""
    entropy: torch.Tensor
    """(N, T) float32 token entropies (0 on padding), differentiable."""
    full_log_prob: torch.Tensor | None = None
    """(N, T, V) log-probs over the vocabulary (only when asked for; padding rows left as computed)."""


def _as_lists(prompts: Sequence[Sequence[int]] | torch.Tensor) -> list[list[int]]:
    if torch.is_tensor(prompts):
        raise TypeError("prompts must be a list of token-id lists (one per row, unpadded), not a tensor")
    rows = [list(map(int, p)) for p in prompts]
    for i, p in enumerate(rows):
        if not p:
            raise ValueError(f"prompt row {i} is empty; every prompt needs at least one token (e.g. BOS)")
    return rows


def build_packed_batch(
    prompts: Sequence[Sequence[int]],
    response_tokens: torch.Tensor | None,
    response_mask: torch.Tensor | None,
    pad_id: int,
) -> PackedBatch:
    """THE padding helper: prompts LEFT-padded to P, responses RIGHT-padded (as given) to T.

    ``prompts``: N token-id lists (unpadded). ``response_tokens`` (N, T) long and
    ``response_mask`` (N, T) bool, where each row's mask must be a prefix (True then False), as
    produced by :meth:`RolloutEngine.generate` or :func:`exgrpo.core.selection.pad_right`;
    ``None`` means T = 0 (the generation prefill)."""
    rows = _as_lists(prompts)
    n = len(rows)
    p = max((len(r) for r in rows), default=0)
    if response_tokens is None:
        response_tokens = torch.zeros((n, 0), dtype=torch.long)
        response_mask = torch.zeros((n, 0), dtype=torch.bool)
    if response_mask is None:
        raise ValueError("response_mask is required with response_tokens")
    if response_tokens.shape != response_mask.shape or response_tokens.shape[0] != n:
        raise ValueError(
            f"response tokens {tuple(response_tokens.shape)} / mask {tuple(response_mask.shape)} do not match "
            f"{n} prompt rows"
        )
    response_mask = response_mask.bool()
    if response_mask.shape[1] > 1 and (response_mask[:, 1:] & ~response_mask[:, :-1]).any():
        raise ValueError("response_mask must be right-padded (each row True on a prefix, then False)")
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.long)
    prompt_mask = (torch.arange(p)[None] >= (p - lengths)[:, None]).long()  # (N, P): each row's last len(r) columns
    prompt_ids = torch.full((n, p), pad_id, dtype=torch.long)
    prompt_ids[prompt_mask.bool()] = torch.tensor([t for r in rows for t in r], dtype=torch.long)  # row-major order
    resp_ids = response_tokens.long().masked_fill(~response_mask, pad_id)
    input_ids = torch.cat([prompt_ids, resp_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, response_mask.long()], dim=1)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp_min(0)
    return PackedBatch(input_ids, attention_mask, position_ids, p)


def token_log_prob_entropy(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(..., V) logits and (...) token ids -> (token log-probs, entropies, full log-probs) of
    softmax(logits / temperature), computed in float32."""
    log_prob_all = torch.log_softmax(logits.float() / temperature, dim=-1)
    log_prob = log_prob_all.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1)
    entropy = -(log_prob_all.exp() * log_prob_all).sum(-1)
    return log_prob, entropy, log_prob_all


def _nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Zero the tail of each row outside the smallest set of tokens with mass >= top_p."""
    sorted_p, idx = probs.sort(dim=-1, descending=True)
    drop = (sorted_p.cumsum(-1) - sorted_p) >= top_p  # mass before this token already reaches top_p
    sorted_p = sorted_p.masked_fill(drop, 0.0)
    return torch.zeros_like(probs).scatter(-1, idx, sorted_p)


def _sample_inverse_cdf(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """(n, V) unnormalised probabilities -> (n,) token ids, one uniform draw per row
    (:func:`_inverse_cdf_index`). ``torch.multinomial`` draws V exponentials per row, which
    dominates a large-vocabulary step."""
    u = torch.rand((probs.shape[0], 1), generator=generator, dtype=torch.float64)
    return _inverse_cdf_index(probs, u)


def _inverse_cdf_index(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """(n, V) unnormalised probabilities, (n, 1) float64 u in [0, 1) -> (n,) the first token whose
    cumulative mass exceeds u * total. That token has nonzero mass (cdf[i] > u * total >= cdf[i - 1]);
    where u * total rounds up to the total, the row's last token of nonzero mass."""
    cdf = probs.double().cumsum(-1)  # (n, V)
    idx = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(1)  # (n,)
    if bool((idx == probs.shape[1]).any()):
        last_nonzero = probs.shape[1] - 1 - (probs.flip(-1) > 0).int().argmax(-1)
        idx = torch.minimum(idx, last_nonzero)
    return idx


class RolloutEngine:
    """Batched KV-cache sampling and single-forward scoring for one HF causal LM.

    ``eos_id=None`` never stops early (every row runs to ``max_new_tokens``; for benchmarks).
    ``decoder``: :class:`~exgrpo.config.options.Decoder`; ``static-kv`` and ``fused`` fall back to
    ``hf`` for a model outside the Llama family, ``fused`` to ``static-kv`` for one it cannot fuse
    (:meth:`_own_decoder`). ``prepack``: those decoders reorder the weights once per rollout for
    oneDNN's GEMM (same fp32 math, another kernel; see :mod:`.static_kv`, :mod:`.fused_kv`). ``unpadded``:
    ``score`` runs the responses without their padding (Llama-family models; see :mod:`.unpadded`), and
    with ``checkpoint_layers`` recomputes that forward's layer activations in the backward."""

    def __init__(
        self,
        model: nn.Module,
        pad_id: int,
        eos_id: int | None,
        params: SamplingParams | None = None,
        decoder: Decoder | str = Decoder.STATIC_KV,
        prepack: bool = True,
        unpadded: bool = False,
        checkpoint_layers: bool = False,
    ) -> None:
        self.model = model
        self.unpadded = bool(unpadded)
        self.checkpoint_layers = bool(checkpoint_layers)
        self.decoder = Decoder(decoder)
        self.prepack = bool(prepack)
        self.pad_id = int(pad_id)
        self.eos_id = None if eos_id is None else int(eos_id)
        self.params = params or SamplingParams()

    # ------------------------------------------------------------------ sampling
    @torch.no_grad()
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        generator: torch.Generator | None = None,
        greedy: bool = False,
        max_new_tokens: int | None = None,
    ) -> GenerationOutput:
        """One response per prompt (a list of N unpadded token-id lists).

        Prefill once over the packed prompts, then one token per step from the KV cache. A row
        stops at its EOS (kept, mask True); the loop stops when every row has stopped or after
        ``max_new_tokens``. Sampling draws from ``generator`` only, so a seeded generator
        reproduces the rollout (for a given decoder)."""
        steps = int(max_new_tokens or self.params.max_new_tokens)
        batch = build_packed_batch(prompts, None, None, self.pad_id)
        n = batch.input_ids.shape[0]
        out = GenerationOutput(
            tokens=torch.full((n, steps), self.pad_id, dtype=torch.long),
            mask=torch.zeros((n, steps), dtype=torch.bool),
            log_prob=torch.zeros((n, steps)),
            entropy=torch.zeros((n, steps)),
            finished=torch.zeros(n, dtype=torch.bool),
        )
        decoder = self._own_decoder()
        if decoder is not None:
            width = self._decode_static_kv(decoder, batch, steps, generator, greedy, out)
        else:
            width = self._decode_hf(batch, steps, generator, greedy, out)
        out.tokens, out.mask = out.tokens[:, :width], out.mask[:, :width]
        out.log_prob, out.entropy = out.log_prob[:, :width], out.entropy[:, :width]
        return out

    def _own_decoder(self) -> type[StaticKVDecoder] | None:
        """The decoder class that runs ``self.decoder`` on this model, or None for HF's loop (``hf``,
        or a model outside the static-KV decoders' Llama family; ``fused`` on a Llama-family model it
        cannot fuse runs as ``static-kv``)."""
        if self.decoder is Decoder.HF or not supports_static_kv(self.model):
            return None
        if self.decoder is Decoder.FUSED and supports_fused_kv(self.model):
            return FusedKVDecoder
        return StaticKVDecoder

    def _pick(
        self, logits: torch.Tensor, generator: torch.Generator | None, greedy: bool, inverse_cdf: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(n, V) next-token logits -> (token, its tempered log-prob, tempered entropy), each (n,).
        ``inverse_cdf``: one uniform draw per row (:func:`_sample_inverse_cdf`) instead of
        ``torch.multinomial``'s V draws per row (what the ``hf`` decoder keeps, for reproducibility)."""
        sp = self.params
        scaled = logits.float() if sp.temperature == 1.0 else logits.float() / sp.temperature  # x / 1 == x
        log_prob_all = torch.log_softmax(scaled, dim=-1)
        probs = log_prob_all.exp()
        if greedy:
            nxt = logits.argmax(-1)
        else:
            sample_probs = _nucleus(probs, sp.top_p) if sp.top_p < 1.0 else probs
            if inverse_cdf:
                nxt = _sample_inverse_cdf(sample_probs, generator)
            else:
                nxt = torch.multinomial(sample_probs, 1, generator=generator).squeeze(1)
        log_prob = log_prob_all.gather(1, nxt[:, None]).squeeze(1)
        entropy = -(probs * log_prob_all).sum(-1)
        return nxt, log_prob, entropy

    def _decode_static_kv(
        self, decoder: type[StaticKVDecoder], batch: PackedBatch, steps: int, generator, greedy: bool,
        out: GenerationOutput,
    ) -> int:
        """Preallocated KV cache (``decoder``: static-kv or fused); finished rows leave the batch once
        an eighth of it is done. Each step's picks are kept as they are and written to ``out`` once,
        after the loop (a step costs a handful of kernels less)."""
        dec = decoder(self.model, batch.input_ids, batch.attention_mask, batch.position_ids, steps,
                              prepack=self.prepack)
        logits = dec.prefill()
        alive = torch.ones(batch.input_ids.shape[0], dtype=torch.bool)  # (n,) over the decoder's rows
        picks = []  # per step: (original row, live, token, log-prob, entropy), each (n,) over the decoder's rows
        t = 0
        for t in range(steps):
            nxt, log_prob, entropy = self._pick(logits, generator, greedy, inverse_cdf=True)
            picks.append((dec.rows, alive, nxt, log_prob, entropy))
            if self.eos_id is not None:
                alive = alive & (nxt != self.eos_id)
            n_alive = int(alive.sum())
            if t == steps - 1 or n_alive == 0:
                break
            if 8 * (alive.numel() - n_alive) >= alive.numel():
                dec.drop(alive)
                nxt, alive = nxt[alive], alive[alive]
            logits = dec.step(torch.where(alive, nxt, self.pad_id))
        rows, live, tokens, log_prob, entropy = (torch.cat(x) for x in zip(*picks, strict=True))
        col = torch.cat([torch.full_like(p[0], i) for i, p in enumerate(picks)])
        rows, col = rows[live], col[live]
        tokens = tokens[live]
        out.tokens[rows, col] = tokens
        out.mask[rows, col] = True
        out.log_prob[rows, col] = log_prob[live]
        out.entropy[rows, col] = entropy[live]
        if self.eos_id is not None:
            out.finished[rows[tokens == self.eos_id]] = True
        return t + 1

    def _decode_hf(self, batch: PackedBatch, steps: int, generator, greedy: bool, out: GenerationOutput) -> int:
        """The model's own forward with a growing cache (any HF causal LM)."""
        from transformers import DynamicCache

        attn = batch.attention_mask
        last_pos = batch.position_ids[:, -1]
        cache = DynamicCache(config=getattr(self.model, "config", None))
        finished = out.finished
        res = self.model(
            input_ids=batch.input_ids, attention_mask=attn, position_ids=batch.position_ids,
            past_key_values=cache, use_cache=True, logits_to_keep=1,
        )
        t = 0
        for t in range(steps):
            nxt, log_prob, entropy = self._pick(res.logits[:, -1, :], generator, greedy)
            live = ~finished
            nxt = torch.where(live, nxt, torch.full_like(nxt, self.pad_id))
            out.tokens[:, t] = nxt
            out.mask[:, t] = live
            out.log_prob[:, t] = torch.where(live, log_prob, 0.0)
            out.entropy[:, t] = torch.where(live, entropy, 0.0)
            if self.eos_id is not None:
                finished |= live & (nxt == self.eos_id)
            if bool(finished.all()) or t == steps - 1:
                break
            # append column t: attention 1 on real tokens, 0 on post-EOS padding (= packed layout)
            attn = torch.cat([attn, live.long()[:, None]], dim=1)
            last_pos = last_pos + live.long()
            res = self.model(
                input_ids=nxt[:, None], attention_mask=attn, position_ids=last_pos[:, None],
                past_key_values=cache, use_cache=True,
            )
        return t + 1

    # ------------------------------------------------------------------ scoring
    def score(
        self,
        prompt_ids: Sequence[Sequence[int]],
        response_tokens: torch.Tensor,
        response_mask: torch.Tensor,
        full: bool = False,
        temperature: float | None = None,
        share_prompts: bool = False,
    ) -> ScoreOutput:
        """Per-token log-probs and entropies of given right-padded responses (N, T), from ONE
        forward over the packed [prompt; response] batch. Differentiable (call under
        ``torch.no_grad`` when no gradient is wanted). ``temperature`` defaults to the sampling
        temperature, so a rollout's behaviour log-probs are reproduced.

        ``share_prompts``: when rows repeat a prompt (a GRPO group's K samples), run each distinct
        prompt once and its K responses on top of its key/value cache (two forwards, the same
        numbers up to float rounding; gradients flow through the shared prompt once). With the
        engine's ``unpadded`` on (and ``full`` off, a Llama-family model), the responses run without
        their padding on top of the prompts' cache (:mod:`.unpadded`; the same numbers up to
        rounding)."""
        temp = self.params.temperature if temperature is None else float(temperature)
        t = response_tokens.shape[1]
        rows = _as_lists(prompt_ids)
        mask = response_mask.bool()
        safe_tokens = torch.where(mask, response_tokens.long(), torch.zeros_like(response_tokens, dtype=torch.long))
        if self.unpadded and not full and t > 0 and supports_unpadded(self.model):
            log_prob, entropy = self._score_unpadded(rows, safe_tokens, mask, temp, share_prompts)
            return ScoreOutput(log_prob, entropy)
        if share_prompts and t > 0 and len(set(map(tuple, rows))) < len(rows):
            logits = self._logits_shared_prompts(rows, safe_tokens, mask)
        else:
            batch = build_packed_batch(rows, response_tokens, response_mask, self.pad_id)
            out = self.model(
                input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids,
                use_cache=False, logits_to_keep=t + 1,
            )
            # logits_to_keep=T+1 keeps columns P-1 .. P+T-1; column P-1+t predicts response token t
            logits = out.logits[:, :t, :]  # (N, T, V)
        log_prob, entropy, log_prob_all = token_log_prob_entropy(logits, safe_tokens, temp)
        log_prob = torch.where(mask, log_prob, torch.zeros_like(log_prob))
        entropy = torch.where(mask, entropy, torch.zeros_like(entropy))
        return ScoreOutput(log_prob, entropy, log_prob_all if full else None)

    def _prompt_forward(self, rows: list[list[int]], share: bool = True):
        """Each distinct prompt once (``share``; else every row's), left-padded to P, through the
        model with a cache.

        -> (inv (N,) each row's prompt among the U run, prefix (U, P) batch, logits (U, V)
        predicting response token 0, cache with per layer keys/values (U, Hkv, P, D))."""
        from transformers import DynamicCache

        if share:
            first, inv = distinct_rows([tuple(r) for r in rows])
        else:
            first = inv = torch.arange(len(rows))
        prefix = build_packed_batch([rows[i] for i in first.tolist()], None, None, self.pad_id)  # (U, P)
        cache = DynamicCache(config=getattr(self.model, "config", None))
        head = self.model(
            input_ids=prefix.input_ids, attention_mask=prefix.attention_mask, position_ids=prefix.position_ids,
            past_key_values=cache, use_cache=True, logits_to_keep=1,
        ).logits[:, 0]  # (U, V)
        return inv, prefix, head, cache

    def _logits_shared_prompts(self, rows: list[list[int]], tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(N, T, V) logits predicting each response token: the U distinct prompts in one forward
        with a cache, the cache gathered to the N rows, the padded responses on top."""
        inv, prefix, head, cache = self._prompt_forward(rows)
        # gathered to the N rows, (N, Hkv, P, D) per layer, with index_select rather than HF's
        # batch_select_indices (x[idx]): the backward of x[idx] on a CPU tensor, index_put_ with
        # accumulate, sums a prompt's K row gradients in an order that varies with the threads (a
        # 2-thread run was not reproducible); index_select's backward, index_add_, adds them in order
        for layer in cache.layers:
            layer.keys, layer.values = layer.keys.index_select(0, inv), layer.values.index_select(0, inv)
        full = build_packed_batch(rows, tokens, mask, self.pad_id)  # the packed layout's masks
        p = prefix.input_ids.shape[1]
        t = tokens.shape[1]
        tail = self.model(
            input_ids=full.input_ids[:, p:], attention_mask=full.attention_mask, position_ids=full.position_ids[:, p:],
            past_key_values=cache, use_cache=True, logits_to_keep=t,
        ).logits  # (N, T, V): column t predicts response token t+1
        return torch.cat([head.index_select(0, inv)[:, None], tail[:, : t - 1]], dim=1)

    def _score_unpadded(
        self, rows: list[list[int]], tokens: torch.Tensor, mask: torch.Tensor, temp: float, share: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(N, T) log-probs and entropies (0 on padding): the prompts (each distinct one once with
        ``share``), then the responses' real tokens without padding
        (:func:`.unpadded.forward_responses`). Token 0 is predicted by the prompt's last position,
        token t + 1 by response token t, so the inputs are the tokens whose successor is real:
        ``mask[:, 1:]`` (M of them)."""
        inv, prefix, head, cache = self._prompt_forward(rows, share)
        log_prob_0, entropy_0, _ = token_log_prob_entropy(head.index_select(0, inv), tokens[:, 0], temp)  # (N,)
        follows = mask[:, 1:]  # (N, T - 1): token t + 1 is real, so token t is an input
        log_prob, entropy = log_prob_0.new_zeros(follows.shape), entropy_0.new_zeros(follows.shape)
        if bool(follows.any()):
            hidden = forward_responses(
                self.model,
                [layer.keys.index_select(0, inv) for layer in cache.layers],
                [layer.values.index_select(0, inv) for layer in cache.layers],
                prefix.attention_mask.bool().index_select(0, inv),
                tokens[:, :-1], follows,
                start=prefix.position_ids[:, -1].index_select(0, inv) + 1,
                checkpoint_layers=self.checkpoint_layers,
            )  # (M, d)
            targets = tokens[:, 1:][follows]
            chunked = head_log_prob_entropy(self.model.lm_head, hidden, targets, temp)  # (M,) each, a block at a time
            lp, ent = chunked if chunked is not None else token_log_prob_entropy(self.model.lm_head(hidden), targets, temp)[:2]
            log_prob, entropy = log_prob.masked_scatter(follows, lp), entropy.masked_scatter(follows, ent)
        first = mask[:, 0]
        log_prob = torch.cat([torch.where(first, log_prob_0, 0.0)[:, None], log_prob], dim=1)
        entropy = torch.cat([torch.where(first, entropy_0, 0.0)[:, None], entropy], dim=1)
        return log_prob, entropy
