"""Pure-Python answer extraction from model responses (no math-verify import).

Every reward in the project first pulls the final answer out of a free-form response with
:func:`extract_answer`. The rule is strict by default (:attr:`AnswerFormat.BOXED`), because an RL
policy finds every hole a lenient rule leaves:

1. the answer is the content of the ``\\boxed{...}`` (or ``\\fbox{...}``) boxes, found with a
   brace-balancing scan (escaped ``\\{`` / ``\\}`` do not count; an unterminated box is ignored);
2. several boxes must agree: two distinct boxed answers (hedging) give no answer;
3. a box inside the answer (``\\boxed{\\boxed{5}}``) gives no answer;
4. an answer longer than ``max_answer_chars`` gives no answer: it is never cut into a shorter,
   different expression;
5. an answer with non-ASCII digits (``４２``, ``٤٢``, ``𝟒𝟐``, superscripts) gives no answer;
6. an empty box gives no answer.

With :attr:`AnswerFormat.BOXED_OR_LAST_NUMBER` (a task opts in, and a warning is logged) a
response with no box at all falls back to its last ASCII number; that fallback scores text that
merely ends in the gold number, so it is off unless asked for.

Everything here is linear in the input length and never raises on ``str`` input, so it is safe
to run on hostile text before any timeout is in place.
"""

from __future__ import annotations

import logging
import re
from typing import Final

from exgrpo.config.options import DEFAULT_MAX_ANSWER_CHARS, AnswerFormat

logger = logging.getLogger(__name__)

__all__ = [
    "BOXED_COMMANDS",
    "DEFAULT_MAX_ANSWER_CHARS",
    "AnswerFormat",
    "boxed_answers",
    "extract_answer",
    "extract_boxed",
    "extract_last_number",
    "sanitize",
    "warn_if_lenient",
]


#: LaTeX commands whose braced argument counts as "the boxed answer".
BOXED_COMMANDS: Final[tuple[str, ...]] = ("\\boxed", "\\fbox")

_BOXED_RE: Final = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")

# A number: optional sign (only when not glued to a preceding word/digit/closing
# bracket, so "5-3" yields "3", not "-3"), digits with optional thousands groups,
# optional decimals, optional "/denominator".
_NUMBER_RE: Final = re.compile(
    r"(?:(?<![\w)\]}])-)?[0-9]+(?:,[0-9]{3})*(?:\.[0-9]+)?(?:/[0-9]+)?"
)


def after_think(text: str) -> str | None:
    """What a ``require_think`` grader grades: the text after the first ``</think>``, None without one
    (graded 0), as the reference's ``reward_fn_math_verify`` (version 3) does."""
    _, sep, tail = text.partition("</think>")
    return tail if sep else None


def sanitize(text: str) -> str:
    """Remove characters that break LaTeX/sympy parsers but carry no meaning.

    Currently this strips NUL bytes (``"\\x00"``) only; everything else,
    including odd unicode, is left to the grader, which must cope with it.
    """
    return text.replace("\x00", "") if "\x00" in text else text


def _closing_braces(text: str) -> dict[int, int]:
    """Map the index of every balanced ``{`` to the index of its ``}``.

    One linear pass with a stack, so many unterminated ``\\boxed{`` in a
    hostile input cannot make extraction quadratic. Escaped braces
    (``\\{`` and ``\\}``) are literal characters and are skipped.
    """
    pairs: dict[int, int] = {}
    stack: list[int] = []
    i = 0
    n = len(text)
    while i < n:
        ch = text[i]
        if ch == "\\":
            i += 2  # skip the escaped character, whatever it is
            continue
        if ch == "{":
            stack.append(i)
        elif ch == "}" and stack:
            pairs[stack.pop()] = i
        i += 1
    return pairs


def boxed_answers(text: str) -> list[str]:
    """The stripped contents of every *complete* ``\\boxed{...}`` / ``\\fbox{...}`` in ``text``, in order.

    Nested braces are balanced (``\\boxed{\\frac{1}{2}}`` -> ``\\frac{1}{2}``); an unterminated
    ``\\boxed{`` (a generation cut off by the token limit) is skipped. The scan is linear in
    ``len(text)``.
    """
    starts = [m.end() for m in _BOXED_RE.finditer(text)]
    if not starts:
        return []
    pairs = _closing_braces(text)
    out = []
    for end in starts:
        j = end
        while j < len(text) and text[j] in " \t":
            j += 1
        close = pairs.get(j)
        if close is not None:
            out.append(text[j + 1 : close].strip())
    return out


def extract_boxed(text: str) -> str | None:
    """The content of the last complete box in ``text`` (``""`` for ``\\boxed{}``), None if none.

    This is the raw last-box rule with none of the strict checks of :func:`extract_answer`.
    """
    boxes = boxed_answers(text)
    return boxes[-1] if boxes else None


def extract_last_number(text: str) -> str | None:
    """Return the last number in ``text`` with thousands separators removed.

    >>> extract_last_number("3 apples, then 1,250.5 pears and 7/8 of a pie.")
    '7/8'
    """
    last = None
    for match in _NUMBER_RE.finditer(text):
        last = match
    if last is None:
        return None
    return last.group(0).replace(",", "")


def _has_foreign_digits(answer: str) -> bool:
    """True if ``answer`` has a digit-like character outside ASCII (fullwidth, Arabic-Indic, ...)."""
    return any(not ch.isascii() and (ch.isdigit() or ch.isnumeric()) for ch in answer)


def extract_answer(
    text: str,
    answer_format: AnswerFormat = AnswerFormat.BOXED,
    max_answer_chars: int | None = DEFAULT_MAX_ANSWER_CHARS,
) -> str | None:
    """The graded final answer of ``text`` by the strict rule in the module docstring, or None.

    None means "no answer" (reward 0): no box (unless ``answer_format`` allows the last-number
    fallback), distinct boxed answers, a nested box, an empty box, an answer over
    ``max_answer_chars`` (None disables the limit) or non-ASCII digits.
    """
    boxes = boxed_answers(text)
    if boxes:
        answer = boxes[-1]
        if len(set(boxes)) > 1 or _BOXED_RE.search(answer):
            return None
    elif answer_format is AnswerFormat.BOXED_OR_LAST_NUMBER:
        answer = extract_last_number(text)
        if answer is None:
            return None
    else:
        return None
    if not answer or _has_foreign_digits(answer):
        return None
    if max_answer_chars is not None and len(answer) > max_answer_chars:
        return None
    return answer


def warn_if_lenient(answer_format: AnswerFormat, where: str) -> None:
    """Log a warning when ``where`` (a task or grader) grades with the gameable last-number fallback."""
    if AnswerFormat(answer_format) is AnswerFormat.BOXED_OR_LAST_NUMBER:
        logger.warning(
            "%s: answer_format=boxed_or_last_number grades the last number of an unboxed response; "
            "a policy can game it by ending its text in numbers (use 'boxed' for RL)", where
        )
