"""Comparison statistics over seeds: mean with a 95% CI, paired differences, steps-to-target."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as st


@dataclass(frozen=True)
class Estimate:
    """A mean over seeds with a two-sided confidence interval."""

    mean: float
    low: float
    high: float
    n: int

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def __str__(self) -> str:
        return f"{self.mean:.4f} ± {self.half_width:.4f}"


def mean_ci(values: Sequence[float], level: float = 0.95) -> Estimate:
    """Student-t interval of the mean (exact for normal data; the usual choice for a few seeds).
    With one value the interval is the point itself."""
    x = np.asarray(values, dtype=float)
    n = len(x)
    if n == 0:
        raise ValueError("mean_ci: no values")
    m = float(x.mean())
    if n == 1:
        return Estimate(m, m, m, 1)
    half = float(st.t.ppf(0.5 + level / 2, n - 1) * x.std(ddof=1) / np.sqrt(n))
    return Estimate(m, m - half, m + half, n)


def bootstrap_ci(values: Sequence[float], level: float = 0.95, n_boot: int = 10_000, seed: int = 0) -> Estimate:
    """Percentile bootstrap interval of the mean."""
    x = np.asarray(values, dtype=float)
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, len(x), size=(n_boot, len(x)))].mean(1)
    lo, hi = np.quantile(means, [0.5 - level / 2, 0.5 + level / 2])
    return Estimate(float(x.mean()), float(lo), float(hi), len(x))


def paired_difference(treatment: Sequence[float], baseline: Sequence[float], level: float = 0.95) -> Estimate:
    """Mean of per-seed differences (treatment - baseline) with a t interval; seeds must align."""
    a, b = np.asarray(treatment, dtype=float), np.asarray(baseline, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"paired_difference: {len(a)} treatment vs {len(b)} baseline values; seeds must match")
    return mean_ci(a - b, level)


def steps_to_target(steps: Sequence[float], values: Sequence[float], target: float) -> float | None:
    """First step at which ``values`` reaches ``target`` (None if never)."""
    for s, v in zip(steps, values, strict=True):
        if v >= target:
            return float(s)
    return None
