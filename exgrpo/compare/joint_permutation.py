"""AdaStop with a joint, two-sided permutation distribution: the test ``exgrpo compare --adaptive`` runs.

AdaStop 0.1.3 (``adastop.MultipleAgentsComparator``) builds each pair's permutation distribution from
that pair's own pool (the arm's and the baseline's runs) and applies the same split index to every pair.
With one baseline shared by several pairs that is not a permutation of the data: at eight pairs against
one baseline the observed maximum was the top of the 252 permuted maxima of a stage with probability
0.0073 instead of 1/252, and the family-wise error over a test was 7%, not 5% (docs/seeds.md). It also
reads the two-sided statistic |T| against the one-sided distribution of T.

:class:`JointPermutationComparator` overrides one method, the permutation distribution, and keeps
AdaStop's error spending (alpha (k+1)/K at stage k), its step-down over the pairs, its removal of the
permutations an earlier stage would have rejected, and its decisions:

* **joint**: each stage's new block of runs of every arm still compared is pooled and permuted with one
  permutation shared by every pair, so under the null of no difference among those arms the observed
  point is one of ``B`` exchangeable points: the identity and ``B - 1`` uniformly random permutations at
  stage 1; at a later stage each point kept is extended by one random permutation of the new block (a
  Monte-Carlo permutation test with the observed point included; p-values move in steps of 1/B);
* **two-sided**: the values handed to AdaStop are |statistic|, so max |T| is read against the
  distribution of max |T|, and the test is given the family-wise ``alpha`` itself;
* **ties**: a permuted statistic equal in exact arithmetic to an observed one (any pair's, either sign)
  counts as at least as extreme. Finals are k/N accuracies stored as float32, so such values land a few
  ulps either side of the observed one, differently in fractions and in percent: values within a
  tolerance relative to the data (:func:`tie_tolerance`) are set to the observed statistic as AdaStop
  computes it, and the decisions do not depend on the metric's units.

With arms that do differ from the baseline, the pooled block holds their runs too: that widens the
distribution the other pairs are read against (the test errs toward "no difference" for them).
"""

from __future__ import annotations

import os

import numpy as np

os.environ.setdefault("MPLBACKEND", "Agg")  # the package only plots on request; no display is ever needed
from adastop import MultipleAgentsComparator  # noqa: E402


def block_differences(blocks: list[np.ndarray], pairs: list[tuple[int, int]], perms: np.ndarray) -> np.ndarray:
    """(pairs, P): for each of the P permutations ``perms`` (P, N) of the pooled ``blocks`` (one array of
    runs per arm, N runs in all), the mean of the runs it gives arm a minus the mean of those it gives arm
    b, per pair (a, b). Each arm's runs are summed in sorted order, so two permutations that give every
    arm the same runs, in any order, give bit-identical differences."""
    pool = np.concatenate([np.asarray(b, dtype=float) for b in blocks])
    starts = np.concatenate([[0], np.cumsum([len(b) for b in blocks])])
    permuted = pool[perms]  # (P, N): the run that lands in each position
    means = []
    for a in range(len(blocks)):
        runs = np.sort(permuted[:, starts[a]:starts[a + 1]], axis=1)
        total = runs[:, 0].copy()
        for t in range(1, runs.shape[1]):
            total += runs[:, t]
        means.append(total / runs.shape[1])
    return np.stack([means[a] - means[b] for a, b in pairs])


TIE_RELATIVE = 2.0 ** -20
"""The tie tolerance per stage, relative to the largest final in magnitude (:func:`tie_tolerance`)."""


def tie_tolerance(scale: float, stages: int) -> float:
    """How far apart two statistics of ``stages`` stages may lie and still be equal in exact arithmetic,
    for finals at most ``scale`` in magnitude.

    A statistic is a sum over the stages of a difference of two means of finals. A final stored as
    float32 is off its exact value by at most 2^-24 of ``scale``, so each stage's difference by at most
    2 x 2^-24 x ``scale``, a statistic by ``stages`` times that, and two statistics equal in exact
    arithmetic lie within 4 x 2^-24 x ``stages`` x ``scale`` (float64's own rounding is some 10^9 times
    smaller). The tolerance is four times that: 2^-20 x ``stages`` x ``scale``, about 1e-6 of the data's
    scale a stage, tens of times the gaps seen in practice. Statistics that differ in exact arithmetic
    differ by at least one k/N step over a stage's n seeds, 1/(N n) of a fraction: the tolerance stays
    ten times below that while N x n x stages is under about 100,000 (e.g. 1,250 problems x 4 samples,
    5 seeds a stage, 4 stages). It scales with the data, so fractions and percent tie alike."""
    return TIE_RELATIVE * stages * scale


