"""Grading one response against one gold answer with math-verify: the reward's rule, no process pool.

See :mod:`exgrpo.rewards.math_reward` for the protocol and the safety model (the pool that calls
:func:`score_item` in worker processes).
"""

from __future__ import annotations

import enum
import importlib.metadata
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Final

from exgrpo.config.options import AnswerFormat
from exgrpo.rewards.extraction import DEFAULT_MAX_ANSWER_CHARS, extract_answer, sanitize

logger = logging.getLogger(__name__)

#: Name recorded with every score produced by this module.
GRADER_NAME: Final[str] = "math-verify"
_DIST_NAME: Final[str] = "math-verify"

#: Upper bound on (gold, prediction) candidate pairs compared by ``verify``;
#: math-verify's ``parse`` returns at most a sympy object and a string fallback.
MAX_VERIFY_PAIRS: Final[int] = 4


def grader_version() -> str:
    """Installed math-verify version (``importlib.metadata``), or ``"unknown"``."""
    try:
        return importlib.metadata.version(_DIST_NAME)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class RewardStatus(str, enum.Enum):
    """Outcome of grading one response. Only :attr:`CORRECT` earns reward 1."""

    CORRECT = "correct"
    WRONG = "wrong"
    NO_ANSWER = "no_answer"  # nothing extractable / parseable in the response
    BAD_GOLD = "bad_gold"  # the gold string itself did not parse (data bug)
    TIMEOUT = "timeout"  # math-verify's own timeout or the outer deadline fired
    ERROR = "error"  # exception in the grader, or the worker process died

    @property
    def reward(self) -> float:
        """Binary reward for this status."""
        return 1.0 if self is RewardStatus.CORRECT else 0.0


@dataclass(frozen=True)
class RewardBatch:
    """Rewards for one :meth:`MathVerifier.score` call, aligned with its inputs."""

    rewards: list[float]
    statuses: list[RewardStatus]
    n_timeout: int
    n_error: int
    elapsed_s: float = 0.0

    @classmethod
    def from_statuses(cls, statuses: Sequence[RewardStatus], elapsed_s: float = 0.0) -> RewardBatch:
        """Build a batch from per-item statuses (rewards and counts derived)."""
        sts = list(statuses)
        return cls(
            rewards=[s.reward for s in sts],
            statuses=sts,
            n_timeout=sum(s is RewardStatus.TIMEOUT for s in sts),
            n_error=sum(s is RewardStatus.ERROR for s in sts),
            elapsed_s=elapsed_s,
        )

    def __len__(self) -> int:
        return len(self.rewards)

    @property
    def mean(self) -> float:
        """Mean reward (0.0 for an empty batch)."""
        return sum(self.rewards) / len(self.rewards) if self.rewards else 0.0

    def counts(self) -> dict[str, int]:
        """Number of items per :class:`RewardStatus` value (all keys present)."""
        out = {s.value: 0 for s in RewardStatus}
        for s in self.statuses:
            out[s.value] += 1
        return out


# --------------------------------------------------------------------------- #
# Per-item grading (runs in a worker process, or in-process on the main thread)
# --------------------------------------------------------------------------- #


def build_prediction(
    response: str | None,
    answer_format: AnswerFormat = AnswerFormat.BOXED,
    max_answer_chars: int | None = DEFAULT_MAX_ANSWER_CHARS,
) -> str | None:
    """The string handed to math-verify's ``parse``: ``"\\boxed{" + answer + "}"``, or None.

    The answer comes from :func:`~exgrpo.rewards.extraction.extract_answer` (strict by default);
    None (nothing to grade: reward 0) when it finds no answer. The raw response is never handed
    to math-verify, whose own extraction would find numbers in noise.
    """
    if not response:
        return None
    answer = extract_answer(sanitize(response), answer_format, max_answer_chars)
    return None if answer is None else "\\boxed{" + answer + "}"


@lru_cache(maxsize=4096)
def _parse_gold(gold: str, parse_timeout: int) -> tuple[Any, ...]:
    """Parse ``"$" + gold + "$"`` once per (gold, timeout); exceptions propagate."""
    from math_verify import parse

    return tuple(parse("$" + gold + "$", parsing_timeout=parse_timeout, raise_on_error=True))


def score_item(prediction: str | None, gold: str, parse_timeout: int, verify_timeout: int) -> str:
    """Grade one prediction against one gold; returns a :class:`RewardStatus` value.

    Must run on a main thread (math-verify uses ``signal.alarm``). Never
    raises for exceptions from the grader: they map to ``"timeout"`` or
    ``"error"``. Returns a plain ``str`` so results pickle trivially.
    """
    from math_verify import parse, verify
    from math_verify.errors import TimeoutException

    if prediction is None:
        return RewardStatus.NO_ANSWER.value
    try:
        golds = _parse_gold(gold, parse_timeout)
    except TimeoutException:
        return RewardStatus.TIMEOUT.value
    except Exception:  # noqa: BLE001 - any grader failure is a scored outcome
        logger.debug("gold parse failed for %r", gold[:200], exc_info=True)
        return RewardStatus.BAD_GOLD.value
    if not golds:
        return RewardStatus.BAD_GOLD.value
    try:
        preds = parse(prediction, parsing_timeout=parse_timeout, raise_on_error=True)
    except TimeoutException:
        return RewardStatus.TIMEOUT.value
    except Exception:  # noqa: BLE001
        return RewardStatus.ERROR.value
    if not preds:
        return RewardStatus.NO_ANSWER.value

    # Same semantics as verify(golds, preds) (true if any pair matches), but
    # pair by pair so timeouts and errors can be counted instead of swallowed.
    timed_out = errored = False
    pairs = [(g, p) for g in golds for p in preds][:MAX_VERIFY_PAIRS]
    for g, p in pairs:
        try:
            if verify(g, p, timeout_seconds=verify_timeout, raise_on_error=True):
                return RewardStatus.CORRECT.value
        except TimeoutException:
            timed_out = True
        except Exception:  # noqa: BLE001
            errored = True
    if timed_out:
        return RewardStatus.TIMEOUT.value
    if errored:
        return RewardStatus.ERROR.value
    return RewardStatus.WRONG.value


def _worker_init(ready_queue: Any, memory_limit_mb: int | None) -> None:
    """Pool initializer: cap memory, import math-verify once, report readiness."""
    if memory_limit_mb:
        try:
            import resource

            limit = int(memory_limit_mb) * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        except (ImportError, ValueError, OSError):  # not on this platform / not allowed
            pass
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # timeouts are counted, not logged
    import math_verify  # noqa: F401  (warm import: ~0.5 s, paid once per worker)

    ready_queue.put(os.getpid())
