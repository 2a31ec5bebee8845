"""The tiny-lm tier's task: integer arithmetic as text, answered with worked steps and ``\\boxed{}``.

A question is an expression of 2-3 integer operands joined by ``+``, ``-``, ``*`` (``*`` binds
first), written ``"12+7*3=?"``. Its worked solution (the SFT target of
:mod:`exgrpo.policies.lm.tiny_lm`) does one operation per step, products first, then sums
left to right, and ends with the boxed answer::

    "12+7*3=?"  ->  "7*3=21 12+21=33 \\boxed{33}"

A prompt row is ``[BOS] + chars(question)`` in the :class:`CharTokenizer` ids; a response is
decoded and graded by :func:`extract_final_integer` (the one ``\\boxed{}`` answer, by the
strict rule of :mod:`exgrpo.rewards.extraction`) against the gold integer, exactly.

Splits. Every possible question falls on one side of a fixed hash split (:func:`is_rl_question`):
the SFT warm start only ever trains on the "sft" side, and this task's train/val questions come
only from the "rl" side, so the warm start never saw an RL question. Within the RL side,
``data_seed`` fixes which questions exist and which of them are held out: the tuning split
(``n_val`` questions split off beside the training set) and, with ``held_out: test``, ``n_val``
more drawn after both, which ``val/*`` then reads instead.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

import numpy as np
import torch

from exgrpo.tasks.secret_gold import secret_answers
from exgrpo.tasks.tokenizers import CharTokenizer
from exgrpo.config import AnswerFormat, ArithmeticProblemsConfig, Gold, HeldOut, TextArithmeticTaskConfig
from exgrpo.rewards.extraction import DEFAULT_MAX_ANSWER_CHARS, extract_answer, warn_if_lenient

__all__ = [
    "ArithmeticProblemsConfig",
    "TextArithmetic",
    "TextArithmeticTaskConfig",
    "direct_solution",
    "extract_final_integer",
    "is_rl_question",
    "sample_problem",
    "sample_sft_problems",
    "worked_solution",
]


# ------------------------------------------------------------------------------------------------
# Problems and worked solutions
# ------------------------------------------------------------------------------------------------
def sample_problem(cfg: ArithmeticProblemsConfig, rng: np.random.Generator) -> tuple[list[int], list[str]]:
    """Draw (operands, operators) with ``len(operators) == len(operands) - 1``."""
    n = int(rng.integers(cfg.min_operands, cfg.max_operands + 1))
    ops = [cfg.ops[int(i)] for i in rng.integers(0, len(cfg.ops), size=n - 1)]
    nums = []
    for i in range(n):
        by_mul = (i > 0 and ops[i - 1] == "*") or (i < n - 1 and ops[i] == "*")
        nums.append(int(rng.integers(0, (cfg.max_factor if by_mul else cfg.max_operand) + 1)))
    return nums, ops


def question_text(nums: Sequence[int], ops: Sequence[str]) -> str:
    out = str(nums[0])
    for o, x in zip(ops, nums[1:], strict=True):
        out += f"{o}{x}"
    return out + "=?"


def worked_solution(nums: Sequence[int], ops: Sequence[str]) -> tuple[str, int]:
    """(solution text, answer): products left to right, then sums/differences left to right."""
    steps: list[str] = []
    # split into product groups separated by + / -
    groups: list[list[int]] = [[nums[0]]]
    signs: list[str] = []
    for o, x in zip(ops, nums[1:], strict=True):
        if o == "*":
            groups[-1].append(x)
        else:
            signs.append(o)
            groups.append([x])
    values = []
    for g in groups:
        v = g[0]
        for x in g[1:]:
            steps.append(f"{v}*{x}={v * x}")
            v *= x
        values.append(v)
    acc = values[0]
    for s, v in zip(signs, values[1:], strict=True):
        new = acc + v if s == "+" else acc - v
        steps.append(f"{acc}{s}{v}={new}")
        acc = new
    steps.append(f"\\boxed{{{acc}}}")
    return " ".join(steps), acc


def _bucket(question: str) -> int:
    return int.from_bytes(hashlib.blake2b(question.encode(), digest_size=8).digest(), "big") % 1000


def is_rl_question(question: str) -> bool:
    """The fixed SFT/RL split: half of all possible questions (by a stable hash) are RL-only."""
    return _bucket(question) < 500


def direct_solution(nums: Sequence[int], ops: Sequence[str]) -> str:
    """The answer alone, with no worked steps: ``"12+7*3=?"`` -> ``"\\boxed{33}"``."""
    return f"\\boxed{{{worked_solution(nums, ops)[1]}}}"


def sample_sft_problems(
    cfg: ArithmeticProblemsConfig, rng: np.random.Generator, n: int, direct_fraction: float = 0.0
) -> list[tuple[str, str]]:
    """``n`` (question, solution) pairs from the SFT side of the split (repeats possible).

    Each solution is worked (:func:`worked_solution`), or with probability ``direct_fraction`` the
    answer alone (:func:`direct_solution`). The extra draw is made only when ``direct_fraction > 0``,
    so the all-worked stream is the same as without the option."""
    out = []
    while len(out) < n:
        nums, ops = sample_problem(cfg, rng)
        q = question_text(nums, ops)
        if not is_rl_question(q):
            direct = direct_fraction > 0 and rng.random() < direct_fraction
            out.append((q, direct_solution(nums, ops) if direct else worked_solution(nums, ops)[0]))
    return out


# ------------------------------------------------------------------------------------------------
# Grading
# ------------------------------------------------------------------------------------------------
_INT_FULL_RE = re.compile(r"[+-]?[0-9]+")


def extract_final_integer(
    text: str,
    answer_format: AnswerFormat = AnswerFormat.BOXED,
    max_answer_chars: int | None = DEFAULT_MAX_ANSWER_CHARS,
) -> int | None:
    """The integer answer of ``text`` by the project's strict rule
    (:func:`exgrpo.rewards.extraction.extract_answer`): the one boxed answer (or, with the lenient
    format, the last number), if it is a plain ASCII integer; None otherwise."""
    answer = extract_answer(text, answer_format, max_answer_chars)
    return int(answer) if answer is not None and _INT_FULL_RE.fullmatch(answer) else None


# ------------------------------------------------------------------------------------------------
# The task
# ------------------------------------------------------------------------------------------------
class TextArithmetic:
    """Task protocol (interfaces.py): ``train_ids``, ``val_ids``, ``prompts``, ``rewards``."""

    def __init__(self, cfg: TextArithmeticTaskConfig | None = None, tokenizer: CharTokenizer | None = None) -> None:
        self.cfg = cfg = cfg or TextArithmeticTaskConfig()
        warn_if_lenient(cfg.answer_format, "task text_arithmetic")
        self.tokenizer = tokenizer or CharTokenizer()
        total = cfg.n_train + cfg.n_val
        rng = np.random.default_rng(cfg.data_seed)
        seen: set[str] = set()
        self.questions: list[str] = []
        self.solutions: list[str] = []
        self.answers: list[int] = []
        self._draw(rng, seen, total, total + (cfg.n_val if cfg.held_out == HeldOut.TEST else 0))
        perm = np.random.default_rng(cfg.data_seed + 1).permutation(total)
        self.tuning_ids = sorted(int(i) for i in perm[: cfg.n_val])
        self.train_ids = sorted(int(i) for i in perm[cfg.n_val :])
        if cfg.held_out == HeldOut.TEST:
            # The same stream continues past the training and tuning questions, so both stay exactly
            # what they are without a test split, and the test questions are in neither.
            self._draw(rng, seen, total + cfg.n_val, total + cfg.n_val)
            self.val_ids = list(range(total, total + cfg.n_val))
        else:
            self.val_ids = self.tuning_ids
        if cfg.gold == Gold.SECRET:
            self.answers = secret_answers(self.questions, self.answers, cfg.secret_spread, cfg.data_seed)
        self._prompt_ids = [self.tokenizer.encode(q, add_bos=True, strict=True) for q in self.questions]

    def _draw(self, rng: np.random.Generator, seen: set[str], until: int, requested: int) -> None:
        """Append distinct RL-side questions from ``rng`` until there are ``until`` of them."""
        cfg = self.cfg
        attempts = 0
        while len(self.questions) < until:
            attempts += 1
            if attempts > 50 * until + 10_000:
                raise ValueError(
                    f"could only find {len(self.questions)} distinct RL questions of {requested} requested; "
                    "lower n_train/n_val or widen task.problems (max_operand, max_operands)"
                )
            nums, ops = sample_problem(cfg.problems, rng)
            q = question_text(nums, ops)
            if q in seen or not is_rl_question(q):
                continue
            seen.add(q)
            sol, ans = worked_solution(nums, ops)
            self.questions.append(q)
            self.solutions.append(sol)
            self.answers.append(ans)

    def __len__(self) -> int:
        return len(self.questions)

    def question_text(self, qid: int) -> str:
        return self.questions[qid]

    def solution_text(self, qid: int) -> str:
        return self.solutions[qid]

    def prompts(self, qids: Sequence[int]) -> list[list[int]]:
        """One unpadded token-id list per id: ``[BOS] + chars(question)``."""
        return [list(self._prompt_ids[int(q)]) for q in qids]

    def decode(self, tokens: torch.Tensor, mask: torch.Tensor) -> list[str]:
        """Response rows (N, T) -> text (specials, EOS included, dropped)."""
        return [self.tokenizer.decode(row[m].tolist()) for row, m in zip(tokens, mask.bool(), strict=True)]

    def final_integer(self, text: str) -> int | None:
        """The graded integer answer of a response text (the config's answer format)."""
        return extract_final_integer(text, self.cfg.answer_format, self.cfg.max_answer_chars)

    def rewards(self, qids: Sequence[int], tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(N,) float: 1.0 where the response's final integer equals the gold answer, else 0."""
        texts = self.decode(tokens, mask)
        return torch.tensor(
            [float(self.final_integer(t) == self.answers[int(q)]) for q, t in zip(qids, texts, strict=True)], dtype=torch.float32
        )
