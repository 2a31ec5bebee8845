"""Verifiable rewards for RL on reasoning tasks.

Public API:

* :func:`extract_answer` / :func:`extract_boxed` / :func:`extract_last_number`
  -- pure answer extraction from a model response.
* :class:`MathVerifier` -- batch binary math reward graded by math-verify in a
  ``spawn`` process pool (or in-process with ``workers=0``).
* :class:`RewardBatch`, :class:`RewardStatus` -- results of a scoring call.
"""

from exgrpo.rewards.extraction import extract_answer, extract_boxed, extract_last_number
from exgrpo.rewards.math_reward import (
    GRADER_NAME,
    MathVerifier,
    RewardBatch,
    RewardStatus,
    build_prediction,
    grader_version,
)

__all__ = [
    "GRADER_NAME",
    "MathVerifier",
    "RewardBatch",
    "RewardStatus",
    "build_prediction",
    "extract_answer",
    "extract_boxed",
    "extract_last_number",
    "grader_version",
]
