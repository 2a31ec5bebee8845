import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exgrpo.config import BucketWeighting
from exgrpo.core.pool import ExperiencePool, Trajectory
from exgrpo.core.sampler import WEIGHTINGS, allocate_counts, bucket_probabilities, sample_questions


def test_normal_bucket_probabilities_k8_sigma1():
    p = bucket_probabilities(range(1, 8), group_size=8, weighting=BucketWeighting.NORMAL, sigma=1.0)
    expected = {4: 0.399, 3: 0.242, 5: 0.242, 2: 0.054, 6: 0.054, 1: 0.0044, 7: 0.0044}
    for k, prob in zip(range(1, 8), p, strict=True):
        assert prob == pytest.approx(expected[k], abs=5e-4)
    assert p.sum() == pytest.approx(1.0)


def test_normal_center_moves_the_peak_and_the_config_bounds_it():
    from exgrpo.config import ConfigError, load_experiment

    p = bucket_probabilities(range(1, 8), group_size=8, weighting=BucketWeighting.NORMAL, sigma=1.0, center=6.0)
    assert int(np.argmax(p)) + 1 == 6
    assert p[4] == pytest.approx(p[6]) and p[3] == pytest.approx(p[5] * np.exp(-2.0))
    assert np.allclose(bucket_probabilities(range(1, 8), 8, BucketWeighting.NORMAL, 1.0, center=4.0),
                       bucket_probabilities(range(1, 8), 8, BucketWeighting.NORMAL, 1.0))
    with pytest.raises(ConfigError, match="bucket_center=9.0 exceeds group_size"):
        load_experiment(None, {"algorithm.replay": "buckets", "algorithm.bucket_center": 9})


def test_other_weightings_exact():
    k = np.array([1, 2, 4, 6])
    assert np.allclose(WEIGHTINGS[BucketWeighting.LINEAR](k, 8, 1.0, None), k / 8)
    assert np.allclose(WEIGHTINGS[BucketWeighting.SQRT](k, 8, 1.0, None), np.sqrt(k / 8))
    assert np.allclose(WEIGHTINGS[BucketWeighting.LINEAR_CLIP](k, 8, 1.0, None), [1 / 8, 2 / 8, 4 / 8, 0.5])
    assert np.allclose(bucket_probabilities([1, 5], 8, BucketWeighting.UNIFORM), [0.5, 0.5])
    assert set(WEIGHTINGS) == set(BucketWeighting)


def test_mass_is_per_bucket_not_per_question():
    rng = np.random.default_rng(0)
    buckets = {4: [1], 3: list(range(100, 1100))}
    hits = sum(1 in sample_questions(buckets, 1, 8, rng) for _ in range(4000))
    # p(bucket 4) = 0.399 / (0.399 + 0.242) = 0.6225 whatever the bucket sizes
    assert hits / 4000 == pytest.approx(0.6225, abs=0.03)


def test_overflow_is_redistributed():
    rng = np.random.default_rng(1)
    counts = allocate_counts(10, np.array([0.98, 0.01, 0.01]), np.array([2, 5, 5]), rng)
    assert counts.sum() == 10 and counts[0] == 2 and (counts <= [2, 5, 5]).all()


bucket_maps = st.dictionaries(
    st.integers(1, 15), st.lists(st.integers(0, 10_000), min_size=0, max_size=30, unique=True), max_size=15
)


@settings(max_examples=200, deadline=None)
@given(buckets=bucket_maps, n=st.integers(0, 80), seed=st.integers(0, 2**32 - 1),
       weighting=st.sampled_from(list(BucketWeighting)))
def test_sampler_properties(buckets, n, seed, weighting):
    # a question lives in one bucket only
    seen, clean = set(), {}
    for k, qs in buckets.items():
        clean[k] = [q for q in qs if q not in seen]
        seen.update(qs)
    total = sum(len(v) for v in clean.values())
    out = sample_questions(clean, n, 16, np.random.default_rng(seed), weighting, 1.0)
    assert len(out) == min(n, total)  # exact counts
    assert len(set(out)) == len(out)  # no duplicates
    assert set(out) <= seen


@settings(max_examples=100, deadline=None)
@given(groups=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 8)), min_size=1, max_size=120),
       seed=st.integers(0, 1000))
def test_retired_questions_are_never_drawn(groups, seed):
    pool = ExperiencePool(group_size=8)
    for step, (q, k) in enumerate(groups):
        trajs = [Trajectory((q, step), (-0.1, -0.2), 0.5, step)] if k else []
        pool.observe_group(q, k, trajs, step)
    out = sample_questions(pool.buckets(), 100, 8, np.random.default_rng(seed))
    assert not (set(out) & pool.retired)
    assert len(out) == len(pool)
