"""The toy tier's policy: an MLP from a feature vector to logits over every candidate answer.

A response is a single token (the chosen answer), so T = 1 and the mask is all True.
"""

from __future__ import annotations

import torch
from torch import nn

from exgrpo.backends.native.interfaces import Rollout, Scores
from exgrpo.config import MLPPolicyConfig


def unique_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (N, F) -> (unique (U, F), inverse (N,)): exactly ``torch.unique(x, dim=0, return_inverse=True)``
    (distinct rows in sorted order), ~10x faster on a GRPO batch.

    A batch holds each prompt K times in a row, so runs of equal neighbours are collapsed first (one
    comparison per element) and the sort runs on the U-ish rows left, not on all N
    (``torch.unique(dim=0)`` sorts rows lexicographically: 2.4 ms of a ~19 ms toy step here)."""
    starts = torch.ones(x.shape[0], dtype=torch.bool)  # (N,) True where a run of equal rows begins
    starts[1:] = (x[1:] != x[:-1]).any(1)
    run = starts.cumsum(0) - 1  # (N,) each row's run
    unique, run_inverse = torch.unique(x[starts], dim=0, return_inverse=True)
    return unique, run_inverse.index_select(0, run)


class MLPPolicy(nn.Module):
    max_response_length = 1

    def __init__(self, cfg: MLPPolicyConfig, in_features: int, num_actions: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = in_features
        for _ in range(cfg.layers):
            layers += [nn.Linear(width, cfg.hidden), nn.ReLU()]
            width = cfg.hidden
        layers.append(nn.Linear(width, num_actions))
        self.net = nn.Sequential(*layers)

    def log_probs(self, prompts: torch.Tensor) -> torch.Tensor:
        """(N, F) features -> (N, V) log-probs over actions.

        A GRPO batch repeats each prompt K times, so the MLP runs once per distinct row and the
        result is gathered back (identical values, ~K times less compute)."""
        unique, inverse = unique_rows(prompts)
        # index_select, not x[inverse]: its backward adds the K rows in order, x[inverse]'s does not on
        # a CPU with more than one thread (runs of the same seed would differ)
        return torch.log_softmax(self.net(unique), dim=-1).index_select(0, inverse)

    def generate(self, prompts: torch.Tensor, generator: torch.Generator, greedy: bool = False) -> Rollout:
        log_prob_all = self.log_probs(prompts)  # (N, V)
        if greedy:
            actions = log_prob_all.argmax(-1)
        else:
            actions = torch.multinomial(log_prob_all.exp(), 1, generator=generator).squeeze(1)
        log_prob = log_prob_all.gather(1, actions[:, None])  # (N, 1)
        entropy = -(log_prob_all.exp() * log_prob_all).sum(-1, keepdim=True)  # (N, 1)
        mask = torch.ones_like(log_prob, dtype=torch.bool)
        return Rollout(tokens=actions[:, None], mask=mask, log_prob=log_prob, entropy=entropy)

    def score(self, prompts: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor, full: bool = False) -> Scores:
        log_prob_all = self.log_probs(prompts)  # (N, V)
        log_prob = log_prob_all.gather(1, tokens[:, :1])  # (N, 1)
        entropy = -(log_prob_all.exp() * log_prob_all).sum(-1, keepdim=True)  # (N, 1)
        return Scores(log_prob=log_prob, entropy=entropy, full_log_prob=log_prob_all[:, None, :] if full else None)
