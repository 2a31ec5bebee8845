"""Evaluation metrics over sampled completions: avg@k and unbiased pass@k.

Conventions:

* ``correct`` is a ``[n_problems, n_samples]`` array of per-sample 0/1 (or
  bool) rewards for the ``n_samples`` completions drawn per problem.
* **avg@k** is the mean accuracy over all ``k = n_samples`` samples of all
  problems (mean over problems of the per-problem mean).
* **pass@k** is the unbiased estimator of Chen et al. (2021), "Evaluating
  Large Language Models Trained on Code": with ``n`` samples of which ``c``
  are correct, ``pass@k = 1 - C(n-c, k) / C(n, k)``, computed in the stable
  product form ``1 - prod_{i=n-c+1}^{n} (1 - k/i)``.

Metric names are MLflow-safe (``avg_at_4``, ``pass_at_1``; never ``@``),
built with :func:`metric_name`.
"""

from __future__ import annotations

import enum
import re
from dataclasses import asdict, dataclass
from typing import Any, Final

import numpy as np
from numpy.typing import ArrayLike

__all__ = [
    "MetricKind",
    "Score",
    "avg_at_k",
    "metric_name",
    "pass_at_k",
    "pass_at_k_matrix",
]

#: Characters MLflow accepts in metric/param keys (alphanumerics, ``_ - . / `` and space).
_MLFLOW_SAFE: Final = re.compile(r"^[A-Za-z0-9_\-./ ]+$")


class MetricKind(str, enum.Enum):
    """Metric families; the value is the prefix of the metric name."""

    AVG = "avg"
    PASS = "pass"


def metric_name(kind: MetricKind | str, k: int) -> str:
    """MLflow-safe metric name, e.g. ``metric_name(MetricKind.AVG, 4) == "avg_at_4"``."""
    kind = MetricKind(kind)
    if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 1:
        raise ValueError(f"metric_name: k must be an int >= 1, got {k!r}")
    return f"{kind.value}_at_{int(k)}"


def _as_correct_matrix(correct: ArrayLike, fn: str) -> np.ndarray:
    arr = np.asarray(correct)
    if arr.ndim != 2:
        raise ValueError(
            f"{fn}: correct must be a 2-D array [n_problems, n_samples], got shape {arr.shape}; "
            "for one sample per problem use correct[:, None]"
        )
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"{fn}: correct must be non-empty, got shape {arr.shape}")
    if arr.dtype == bool:
        return arr.astype(np.float64)
    if not np.issubdtype(arr.dtype, np.number):
        raise TypeError(f"{fn}: correct must be numeric or bool, got dtype {arr.dtype}")
    arr = arr.astype(np.float64)
    if not np.all(np.isin(arr, (0.0, 1.0))):
        raise ValueError(f"{fn}: correct must contain only 0/1 (or bool) values")
    return arr


