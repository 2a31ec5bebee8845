"""Tests for exgrpo.evaluation.metrics (avg@k, unbiased pass@k, Score)."""

from __future__ import annotations

import math
from dataclasses import FrozenInstanceError

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from exgrpo.evaluation.metrics import MetricKind, Score, avg_at_k, metric_name, pass_at_k, pass_at_k_matrix


def comb_pass_at_k(n: int, c: int, k: int) -> float:
    """Reference definition with exact binomials."""
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 2, 1, 0.4),
        (5, 2, 3, 0.9),
        (5, 0, 1, 0.0),
        (5, 0, 5, 0.0),
        (5, 5, 1, 1.0),
        (5, 3, 3, 1.0),  # n - c = 2 < k = 3
        (4, 1, 4, 1.0),
        (10, 1, 1, 0.1),
        (10, 5, 2, 1 - 10 / 45),
        (1, 1, 1, 1.0),
        (1, 0, 1, 0.0),
    ],
)
def test_pass_at_k_exact_values(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_short_circuits_are_exact() -> None:
    assert pass_at_k(5, 0, 3) == 0.0
    assert pass_at_k(5, 3, 3) == 1.0


@given(st.integers(1, 60).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_matches_binomial_definition(nck: tuple[int, int, int]) -> None:
    n, c, k = nck
    assert pass_at_k(n, c, k) == pytest.approx(comb_pass_at_k(n, c, k), abs=1e-9)


def test_pass_at_k_is_stable_for_large_n() -> None:
    # C(1000, 500) overflows float; the product form does not.
    v = pass_at_k(1000, 3, 500)
    assert v == pytest.approx(comb_pass_at_k(1000, 3, 500), abs=1e-12)
    assert 0.0 < v < 1.0


@pytest.mark.parametrize(
    ("args", "match"),
    [((0, 0, 1), "n "), ((5, 6, 1), "c "), ((5, -1, 1), "c "), ((5, 2, 0), "k "), ((5, 2, 6), "k ")],
)
def test_pass_at_k_rejects_bad_arguments(args: tuple[int, int, int], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        pass_at_k(*args)
    with pytest.raises(TypeError, match="k must be an int"):
        pass_at_k(5, 2, 1.0)  # type: ignore[arg-type]


def test_avg_at_k_values() -> None:
    assert avg_at_k(np.array([[1, 0, 1, 1], [0, 0, 0, 1]])) == 0.5
    assert avg_at_k(np.array([[True], [False], [True], [True]])) == 0.75
    assert avg_at_k(np.zeros((3, 4))) == 0.0
    assert avg_at_k([[1.0, 1.0]]) == 1.0


@pytest.mark.parametrize(
    ("arr", "exc", "match"),
    [
        (np.array([1, 0, 1]), ValueError, "2-D"),
        (np.zeros((0, 4)), ValueError, "non-empty"),
        (np.array([[0.5, 1.0]]), ValueError, "0/1"),
        (np.array([["a"]]), TypeError, "numeric"),
    ],
)
def test_avg_at_k_rejects_bad_input(arr: np.ndarray, exc: type[Exception], match: str) -> None:
    with pytest.raises(exc, match=match):
        avg_at_k(arr)


def test_pass_at_k_matrix() -> None:
    correct = np.array([[1, 1, 0, 0, 0], [0, 0, 0, 0, 0]])  # c = 2 and c = 0, n = 5
    assert pass_at_k_matrix(correct, 1) == pytest.approx((0.4 + 0.0) / 2)
    assert pass_at_k_matrix(correct, 3) == pytest.approx((0.9 + 0.0) / 2)
    # pass@1 equals avg@n.
    rng = np.random.default_rng(0)
    m = rng.integers(0, 2, size=(20, 8))
    assert pass_at_k_matrix(m, 1) == pytest.approx(avg_at_k(m))


def test_metric_names_are_mlflow_safe() -> None:
    assert metric_name(MetricKind.AVG, 4) == "avg_at_4"
    assert metric_name("pass", 1) == "pass_at_1"
    assert "@" not in metric_name(MetricKind.PASS, 16)
    with pytest.raises(ValueError):
        metric_name("best", 1)
    with pytest.raises(ValueError, match="k must be"):
        metric_name(MetricKind.AVG, 0)


def _score(**overrides: object) -> Score:
    kw: dict[str, object] = dict(
        benchmark="gsm8k",
        metric="avg_at_4",
        value=0.25,
        n_problems=64,
        n_samples=4,
        temperature=0.6,
        top_p=0.95,
        max_tokens=512,
        template="qwen_boxed",
        grader="math-verify",
        grader_version="0.9.0",
    )
    kw.update(overrides)
    return Score(**kw)  # type: ignore[arg-type]


def test_score_fields_key_and_dict() -> None:
    s = _score()
    assert s.key == "gsm8k/avg_at_4"
    d = s.to_dict()
    assert list(d) == [
        "benchmark", "metric", "value", "n_problems", "n_samples", "temperature",
        "top_p", "max_tokens", "template", "grader", "grader_version",
    ]  # fmt: skip
    with pytest.raises(FrozenInstanceError):
        s.value = 1.0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"metric": "avg@4"}, "metric.*MLflow-safe"),
        ({"benchmark": "gsm8k:64"}, "benchmark.*MLflow-safe"),
        ({"n_problems": 0}, "n_problems"),
        ({"top_p": 0.0}, "top_p"),
        ({"temperature": -1.0}, "temperature"),
        ({"max_tokens": 0}, "max_tokens"),
    ],
)
def test_score_validation_names_the_field(overrides: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _score(**overrides)
