"""An HF causal LM as the native trainer's Policy (interfaces.py).

Prompt rows are unpadded token-id lists (``task.prompts(qids)``); responses are right-padded (N, T)
tensors with a bool mask through EOS. Sampling and scoring go through one
:class:`~exgrpo.policies.lm.engine.RolloutEngine`, so behaviour log-probs of fresh rows
and ``score`` of the same rows agree (same temperature, same packed layout).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from exgrpo.policies.interfaces import Rollout, Scores
from exgrpo.policies.lm.engine import RolloutEngine, SamplingParams
from exgrpo.config import LMPolicyConfig

__all__ = ["LMPolicy", "LMPolicyConfig"]


class LMPolicy(nn.Module):
    """Policy protocol over a ``transformers`` causal LM (its parameters are this module's)."""

    def __init__(self, model: nn.Module, pad_id: int, eos_id: int, cfg: LMPolicyConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg = cfg or LMPolicyConfig()
        self.model = model
        self.max_response_length = cfg.max_new_tokens
        self.pad_id, self.eos_id = int(pad_id), int(eos_id)
        params = SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p)
        self._engine = RolloutEngine(model, self.pad_id, self.eos_id, params, decoder=cfg.decoder,
                                     prepack=cfg.prepack_weights, unpadded=cfg.unpadded_scoring)

    @property
    def engine(self) -> RolloutEngine:
        self._engine.model = self.model  # follow a swapped model
        return self._engine

    @classmethod
    def from_tiny_lm(cls, tiny, cfg: LMPolicyConfig | None = None) -> LMPolicy:
        """From a :class:`~exgrpo.policies.lm.tiny_lm.TinyLM` (what ``load_tiny_lm`` returns)."""
        return cls(tiny.model, tiny.tokenizer.pad_id, tiny.tokenizer.eos_id, cfg)

    def generate(self, prompts: Sequence[Sequence[int]], generator: torch.Generator, greedy: bool = False) -> Rollout:
        """One response per prompt row; randomness only from ``generator`` (reproducible)."""
        out = self.engine.generate(prompts, generator=generator, greedy=greedy)
        return Rollout(tokens=out.tokens, mask=out.mask, log_prob=out.log_prob, entropy=out.entropy)

    def sample(self, prompts: Sequence[Sequence[int]], generator: torch.Generator, greedy: bool, max_tokens: int,
               temperature: float, top_p: float) -> Rollout:
        """One response per prompt row with these sampling settings (an evaluation's) instead of the
        policy's own, on the policy's decoder."""
        params = SamplingParams(max_tokens, temperature, top_p)
        engine = RolloutEngine(self.model, self.pad_id, self.eos_id, params, decoder=self.engine.decoder)
        out = engine.generate(prompts, generator=generator, greedy=greedy)
        return Rollout(tokens=out.tokens, mask=out.mask, log_prob=out.log_prob, entropy=out.entropy)

    def score(
        self, prompts: Sequence[Sequence[int]], tokens: torch.Tensor, mask: torch.Tensor, full: bool = False
    ) -> Scores:
        """(N, T) log-probs/entropies of right-padded responses (one forward), differentiable."""
        out = self.engine.score(prompts, tokens, mask, full=full, share_prompts=self.cfg.share_prompt_forward)
        return Scores(log_prob=out.log_prob, entropy=out.entropy, full_log_prob=out.full_log_prob)

    def forward(self, prompts, tokens, mask):  # noqa: D102 - nn.Module convention
        return self.score(prompts, tokens, mask)