def avg_at_k(correct: ArrayLike) -> float:
    """Mean accuracy over all samples: ``correct.mean()`` for a ``[P, k]`` 0/1 array.

    >>> avg_at_k([[1, 0, 1, 1], [0, 0, 0, 1]])
    0.5
    """
    return float(_as_correct_matrix(correct, "avg_at_k").mean())


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem with ``n`` samples, ``c`` of them correct.

    Equals ``1 - C(n-c, k) / C(n, k)``; returns 1.0 when ``n - c < k`` (every
    size-k subset contains a correct sample) and 0.0 when ``c == 0``.

    >>> pass_at_k(5, 2, 1), pass_at_k(5, 2, 3)
    (0.4, 0.9)
    """
    for name, val in (("n", n), ("c", c), ("k", k)):
        if not isinstance(val, (int, np.integer)) or isinstance(val, bool):
            raise TypeError(f"pass_at_k: {name} must be an int, got {type(val).__name__}")
    n, c, k = int(n), int(c), int(k)
    if n < 1:
        raise ValueError(f"pass_at_k: n (samples per problem) must be >= 1, got {n}")
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: c (correct samples) must be in [0, n={n}], got {c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k: k must be in [1, n={n}], got {k}; draw at least k samples per problem")
    if n - c < k:
        return 1.0
    if c == 0:
        return 0.0
    i = np.arange(n - c + 1, n + 1, dtype=np.float64)
    return float(1.0 - np.prod(1.0 - k / i))


def pass_at_k_matrix(correct: ArrayLike, k: int) -> float:
    """Mean over problems of :func:`pass_at_k` for a ``[P, n]`` 0/1 array."""
    arr = _as_correct_matrix(correct, "pass_at_k_matrix")
    n = arr.shape[1]
    counts = arr.sum(axis=1).astype(int)
    return float(np.mean([pass_at_k(n, int(c), k) for c in counts]))


@dataclass(frozen=True)
class EvalSettings:
    """How responses are sampled for evaluation (recorded beside every score)."""

    n: int = 1
    """Samples per problem (avg@n; pass@k for k in 1, 2, 4, ... <= n)."""
    temperature: float = 0.0
    """0 means greedy decoding."""
    top_p: float = 1.0
    """Nucleus mass when sampling."""
    max_tokens: int | None = None
    """Response budget; None: the policy's max_new_tokens."""
    seed: int = 0
    """Seed of the problem subset and of sampling."""


@dataclass(frozen=True)
class Score:
    """One reported evaluation number plus everything needed to reproduce it.

    ``metric`` must be MLflow-safe (e.g. ``"avg_at_4"``, see :func:`metric_name`).
    """

    benchmark: str
    metric: str
    value: float
    n_problems: int
    n_samples: int
    temperature: float
    top_p: float
    max_tokens: int
    template: str
    grader: str
    grader_version: str

    def __post_init__(self) -> None:
        for name in ("benchmark", "metric"):
            val = getattr(self, name)
            if not isinstance(val, str) or not _MLFLOW_SAFE.match(val):
                raise ValueError(
                    f"Score.{name}={val!r} is not MLflow-safe: use only letters, digits and '_-./ ' "
                    "(e.g. 'avg_at_4' instead of 'avg@4')"
                )
        if self.n_problems < 1 or self.n_samples < 1:
            raise ValueError(
                f"Score: n_problems and n_samples must be >= 1, got {self.n_problems} and {self.n_samples}"
            )
        if self.max_tokens < 1:
            raise ValueError(f"Score.max_tokens must be >= 1, got {self.max_tokens}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"Score.top_p must be in (0, 1], got {self.top_p}")
        if self.temperature < 0.0:
            raise ValueError(f"Score.temperature must be >= 0, got {self.temperature}")

    @property
    def key(self) -> str:
        """MLflow metric key ``"<benchmark>/<metric>"``, e.g. ``"gsm8k/avg_at_4"``."""
        return f"{self.benchmark}/{self.metric}"

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form (JSON/MLflow-param friendly)."""
        return asdict(self)


def scores_of(benchmark: str, correct: np.ndarray, settings: Any, max_tokens: int, template: str,
              grader: str, grader_version: str) -> list[Score]:
    """The scores of one benchmark from its ``correct`` matrix (problems x samples): avg@n and pass@k
    for k = 1, 2, 4, ... up to ``settings.n``, each with the sampling settings (``settings``: n,
    temperature, top_p) and the grader beside it. One table shape for every checkpoint and engine."""
    common = dict(benchmark=benchmark, n_problems=correct.shape[0], n_samples=correct.shape[1],
                  temperature=settings.temperature, top_p=settings.top_p, max_tokens=max_tokens,
                  template=template, grader=grader, grader_version=grader_version)
    scores = [Score(metric=metric_name(MetricKind.AVG, settings.n), value=avg_at_k(correct), **common)]
    k = 1
    while k <= settings.n:
        scores.append(Score(metric=metric_name(MetricKind.PASS, k), value=pass_at_k_matrix(correct, k), **common))
        k *= 2
    return scores
