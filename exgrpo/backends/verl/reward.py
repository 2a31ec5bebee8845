"""veRL's custom reward function (``reward.custom_reward_function.path``): the task's own grader."""

from __future__ import annotations

from typing import Any

from exgrpo.backends.verl.assets import DATA_SOURCE


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None, **kwargs: Any) -> float:
    """1.0 when the response's final integer equals the gold answer (the tiny-lm tier's rule), else 0."""
    if data_source == DATA_SOURCE:
        from exgrpo.tasks.text_arithmetic import extract_final_integer

        return float(extract_final_integer(solution_str) == int(ground_truth))
    return float(_math_verifier().score_one(solution_str, ground_truth))


_VERIFIER = None


def _math_verifier():
    """One math-verify grader per process (its worker pool is reused across calls)."""
    global _VERIFIER
    if _VERIFIER is None:
        from exgrpo.rewards.math_reward import MathVerifier

        _VERIFIER = MathVerifier()
    return _VERIFIER