def tie_to_observed(signed: np.ndarray, observed: list[float], tolerance: float) -> None:
    """In place: every value of ``signed`` (pairs, P) whose magnitude lies within ``tolerance`` of an
    ``observed`` statistic's magnitude (any pair's: AdaStop reads every pair against the maximum over the
    pairs) becomes, with its own sign, the largest observed magnitude it ties, so it counts as at least as
    extreme as each of them whatever the rounding of the two expressions. Observed magnitudes within
    ``tolerance`` of each other tie among themselves. Every other value is left as it is."""
    groups: list[list[float]] = []  # [smallest, largest] observed magnitude of each run of ties
    for t in np.sort(np.abs(np.asarray(observed, dtype=float))):
        if groups and t - groups[-1][1] <= tolerance:
            groups[-1][1] = t
        else:
            groups.append([t, t])
    magnitude = np.abs(signed)
    for low, high in groups:
        near = (magnitude >= low - tolerance) & (magnitude <= high + tolerance)
        signed[near] = np.copysign(high, signed[near])


def random_permutations(rng: np.random.RandomState, count: int, size: int) -> np.ndarray:
    """(count, size): the identity, then ``count - 1`` uniformly random permutations of ``size`` positions."""
    draws = np.argsort(rng.random_sample((max(count - 1, 0), size)), axis=1, kind="stable")
    return np.vstack([np.arange(size)[None], draws])


class JointPermutationComparator(MultipleAgentsComparator):
    """AdaStop's comparator with the joint, two-sided permutation distribution of the module doc. Give it
    the family-wise ``alpha`` itself, and ``comparisons`` as (i, j) tuples (:func:`as_pairs`)."""

    def compute_mean_diffs(self, k, Z):
        keys = [str(c) for c in self.current_comparisons]  # AdaStop's own keys for the pairs
        comps = [(int(c[0]), int(c[1])) for c in self.current_comparisons]
        arms = sorted({a for c in comps for a in c})
        local = {a: i for i, a in enumerate(arms)}
        n = {a: int(self.n[a]) for a in arms}
        blocks = [np.asarray(Z[a], dtype=float)[k * n[a]:(k + 1) * n[a]] for a in arms]
        pairs = [(local[a], local[b]) for a, b in comps]
        size = sum(n.values())
        if k == 0:
            perms = random_permutations(self.rng, self.B, size)
            self.normalization = self.B
            before = np.zeros((len(pairs), self.B))
        else:
            before = np.stack([self._signed[key] for key in keys])
            # what an earlier stage did not reject; a value tied with its boundary (k/N finals) was not rejected
            kept = np.max(np.abs(before), axis=0) <= self.boundary[-1][1] + self._tolerance
            before = before[:, kept]
            perms = random_permutations(self.rng, before.shape[1], size)
        signed = before + block_differences(blocks, pairs, perms)
        observed = [(k + 1) * (np.mean(np.asarray(Z[a])[:(k + 1) * n[a]]) - np.mean(np.asarray(Z[b])[:(k + 1) * n[b]]))
                    for a, b in comps]  # AdaStop's own expression of the observed statistic
        scale = max(float(np.max(np.abs(np.asarray(Z[a], dtype=float)[:(k + 1) * n[a]]))) for a in arms)
        self._tolerance = tie_tolerance(scale, k + 1)
        tie_to_observed(signed, observed, self._tolerance)
        self._signed = {key: signed[i] for i, key in enumerate(keys)}
        self.mean_diffs = {key: np.abs(signed[i]) for i, key in enumerate(keys)}
        return self.mean_diffs


def as_pairs(pairs: list[tuple[int, int]]) -> np.ndarray:
    """The comparisons as a 1-D array of (i, j) tuples: AdaStop keys every pair by ``str(row)`` many times
    a stage, and a tuple's str() is much cheaper than a numpy row's."""
    out = np.empty(len(pairs), dtype=object)
    for i, (a, b) in enumerate(pairs):
        out[i] = (int(a), int(b))
    return out
