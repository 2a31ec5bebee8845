"""Pure-Python answer extraction from model responses (no math-verify import).

The reward protocol (see :mod:`exgrpo.rewards.math_reward`) first pulls a
candidate answer out of the free-form response with :func:`extract_answer`:

1. the content of the **last complete** ``\\boxed{...}`` (or ``\\fbox{...}``),
   found with a brace-balancing scan (escaped ``\\{`` / ``\\}`` do not count);
2. otherwise the **last number** in the text (integers, decimals, simple
   fractions ``a/b``, thousands separators removed: ``"1,234"`` -> ``"1234"``);
3. otherwise ``None``.

Everything here is linear in the input length and never raises on ``str``
input, so it is safe to run on hostile text before any timeout is in place.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = [
    "BOXED_COMMANDS",
    "extract_answer",
    "extract_boxed",
    "extract_last_number",
    "sanitize",
    "truncate_tail",
]

#: LaTeX commands whose braced argument counts as "the boxed answer".
BOXED_COMMANDS: Final[tuple[str, ...]] = ("\\boxed", "\\fbox")

_BOXED_RE: Final = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")

# A number: optional sign (only when not glued to a preceding word/digit/closing
# bracket, so "5-3" yields "3", not "-3"), digits with optional thousands groups,
# optional decimals, optional "/denominator".
_NUMBER_RE: Final = re.compile(
    r"(?:(?<![\w)\]}])-)?\d+(?:,\d{3})*(?:\.\d+)?(?:/\d+)?"
)


def sanitize(text: str) -> str:
    """Remove characters that break LaTeX/sympy parsers but carry no meaning.

    Currently this strips NUL bytes (``"\\x00"``) only; everything else,
    including odd unicode, is left to the grader, which must cope with it.
    """
    return text.replace("\x00", "") if "\x00" in text else text


def truncate_tail(text: str, max_chars: int | None) -> str:
    """Keep only the last ``max_chars`` characters of ``text``.

    Final answers sit at the end of a response, and parse time of the grader
    grows with input length, so absurdly long responses are cut from the
    *front*. ``None`` or a non-positive value disables truncation.
    """
    if max_chars is None or max_chars <= 0 or len(text) <= max_chars:
        return text
    return text[-max_chars:]


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


def extract_boxed(text: str) -> str | None:
    """Return the content of the last *complete* ``\\boxed{...}`` in ``text``.

    Nested braces are balanced (``\\boxed{\\frac{1}{2}}`` -> ``\\frac{1}{2}``).
    An unterminated trailing ``\\boxed{`` (e.g. a generation cut off by the
    token limit) is skipped and the previous complete box, if any, is used.
    ``\\boxed{}`` yields ``""``. Returns ``None`` if there is no complete box.
    The scan is linear in ``len(text)``.
    """
    starts = [m.end() for m in _BOXED_RE.finditer(text)]
    if not starts:
        return None
    pairs = _closing_braces(text)
    for end in reversed(starts):
        j = end
        while j < len(text) and text[j] in " \t":
            j += 1
        close = pairs.get(j)
        if close is not None:
            return text[j + 1 : close].strip()
    return None


def extract_last_number(text: str) -> str | None:
    """Return the last number in ``text`` with thousands separators removed.

    >>> extract_last_number("3 apples, then 1,250.5 pears and 7/8 of a pie.")
    '7/8'
    """
    last = None
    for last in _NUMBER_RE.finditer(text):
        pass
    if last is None:
        return None
    return last.group(0).replace(",", "")


def extract_answer(text: str) -> str | None:
    """Extract the final answer: last ``\\boxed{}`` content, else last number.

    Returns ``None`` when the text has neither. A present-but-empty box
    (``\\boxed{}``) returns ``""`` and does *not* fall back to the last number:
    the model committed to an (empty) answer.
    """
    boxed = extract_boxed(text)
    if boxed is not None:
        return boxed
    return extract_last_number(text)
