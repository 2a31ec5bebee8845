"""Group-relative advantages (GRPO)."""

from __future__ import annotations

import torch


def grpo_advantages(rewards: torch.Tensor, std_norm: bool = False, eps: float = 1e-8) -> torch.Tensor:
    """A_ij = r_ij - mean_j r_ij, divided by max(std_j r_ij, eps) when ``std_norm``.

    rewards: (G, K) one row per group of K rollouts (a replayed trajectory is one of the K).
    Returns (G, K). The std is the population std (the notebook's np.std).
    """
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    if std_norm:
        centred = centred / rewards.std(dim=1, unbiased=False, keepdim=True).clamp_min(eps)
    return centred
