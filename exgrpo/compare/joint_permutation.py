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
* **exact ties**: permuted statistics are summed in sorted order, so permutations that give each arm the
  same runs give bit-identical values, and those equal to the observed point (or its mirror) are set to
  the observed statistic as AdaStop computes it, so a tie counts as at least as extreme.

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


def tie_to_observed(signed: np.ndarray, observed: list[float]) -> None:
    """In place: every value of a row of ``signed`` (pairs, P) bit-equal to its identity point (column 0)
    becomes that pair's ``observed`` statistic, and every value equal to its negative becomes minus it,
    so exact ties with the observed point stay ties whatever the rounding of the two expressions."""
    for row, t in zip(signed, observed, strict=True):
        identity = row[0]
        same = row == identity
        mirror = (row == -identity) & ~same
        row[same] = t
        row[mirror] = -t


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
            kept = np.max(np.abs(before), axis=0) <= self.boundary[-1][1]  # what an earlier stage did not reject
            before = before[:, kept]
            perms = random_permutations(self.rng, before.shape[1], size)
        signed = before + block_differences(blocks, pairs, perms)
        observed = [(k + 1) * (np.mean(np.asarray(Z[a])[:(k + 1) * n[a]]) - np.mean(np.asarray(Z[b])[:(k + 1) * n[b]]))
                    for a, b in comps]  # AdaStop's own expression of the observed statistic
        tie_to_observed(signed, observed)
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
