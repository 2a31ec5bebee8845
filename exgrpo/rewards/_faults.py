"""Fault-injecting item graders for tests of :class:`~exgrpo.rewards.MathVerifier`.

They live in the package (not in a test module) so that ``spawn`` workers can
unpickle them by reference whatever pytest's import mode is. A gold of
:data:`HANG` blocks forever without any ``signal.alarm`` (a stand-in for a
C-level hang math-verify's own timeouts cannot interrupt); :data:`CRASH`
kills the worker process; :data:`STRAY_ALARM` leaves a raising ``SIGALRM`` handler installed and
an alarm armed, as math-verify's timeout wrapper does when its own alarm fires inside its
``finally`` (the handler is then never restored). Any other gold is graded normally.
"""

from __future__ import annotations

import os
import signal
import time

from exgrpo.rewards.math_reward import score_item

HANG = "__EXGRPO_TEST_HANG__"
CRASH = "__EXGRPO_TEST_CRASH__"
STRAY_ALARM = "__EXGRPO_TEST_STRAY_ALARM__"


class StrayAlarm(BaseException):
    """Raised by the handler that :data:`STRAY_ALARM` leaves behind."""


def _raise_stray(signum, frame):  # noqa: ANN001
    raise StrayAlarm("a grader's SIGALRM fired outside grading")


def faulty_score_item(prediction: str | None, gold: str, parse_timeout: int, verify_timeout: int) -> str:
    """Like :func:`~exgrpo.rewards.math_reward.score_item`, with injected faults."""
    if gold == HANG:
        while True:  # uninterruptible by math-verify: no alarm is armed here
            time.sleep(3600)
    if gold == CRASH:
        os._exit(13)
    if gold == STRAY_ALARM:
        signal.signal(signal.SIGALRM, _raise_stray)
        signal.alarm(1)
        return "wrong"
    return score_item(prediction, gold, parse_timeout, verify_timeout)
