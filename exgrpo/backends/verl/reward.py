"""veRL's custom reward function (``reward.custom_reward_function.path``): the task's own grader."""

from __future__ import annotations

from typing import Any

from exgrpo.backends.verl.assets import DATA_SOURCE
from exgrpo.config.options import AnswerFormat
from exgrpo.rewards.extraction import DEFAULT_MAX_ANSWER_CHARS, after_think
from exgrpo.rewards.math_reward import MathVerifier


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: Any = None,
    answer_format: str = "boxed",
    max_answer_chars: int = DEFAULT_MAX_ANSWER_CHARS,
    require_think: bool = False,
    **kwargs: Any,
) -> float:
    """1.0 when the response's graded answer equals the gold answer, else 0.

    Our task's rows use the tiny-lm rule (one boxed integer); others are graded by math-verify, with
    ``require_think`` only what follows ``</think>`` (0 without it), as the native file task grades.
    ``answer_format``, ``max_answer_chars`` and ``require_think`` come from the task config (``reward_kwargs``).
    """
    if require_think:
        solution_str = after_think(solution_str)
        if solution_str is None:
            return 0.0
    if data_source == DATA_SOURCE:
        from exgrpo.tasks.text_arithmetic import extract_final_integer  # torch: only for this task's rows

        return float(extract_final_integer(solution_str, AnswerFormat(answer_format), max_answer_chars) == int(ground_truth))
    return float(_math_verifier(answer_format, max_answer_chars).score_one(solution_str, ground_truth))


_VERIFIERS: dict[tuple[str, int], Any] = {}


def _math_verifier(answer_format: str, max_answer_chars: int):
    """One math-verify grader per process and setting (its worker pool is reused across calls)."""
    key = (answer_format, max_answer_chars)
    if key not in _VERIFIERS:
        _VERIFIERS[key] = MathVerifier(answer_format=answer_format, max_answer_chars=max_answer_chars)
    return _VERIFIERS[key]
