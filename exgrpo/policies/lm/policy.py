"""An HF causal LM as the native trainer's Policy (interfaces.py).

Prompt rows are unpadded token-id lists (``task.prompts(qids)``); responses are right-padded (N, T)
tensors with a bool mask through EOS. Sampling and scoring go through one
:class:`~exgrpo.policies.lm.engine.RolloutEngine`, so behaviour log-probs of fresh rows
and ``score`` of the same rows agree (same temperature, same packed layout). ``score`` runs in the
training precision (``policy.precision``, :mod:`.precision`); sampling in the weights' dtype. Unless
both are fp32, :meth:`LMPolicy.with_training_log_probs` re-scores a rollout with the training forward,
so that the importance ratio of an on-policy token compares one numeric path with itself.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import nn

from exgrpo.policies.interfaces import Rollout, Scores
from exgrpo.policies.lm.engine import RolloutEngine, SamplingParams
from exgrpo.policies.lm.precision import compute
from exgrpo.config import LMPolicyConfig, Precision

__all__ = ["LMPolicy", "LMPolicyConfig"]


class LMPolicy(nn.Module):
    """Policy protocol over a ``transformers`` causal LM (its parameters are this module's)."""

    def __init__(self, model: nn.Module, pad_id: int, eos_id: int, cfg: LMPolicyConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg = cfg or LMPolicyConfig()
        self.model = model
        self.max_response_length = cfg.max_new_tokens
        self.pad_id, self.eos_id = int(pad_id), int(eos_id)
        self.precision = Precision(cfg.precision)
        """The training forward's compute precision (``score``)."""
        weights = next(model.parameters()).dtype
        asked = Precision(getattr(cfg, "rollout_precision", Precision.FP32))
        self.rollout_precision = Precision.FP32 if weights == torch.float32 and asked is Precision.FP32 else Precision.BF16
        """The sampler's: fp32 (fp32 weights sampled as they are, by the fp32 decoders), or bf16 (bf16 weights,
        ``policy.dtype: bfloat16``, or a bf16 copy of fp32 ones, ``policy.rollout_precision: bf16``), whose
        decoder is another bf16 computation than the training forward: its log-probs are re-scored, as a bf16
        training forward's are."""
        self._rollout_copy = weights == torch.float32 and asked is Precision.BF16
        """Sample from a bfloat16 copy of the fp32 weights (:meth:`_sampler`)."""
        self._sampler_copy: list[nn.Module] = []  # the bf16 copy, made once (a list: not a submodule, not in state_dict)
        params = SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p)
        self._engine = RolloutEngine(model, self.pad_id, self.eos_id, params, decoder=cfg.decoder,
                                     prepack=cfg.prepack_weights, unpadded=cfg.unpadded_scoring,
                                     checkpoint_layers=cfg.gradient_checkpointing)

    @property
    def engine(self) -> RolloutEngine:
        self._engine.model = self.model  # follow a swapped model
        return self._engine

    @torch.no_grad()
    def _sampler(self) -> nn.Module:
        """The module rollouts and evaluations decode with: the model itself, or its bfloat16 copy with the
        current weights (one copy kept for the run, its values refreshed here: half the weights' bytes, read
        once per decoded token; no gradient or optimiser state of its own)."""
        if not self._rollout_copy:
            return self.model
        if not self._sampler_copy:
            # Parameters only: buffers such as RoPE's inverse frequencies stay as the training forward
            # reads them (fp32), so the copy differs from the model by the weights' rounding alone.
            shadow = copy.deepcopy(self.model).eval()
            for p in shadow.parameters():
                p.requires_grad_(False)
                p.data = p.data.to(torch.bfloat16)
            self._sampler_copy.append(shadow)
        else:
            for dst, src in zip(self._sampler_copy[0].parameters(), self.model.parameters(), strict=True):
                dst.copy_(src)
        return self._sampler_copy[0]

    def _decoding_engine(self, params: SamplingParams | None = None) -> RolloutEngine:
        """The engine that samples: the policy's own, or one over :meth:`_sampler`'s copy, with the policy's
        sampling settings or ``params`` (an evaluation's own)."""
        engine = self.engine
        model = self._sampler()
        if model is self.model:
            if params is None:
                return engine
            return RolloutEngine(model, self.pad_id, self.eos_id, params, decoder=engine.decoder)
        return RolloutEngine(model, self.pad_id, self.eos_id, params or engine.params, decoder=engine.decoder,
                             prepack=engine.prepack)

    @classmethod
    def from_tiny_lm(cls, tiny, cfg: LMPolicyConfig | None = None) -> LMPolicy:
        """From a :class:`~exgrpo.policies.lm.tiny_lm.TinyLM` (what ``load_tiny_lm`` returns)."""
        return cls(tiny.model, tiny.tokenizer.pad_id, tiny.tokenizer.eos_id, cfg)

    def generate(self, prompts: Sequence[Sequence[int]], generator: torch.Generator, greedy: bool = False) -> Rollout:
        """One response per prompt row; randomness only from ``generator`` (reproducible)."""
        out = self._decoding_engine().generate(prompts, generator=generator, greedy=greedy)
        return Rollout(tokens=out.tokens, mask=out.mask, log_prob=out.log_prob, entropy=out.entropy)

    def sample(self, prompts: Sequence[Sequence[int]], generator: torch.Generator, greedy: bool, max_tokens: int,
               temperature: float, top_p: float) -> Rollout:
        """One response per prompt row with these sampling settings (an evaluation's) instead of the
        policy's own, on the policy's decoder."""
        engine = self._decoding_engine(SamplingParams(max_tokens, temperature, top_p))
        out = engine.generate(prompts, generator=generator, greedy=greedy)
        return Rollout(tokens=out.tokens, mask=out.mask, log_prob=out.log_prob, entropy=out.entropy)

    def score(
        self, prompts: Sequence[Sequence[int]], tokens: torch.Tensor, mask: torch.Tensor, full: bool = False
    ) -> Scores:
        """(N, T) float32 log-probs/entropies of right-padded responses (one forward in the training
        precision), differentiable."""
        with compute(self.precision):
            out = self.engine.score(prompts, tokens, mask, full=full, share_prompts=self.cfg.share_prompt_forward)
        return Scores(log_prob=out.log_prob, entropy=out.entropy, full_log_prob=out.full_log_prob)

    @torch.no_grad()
    def with_training_log_probs(self, prompts: Sequence[Sequence[int]], rollout: Rollout) -> Rollout:
        """``rollout`` with the log-probs and entropies of the training forward (the loss's pi_old): the
        rollout itself when sampler and training forward both compute in fp32 (they agree to ~1e-5; no
        forward), else its rows re-scored by ``score`` without a gradient. Two bf16 computations (the
        bf16 decoder and the bf16 training forward) differ by bf16's rounding, so bf16 is re-scored
        whichever side it is on."""
        if self.rollout_precision is Precision.FP32 and self.precision is Precision.FP32:
            return rollout
        scores = self.score(prompts, rollout.tokens, rollout.mask)
        return Rollout(tokens=rollout.tokens, mask=rollout.mask, log_prob=scores.log_prob, entropy=scores.entropy)

    def forward(self, prompts, tokens, mask):  # noqa: D102 - nn.Module convention
        return self.score(prompts, tokens, mask)
