"""Bucket sampler: which pooled questions to replay this step (exgrpo-spec.md §3).

Mass is per *bucket* (keyed by the latest success count k), not per question: a bucket with one
question gets the same mass as one with a thousand. Default weighting: N(k; mu=K/2, sigma=1) over
the count k (the reference code; the paper's text speaks of the rate k/K); ``center`` moves mu.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from exgrpo.config import BucketWeighting

WeightFn = Callable[[np.ndarray, int, float, float | None], np.ndarray]
"""(k: int array of bucket keys, K, sigma, center or None for K/2) -> unnormalised non-negative
weights, same shape."""

WEIGHTINGS: dict[BucketWeighting, WeightFn] = {}


def register_weighting(name: BucketWeighting) -> Callable[[WeightFn], WeightFn]:
    def deco(fn: WeightFn) -> WeightFn:
        WEIGHTINGS[name] = fn
        return fn

    return deco


@register_weighting(BucketWeighting.NORMAL)
def _normal(k: np.ndarray, group_size: int, sigma: float, center: float | None) -> np.ndarray:
    mu = group_size / 2 if center is None else center
    return np.exp(-0.5 * ((k - mu) / sigma) ** 2) / (sigma * np.sqrt(2 * np.pi))


@register_weighting(BucketWeighting.LINEAR)
def _linear(k: np.ndarray, group_size: int, sigma: float, center: float | None) -> np.ndarray:
    return k / group_size


@register_weighting(BucketWeighting.SQRT)
def _sqrt(k: np.ndarray, group_size: int, sigma: float, center: float | None) -> np.ndarray:
    return np.sqrt(k / group_size)


@register_weighting(BucketWeighting.LINEAR_CLIP)
def _linear_clip(k: np.ndarray, group_size: int, sigma: float, center: float | None) -> np.ndarray:
    return np.where(k > group_size / 2, 0.5, k / group_size)


@register_weighting(BucketWeighting.UNIFORM)
def _uniform(k: np.ndarray, group_size: int, sigma: float, center: float | None) -> np.ndarray:
    return np.ones_like(k, dtype=float)


def bucket_probabilities(
    keys: Sequence[int], group_size: int, weighting: BucketWeighting = BucketWeighting.NORMAL, sigma: float = 1.0,
    center: float | None = None,
) -> np.ndarray:
    """Probability of each (non-empty) bucket key, shape (len(keys),), summing to 1."""
    k = np.asarray(keys, dtype=float)
    w = WEIGHTINGS[BucketWeighting(weighting)](k, group_size, sigma, center).astype(float)
    total = w.sum()
    if not np.isfinite(total) or total <= 0:  # e.g. linear weights on an all-zero key set
        return np.full(len(k), 1.0 / len(k))
    return w / total


def allocate_counts(n: int, probs: np.ndarray, sizes: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Multinomial draw of ``n`` over buckets, capped at each bucket's size; the excess is
    re-drawn one at a time among buckets with room, with their original probabilities renormalised.

    Shapes: probs, sizes (n_buckets,). Returns int counts (n_buckets,), sum = min(n, sizes.sum()).
    """
    n = min(int(n), int(sizes.sum()))
    counts = rng.multinomial(n, probs)
    over = np.maximum(counts - sizes, 0)
    counts = np.minimum(counts, sizes)
    for _ in range(int(over.sum())):
        room = counts < sizes
        p = np.where(room, probs, 0.0)
        p = p / p.sum() if p.sum() > 0 else room / room.sum()
        counts[rng.choice(len(p), p=p)] += 1
    return counts


def sample_questions(
    buckets: Mapping[int, Sequence[int]],
    n: int,
    group_size: int,
    rng: np.random.Generator,
    weighting: BucketWeighting = BucketWeighting.NORMAL,
    sigma: float = 1.0,
    center: float | None = None,
) -> list[int]:
    """Draw up to ``n`` distinct question ids from non-empty buckets (retired questions must not be
    in ``buckets``; :meth:`ExperiencePool.buckets` guarantees it)."""
    keys = [k for k, qs in buckets.items() if len(qs) > 0]
    if n <= 0 or not keys:
        return []
    probs = bucket_probabilities(keys, group_size, weighting, sigma, center)
    sizes = np.array([len(buckets[k]) for k in keys])
    counts = allocate_counts(n, probs, sizes, rng)
    chosen: list[int] = []
    for key, c in zip(keys, counts, strict=True):
        if c:
            idx = rng.choice(len(buckets[key]), size=int(c), replace=False)
            chosen.extend(int(buckets[key][i]) for i in idx)
    return chosen
