"""Grading multiple-choice answers (ARC-Challenge, MMLU): the option letter a response commits to.

A response earns 1 only when it names exactly one option letter as its answer and that letter is
the gold one. Where the letter must be, strict as the math reward is:

- the last complete ``\\boxed{...}`` holding one letter, optionally in parentheses or followed by
  a period or the option's text (``\\boxed{B}``, ``\\boxed{(B)}``, ``\\boxed{B. Paris}``);
- without a box, an explicit final statement: ``Answer: B``, ``The answer is (B)``, ``answer is B.``
  (the last one in the response).

A bare letter elsewhere, several letters (``\\boxed{A, B}``), a letter that is not one of the
problem's options, or an empty box all score 0 (:attr:`RewardStatus.NO_ANSWER`), so listing the
options or hedging earns nothing.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from typing import Final

from exgrpo.rewards.extraction import boxed_answers, sanitize
from exgrpo.rewards.grading import RewardBatch, RewardStatus

GRADER_NAME: Final[str] = "letter-choice"
GRADER_VERSION: Final[str] = "1"

_IN_BOX: Final = re.compile(r"^\(?([A-Z])\)?(?:[.:)]?(?:\s+.*)?)?$", re.DOTALL)
_STATED: Final = re.compile(r"(?i:\b(?:the\s+)?answer\s*(?:is|:))\s*:?\s*\(?([A-Z])\)?(?=[\s.,;!)]|$)")


def extract_choice(response: str | None, labels: Sequence[str] = "ABCD") -> str | None:
    """The option letter ``response`` gives as its answer (see the module doc), or None."""
    if not response:
        return None
    text = sanitize(response)
    boxes = boxed_answers(text)
    if boxes:
        m = _IN_BOX.match(boxes[-1].strip())
        letter = m.group(1) if m else None
    else:
        stated = [m.group(1) for m in _STATED.finditer(text)]
        letter = stated[-1] if stated else None
    return letter if letter is not None and letter in labels else None


class LetterGrader:
    """Scores responses against gold option letters (same ``score`` shape as :class:`MathVerifier`)."""

    grader_name = GRADER_NAME
    grader_version = GRADER_VERSION

    def score(self, responses: Sequence[str | None], golds: Sequence[str],
              labels: Sequence[Sequence[str]] | None = None) -> RewardBatch:
        """``labels[i]``: the option letters of problem i (default A-D)."""
        t0 = time.perf_counter()
        statuses = []
        for i, (response, gold) in enumerate(zip(responses, golds, strict=True)):
            options = labels[i] if labels is not None else "ABCD"
            if str(gold).strip() not in options:
                statuses.append(RewardStatus.BAD_GOLD)
                continue
            letter = extract_choice(response, options)
            if letter is None:
                statuses.append(RewardStatus.NO_ANSWER)
            else:
                statuses.append(RewardStatus.CORRECT if letter == str(gold).strip() else RewardStatus.WRONG)
        return RewardBatch.from_statuses(statuses, time.perf_counter() - t0)


__all__ = ["GRADER_NAME", "GRADER_VERSION", "LetterGrader", "extract_choice"]
