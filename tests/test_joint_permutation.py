"""The joint permutation distribution's parts (exgrpo/compare/joint_permutation.py) on discrete finals:
k/N accuracies stored as float32, as a run's metric is, in fractions and in percent. Exact arithmetic
(integer counts, fractions) is the reference."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from exgrpo.compare.joint_permutation import block_differences, random_permutations, tie_to_observed, tie_tolerance

N = 30
"""Problems scored: a final is k/N."""


def _finals(counts, unit: float = 1.0) -> np.ndarray:
    """k/N in ``unit`` (1: fractions, 100: percent), rounded to float32 as a stored metric is."""
    return (unit * np.asarray(counts, dtype=float) / N).astype(np.float32).astype(float)


def _arm_sums(counts: np.ndarray, perms: np.ndarray, arms: int, n: int) -> np.ndarray:
    """(P, arms): the exact count total each arm gets under each permutation of the pooled ``counts``."""
    return counts[perms].reshape(len(perms), arms, n).sum(axis=2)


def test_block_differences_are_the_permuted_mean_differences_and_equal_runs_give_equal_values():
    rng = np.random.default_rng(0)
    arms, n, count = 3, 5, 300
    counts = rng.integers(0, N + 1, size=(arms, n))
    blocks = [_finals(c) for c in counts]
    pairs = [(1, 0), (2, 0)]
    perms = random_permutations(np.random.RandomState(0), count, arms * n)
    got = block_differences(blocks, pairs, perms)
    assert got.shape == (len(pairs), count)
    pool = np.concatenate(blocks)
    for p in range(count):
        runs = pool[perms[p]].reshape(arms, n)
        for i, (a, b) in enumerate(pairs):  # exact for the stored (float32) values: off by float64 rounding only
            exact = sum(map(Fraction, runs[a])) / n - sum(map(Fraction, runs[b])) / n
            assert abs(Fraction(float(got[i, p])) - exact) <= Fraction(1, 2 ** 50), (i, p)
    assert got[:, 0].tolist() == [np.mean(blocks[a]) - np.mean(blocks[b]) for a, b in pairs]  # the identity
    # the same runs to every arm, in another order, give bit-identical values
    reordered = np.concatenate([rng.permuted(perms[:, a * n:(a + 1) * n], axis=1) for a in range(arms)], axis=1)
    assert not np.array_equal(reordered, perms)
    assert np.array_equal(block_differences(blocks, pairs, reordered), got)


def test_random_permutations_start_with_the_identity_and_are_uniform_permutations():
    perms = random_permutations(np.random.RandomState(3), 2000, 10)
    assert perms.shape == (2000, 10) and perms[0].tolist() == list(range(10))
    assert (np.sort(perms, axis=1) == np.arange(10)).all()  # every row a permutation
    assert np.array_equal(perms, random_permutations(np.random.RandomState(3), 2000, 10))  # a replay draws the same
    assert random_permutations(np.random.RandomState(3), 1, 10).tolist() == [list(range(10))]
    # each position receives each run equally often (per position, a chi-square test at 1e-4 does not reject)
    assert min(stats.chisquare(np.bincount(perms[1:, j], minlength=10)).pvalue for j in range(10)) > 1e-4
    finals = _finals([3, 3, 7, 10, 0, 3, 7, 7, 1, 30])
    assert all(sorted(finals[p]) == sorted(finals) for p in perms)  # discrete finals: the runs are only moved
    assert len({tuple(finals[p]) for p in perms}) > 1000  # and moved: most rows hand the runs out anew


def test_the_tie_tolerance_lies_between_float32_rounding_and_one_step_of_the_finals():
    """Two stages of three arms with five runs each: permuted statistics equal in exact arithmetic lie
    within the tolerance of each other; unequal ones at least one k/N step (over n runs) apart."""
    rng = np.random.default_rng(1)
    arms, n, stages, count = 3, 5, 2, 4000
    counts = rng.integers(0, N + 1, size=(stages, arms, n))
    for unit in (1.0, 100.0):
        prng = np.random.RandomState(0)
        total = np.zeros((2, count))
        exact = np.zeros((2, count), dtype=int)
        for s in range(stages):
            perms = random_permutations(prng, count, arms * n)
            total += block_differences([_finals(c, unit) for c in counts[s]], [(1, 0), (2, 0)], perms)
            sums = _arm_sums(counts[s].ravel(), perms, arms, n)
            exact += np.stack([sums[:, 1] - sums[:, 0], sums[:, 2] - sums[:, 0]])
        tol = tie_tolerance(scale=unit * counts.max() / N, stages=stages)
        order = np.argsort(exact, axis=None)
        values, keys = total.ravel()[order], exact.ravel()[order]
        same = keys[1:] == keys[:-1]
        gaps = np.diff(values)
        assert same.any() and np.abs(gaps[same]).max() > 0  # rounding does split values equal in exact arithmetic
        assert np.abs(gaps[same]).max() < tol / 4  # within the tolerance by far
        step = unit / (n * N)
        assert tol < step / 1000 and gaps[~same].min() > step - tol  # far below one step


@pytest.mark.parametrize("unit", [1.0, 100.0], ids=["fractions", "percent"])
def test_values_tied_with_an_observed_statistic_become_it_and_the_rest_stay(unit):
    """Stage two of three arms against one baseline (3 runs each): every permuted value equal in exact
    arithmetic to a pair's observed statistic (its own or another pair's; either sign) counts as at least
    as extreme as it, whatever the rounding; every other value is left as it is."""
    rng = np.random.default_rng(5)
    arms, n, count = 3, 3, 3000
    counts = rng.integers(0, N + 1, size=(2, arms, n))
    pairs = [(1, 0), (2, 0)]
    prng = np.random.RandomState(0)
    signed = np.zeros((2, count))
    exact = np.zeros((2, count), dtype=int)
    for s in range(2):
        perms = random_permutations(prng, count, arms * n)
        signed += block_differences([_finals(c, unit) for c in counts[s]], pairs, perms)
        sums = _arm_sums(counts[s].ravel(), perms, arms, n)
        exact += np.stack([sums[:, a] - sums[:, b] for a, b in pairs])
    finals = [np.concatenate([_finals(counts[s, a], unit) for s in range(2)]) for a in range(arms)]
    observed = [2 * (np.mean(finals[a]) - np.mean(finals[b])) for a, b in pairs]  # as AdaStop computes it
    exact_observed = np.abs(exact[:, 0])
    raw = signed.copy()
    tie_to_observed(signed, observed, tie_tolerance(scale=max(np.abs(f).max() for f in finals), stages=2))
    tied = np.isin(np.abs(exact), exact_observed)
    assert tied.sum() > 100 and (~tied).sum() > 100
    assert (np.abs(exact[0]) == exact_observed[1]).any()  # a tie with the other pair's statistic
    for i, p in zip(*np.nonzero(tied), strict=True):
        ties = [abs(observed[j]) for j in range(2) if exact_observed[j] == abs(exact[i, p])]
        assert abs(signed[i, p]) >= max(ties), (i, p, signed[i, p], ties)  # at least as extreme as each
        assert abs(signed[i, p]) == max(ties), (i, p)
        assert exact[i, p] == 0 or np.sign(signed[i, p]) == np.sign(exact[i, p]), (i, p)
    assert np.array_equal(signed[~tied], raw[~tied])
