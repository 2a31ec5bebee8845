"""Comparison statistics over seeds: mean with a 95% CI, paired differences, steps-to-target, and the
robust aggregates of Agarwal et al. (2021, "Deep RL at the edge of the statistical precipice"; the
conventions of their rliable library, built here on scipy.stats): the interquartile mean with a
bootstrap CI, the probability of improvement, and performance profiles."""

from __future__ import annotations

import re
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


def iqm(values: Sequence[float]) -> float:
    """Interquartile mean: the mean of the middle 50% of the values (25% trimmed from each end)."""
    return float(st.trim_mean(np.asarray(values, dtype=float), 0.25))


def iqm_ci(values: Sequence[float], level: float = 0.95, n_boot: int = 10_000, seed: int = 0) -> Estimate:
    """IQM over seeds with a percentile-bootstrap CI (runs resampled with replacement; one task, so
    the stratified bootstrap is the plain one)."""
    x = np.asarray(values, dtype=float)
    m = iqm(x)
    if len(x) < 2 or np.ptp(x) == 0:
        return Estimate(m, m, m, len(x))
    res = st.bootstrap((x,), lambda a, axis: st.trim_mean(a, 0.25, axis=axis), confidence_level=level,
                       n_resamples=n_boot, method="percentile", rng=np.random.default_rng(seed))
    return Estimate(m, float(res.confidence_interval.low), float(res.confidence_interval.high), len(x))


def probability_of_improvement(x: Sequence[float], y: Sequence[float], level: float = 0.95, n_boot: int = 10_000,
                               seed: int = 0) -> Estimate:
    """P(X > Y) + P(X = Y)/2 for a run X of one arm and a run Y of another (the Mann-Whitney U
    statistic over n·m pairs), with a percentile-bootstrap CI resampling each arm's runs."""
    a, b = np.asarray(x, dtype=float), np.asarray(y, dtype=float)

    def poi(u, v, axis=-1):
        diff = u[..., :, None] - v[..., None, :]
        return ((diff > 0) + 0.5 * (diff == 0)).mean(axis=(-2, -1))

    p = float(poi(a, b))
    if len(a) < 2 or len(b) < 2:
        return Estimate(p, p, p, min(len(a), len(b)))
    res = st.bootstrap((a, b), poi, confidence_level=level, n_resamples=n_boot, method="percentile",
                       vectorized=True, rng=np.random.default_rng(seed))
    low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    return Estimate(p, min(low, p), max(high, p), min(len(a), len(b)))


def performance_profile(values: Sequence[float], thresholds: Sequence[float]) -> np.ndarray:
    """Fraction of runs whose score exceeds each threshold tau (the run-score distribution)."""
    x = np.asarray(values, dtype=float)
    return np.array([(x > t).mean() for t in thresholds])


def steps_to_target(steps: Sequence[float], values: Sequence[float], target: float) -> float | None:
    """First step at which ``values`` reaches ``target`` (None if never)."""
    for s, v in zip(steps, values, strict=True):
        if v >= target:
            return float(s)
    return None


def value_at(x: float, xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """A curve ``ys`` over increasing ``xs`` (a run's metric at each evaluation, against the sampled
    tokens spent by then) read at ``x``: linear interpolation between the two evaluations around it;
    None outside ``[xs[0], xs[-1]]`` (a curve is never extrapolated) or for an empty curve."""
    if not xs or len(xs) != len(ys) or x < xs[0] or x > xs[-1]:
        return None
    return float(np.interp(x, np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)))


def t_test_p_value(diff: Estimate, level: float = 0.95) -> float:
    """The two-sided p-value of the Student-t test behind a t interval (:func:`mean_ci`,
    :func:`paired_difference`) at ``level``, read back from its mean, half-width and n: the same test
    as ``scipy.stats.ttest_rel`` on the paired values. 1.0 for a degenerate interval at zero."""
    if diff.n < 2:
        raise ValueError("t_test_p_value: one value gives no interval and no test")
    if diff.half_width == 0:
        return 1.0 if diff.mean == 0 else 0.0
    se = diff.half_width / float(st.t.ppf(0.5 + level / 2, diff.n - 1))
    return float(2 * st.t.sf(abs(diff.mean) / se, diff.n - 1))


def holm(p_values: Sequence[float], alpha: float = 0.05) -> tuple[list[float], list[bool]]:
    """Holm's step-down adjustment (Holm 1979): the adjusted p-values, in the input's order, and which
    hypotheses are rejected with the family-wise error held at ``alpha`` over all of them."""
    p = np.asarray(p_values, dtype=float)
    m = len(p)
    order = np.argsort(p, kind="stable")
    stepped = np.maximum.accumulate(np.minimum(1.0, (m - np.arange(m)) * p[order]))
    adjusted = np.empty(m)
    adjusted[order] = stepped
    return [float(a) for a in adjusted], [bool(a <= alpha) for a in adjusted]


RATE_SUFFIXES = ("accuracy", "solved", "pass_rate", "fraction", "ratio")
"""Metric names ending so are shares in [0, 1]; ``pool/*`` are counts, at least 0."""
SCORE_NAME = re.compile(r"(avg|pass)_at_\d+")
"""An evaluation's score (``eval/val/avg_at_1``, ``eval/gsm8k/pass_at_4``): a share in [0, 1]."""


def metric_range(key: str) -> tuple[float, float]:
    """The values metric ``key`` can take: [0, 1] for accuracies and rates, [0, inf) for the pool's
    counts, else unbounded."""
    last = key.rsplit("/", 1)[-1]
    if last.endswith(RATE_SUFFIXES) or SCORE_NAME.fullmatch(last):
        return 0.0, 1.0
    if key.startswith("pool/"):
        return 0.0, float("inf")
    return float("-inf"), float("inf")


def band(series: list[dict[int, float]], key: str = "") -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                                               np.ndarray]:
    """steps, mean, 95% CI low/high, n seeds: at the steps every seed has (aligned on the step), or,
    if they share none, at every step with the seeds that have it. The Student-t interval is clipped
    to what metric ``key`` can take (:func:`metric_range`): with 2 or 3 seeds it reaches far outside."""
    series = [s for s in series if s]
    if not series:
        e = np.array([])
        return e, e, e, e, e
    steps = sorted(set.intersection(*(set(s) for s in series)))
    if not steps:
        steps = sorted(set.union(*(set(s) for s in series)))
    mean, lo, hi, n = [], [], [], []
    for step in steps:
        vals = [s[step] for s in series if step in s]
        est = mean_ci(vals)
        mean.append(est.mean)
        lo.append(est.low)
        hi.append(est.high)
        n.append(est.n)
    low, high = metric_range(key)
    return (np.array(steps), np.array(mean), np.clip(np.array(lo, dtype=float), low, high),
            np.clip(np.array(hi, dtype=float), low, high), np.array(n))
