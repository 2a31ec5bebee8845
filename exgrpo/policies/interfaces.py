"""What the backend-agnostic trainer step needs from a policy and a task.

A *row* is one response sequence. Prompts are built per row by the task (``task.prompts(qids)``),
in whatever form its policy family reads (feature vectors for the toy MLP, token ids for an LM).
Response tensors are right-padded (N, T) with a bool mask; padding is built in exactly one place
per backend (a policy's ``generate`` for fresh rows, :func:`exgrpo.core.selection.pad_right` for
stored ones).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch


@dataclass
class Rollout:
    """Sampled responses and what the sampling policy said about them."""

    tokens: torch.Tensor
    """(N, T) long, right-padded response token ids."""
    mask: torch.Tensor
    """(N, T) bool, True on response tokens (through the EOS token when there is one)."""
    log_prob: torch.Tensor
    """(N, T) float, log pi_sampling(token) (0 on padding)."""
    entropy: torch.Tensor
    """(N, T) float, entropy of pi_sampling at each position (0 on padding)."""


@dataclass
class Scores:
    """The current policy's view of given responses."""

    log_prob: torch.Tensor
    """(N, T) token log-probs."""
    entropy: torch.Tensor
    """(N, T) token entropies."""
    full_log_prob: torch.Tensor | None = None
    """(N, T, V) log-probs over the vocabulary (only when asked for)."""


class Policy(Protocol):
    """A trainable policy (a ``torch.nn.Module``)."""

    max_response_length: int
    """Longest response it generates (the constant L of token-sum-norm aggregation)."""

    def generate(self, prompts: Any, generator: torch.Generator, greedy: bool = False) -> Rollout:
        """One sampled (or greedy) response per prompt row."""
        ...

    def score(self, prompts: Any, tokens: torch.Tensor, mask: torch.Tensor, full: bool = False) -> Scores:
        """Log-probs/entropies of given responses; differentiable unless under ``torch.no_grad``."""
        ...

    def with_training_log_probs(self, prompts: Any, rollout: Rollout) -> Rollout:
        """``rollout`` with the log-probs/entropies the training forward gives its rows (pi_old of the
        loss): the rollout itself when sampling and training compute alike."""
        ...

    def parameters(self): ...  # noqa: D102


class Task(Protocol):
    """Questions with verifiable answers."""

    train_ids: list[int]
    """Question ids used for training."""
    val_ids: list[int]
    """Held-out question ids."""

    def prompts(self, qids: Sequence[int]) -> Any:
        """Prompt rows for the policy, one per id (ids may repeat)."""
        ...

    def rewards(self, qids: Sequence[int], tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(N,) float binary rewards of response rows."""
        ...
