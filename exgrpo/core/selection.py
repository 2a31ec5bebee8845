"""Which stored trajectory of a question to replay (exgrpo-spec.md §4).

The intended behaviour, implemented here: score every stored trajectory of the question under the
*current* policy, reduce per trajectory to a masked mean over its own response tokens, and take the
argmin (or argmax). The reference code computes something else (inverted mask, misaligned padding,
another row's mask; spec §11.1, upstream LUFFY#57) that approximates the lowest *total* entropy;
we do not reproduce it.

All tensors here are right-padded: row i holds trajectory i's tokens at positions [0, len_i) and
``mask[i, t]`` is True exactly there. Padding is built once, by :func:`pad_right`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from exgrpo.config import SelectionMetric, SelectionMode


def pad_right(seqs: Sequence[Sequence[float] | Sequence[int]], pad: float = 0, dtype=torch.long) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad sequences into (N, T_max) plus a bool mask (N, T_max), T_max >= 1."""
    t_max = max([len(s) for s in seqs] + [1])
    out = torch.full((len(seqs), t_max), pad, dtype=dtype)
    mask = torch.zeros((len(seqs), t_max), dtype=torch.bool)
    for i, s in enumerate(seqs):
        if len(s):
            out[i, : len(s)] = torch.as_tensor(list(s), dtype=dtype)
            mask[i, : len(s)] = True
    return out, mask


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Mean of x over positions where mask is True, along ``dim`` (0 where the mask is empty)."""
    m = mask.to(x.dtype)
    return (x * m).sum(dim) / m.sum(dim).clamp_min(1.0)


MetricFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""(log_prob (N,T), entropy (N,T), mask (N,T)) -> per-trajectory metric (N,)."""

SELECTION_METRICS: dict[SelectionMetric, MetricFn] = {
    SelectionMetric.ENTROPY: lambda log_prob, ent, mask: masked_mean(ent, mask),
    SelectionMetric.PERPLEXITY: lambda log_prob, ent, mask: torch.exp(-masked_mean(log_prob, mask)),
}


def trajectory_metric(metric: SelectionMetric, log_prob: torch.Tensor, entropy: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-trajectory selection metric, shape (N,). Not defined for ``random``."""
    return SELECTION_METRICS[SelectionMetric(metric)](log_prob, entropy, mask)


def select_per_group(
    values: torch.Tensor | None,
    group_index: Sequence[int],
    mode: SelectionMode,
    rng: np.random.Generator,
) -> list[int]:
    """For each group (question) pick one row: argmin/argmax of ``values`` within the group, or a
    uniformly random row when ``values`` is None (the ``random`` metric).

    ``group_index`` (N,) gives each row's group 0..G-1; returns G row indices, in group order.
    Ties break toward the earliest stored trajectory.
    """
    groups: dict[int, list[int]] = {}
    for row, g in enumerate(group_index):
        groups.setdefault(int(g), []).append(row)
    picked: list[int] = []
    for g in sorted(groups):
        rows = groups[g]
        if values is None:
            picked.append(rows[int(rng.integers(len(rows)))])
            continue
        v = values[rows]
        j = int(torch.argmin(v)) if SelectionMode(mode) == SelectionMode.ARGMIN else int(torch.argmax(v))
        picked.append(rows[j])
    return picked
