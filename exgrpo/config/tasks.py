"""Task sections of the config: which questions, which splits, which difficulty."""

from __future__ import annotations

import itertools
import math
from typing import Final, Literal

from pydantic import Field, field_validator, model_validator

from exgrpo.config.options import DEFAULT_MAX_ANSWER_CHARS, AnswerFormat, Gold, HeldOut, _Strict


class ToyTaskConfig(_Strict):
    """Integer addition/subtraction from feature vectors."""

    kind: Literal["toy_arithmetic"] = "toy_arithmetic"
    """Task registry key."""
    max_operand: int = Field(30, ge=1, le=1000)
    """Operands a, b are drawn from 0..max_operand; answers lie in [-max_operand, 2*max_operand]."""
    val_fraction: float = Field(0.2, gt=0.0, lt=1.0)
    """Fraction of all (a, op, b) questions held out for validation."""
    data_seed: int = 1234
    """Seed of the train/validation split (fixed across run seeds so arms see the same data)."""


class ArithmeticProblemsConfig(_Strict):
    """The distribution of arithmetic questions (shared by the SFT warm start and the RL task)."""

    min_operands: int = Field(2, ge=2, le=6)
    """Fewest operands in an expression."""
    max_operands: int = Field(3, ge=2, le=6)
    """Most operands in an expression."""
    max_operand: int = Field(20, ge=1, le=999)
    """Operands of + and - are drawn from 0..max_operand."""
    max_factor: int = Field(9, ge=1, le=999)
    """Operands next to a * are drawn from 0..max_factor (keeps products short)."""
    ops: str = "+-*"
    """Operators to draw from (a subset of "+-*")."""

    @model_validator(mode="after")
    def _check(self) -> ArithmeticProblemsConfig:
        if self.min_operands > self.max_operands:
            raise ValueError(f"min_operands={self.min_operands} must be <= max_operands={self.max_operands}")
        if not self.ops or set(self.ops) - set("+-*"):
            raise ValueError(f"ops={self.ops!r} must be a non-empty subset of '+-*'")
        return self


def distinct_questions(p: ArithmeticProblemsConfig) -> int:
    """How many distinct questions ``p`` can make: for each operator sequence of each length, the
    product of its operands' ranges (0..max_factor beside a ``*``, else 0..max_operand). Each question
    text is one (operands, operators): operands are written without leading zeros between the signs."""
    total = 0
    for n in range(p.min_operands, p.max_operands + 1):
        for seq in itertools.product(sorted(set(p.ops)), repeat=n - 1):
            count = 1
            for i in range(n):
                by_mul = (i > 0 and seq[i - 1] == "*") or (i < n - 1 and seq[i] == "*")
                count *= (p.max_factor if by_mul else p.max_operand) + 1
            total += count
    return total


def rl_questions_bound(p: ArithmeticProblemsConfig) -> int:
    """At least as many as the distinct questions ``p`` makes on the RL side of the task's SFT/RL hash
    split (``exgrpo.tasks.text_arithmetic.is_rl_question``, a fair coin per question): half of all of
    them plus 3 * sqrt(all), six standard deviations of such a split, and never more than all of them.
    A bound, not the count: counting the RL side means hashing every question (1.7 million of the
    chain regime's), too slow to check a config with."""
    total = distinct_questions(p)
    return min(total, math.floor(total / 2 + 3 * math.sqrt(total)))


class GradedTaskConfig(_Strict):
    """How a language task's responses are graded (shared by the LM tasks)."""

    answer_format: AnswerFormat = AnswerFormat.BOXED
    """Where the final answer must be: boxed (strict) or boxed_or_last_number (gameable; warns)."""
    max_answer_chars: int = Field(DEFAULT_MAX_ANSWER_CHARS, ge=1)
    """Longest graded answer; a longer one scores 0 instead of being truncated."""


class IntegerGoldTaskConfig(GradedTaskConfig):
    """A graded task whose gold answers are integers (the arithmetic tasks), which may be made secret."""

    gold: Gold = Gold.RESULT
    """The graded answer: result (the arithmetic's value), or secret (the value plus an offset drawn once
    per question, a hash of the task's seed and the question, uniform over ±1..±secret_spread): no
    computation finds a secret, so a policy solves a question again only by remembering a rewarded answer
    to it. The constructed positive control for replay: its progress is train/accuracy (val/* questions
    have secrets of their own)."""
    secret_spread: int = Field(2, ge=1, le=9)
    """The largest offset of a secret answer from the result (gold: secret)."""


DATA_FILE_SUFFIXES: Final[tuple[str, ...]] = (".parquet", ".jsonl")
"""The formats of a task file (exgrpo.tasks.rlhf_file reads each)."""


class FileTaskConfig(GradedTaskConfig):
    """Questions from your own file in veRL's RLHFDataset layout (parquet or JSONL), graded by math-verify
    against ``reward_model.ground_truth``; the same file on both backends."""

    kind: Literal["file"] = "file"
    """Task registry key."""
    path: str
    """The training file, .parquet or .jsonl (relative paths are from the working directory); each row: prompt
    (chat messages), reward_model.ground_truth (a string), data_source, optionally extra_info.index."""
    val_path: str | None = None
    """The held-out file (same layout); None: n_val questions of path are held out instead."""
    n_val: int = Field(0, ge=0)
    """Questions of path held out for validation (a random subset by split_seed) when val_path is not set."""
    split_seed: int = 0
    """Seed of that held-out subset."""
    max_prompt_length: int | None = Field(None, ge=1)
    """Drop questions whose chat prompt has more tokens (native backend; the reference uses 1024); None keeps all."""
    remove_system: bool = False
    """Drop system messages before applying the chat template (the reference's evaluation does)."""
    require_think: bool = False
    """Grade only the text after the first </think> and give 0 without one (the reference's reward v3)."""

    @field_validator("path", "val_path")
    @classmethod
    def _format(cls, v: str | None) -> str | None:
        if v is not None and not v.endswith(DATA_FILE_SUFFIXES):
            raise ValueError(f"{v!r} is not a {' or '.join(DATA_FILE_SUFFIXES)} file (veRL's RLHFDataset layout)")
        return v

    @model_validator(mode="after")
    def _one_held_out_set(self) -> FileTaskConfig:
        if self.val_path is not None and self.n_val:
            raise ValueError(f"val_path and n_val={self.n_val} both name held-out questions; set one "
                             "(n_val: 0 with a val_path)")
        return self


class TextArithmeticTaskConfig(IntegerGoldTaskConfig):
    """Text arithmetic questions with worked answers (tiny-lm tier)."""

    kind: Literal["text_arithmetic"] = "text_arithmetic"
    """Task registry key."""
    problems: ArithmeticProblemsConfig = ArithmeticProblemsConfig()
    """Question distribution (keep equal to the tiny LM's SFT distribution)."""
    n_train: int = Field(2000, ge=1)
    """Training questions."""
    n_val: int = Field(500, ge=1)
    """Held-out validation questions."""
    data_seed: int = 1234
    """Seed of the question set and of the train/validation split."""
    held_out: HeldOut = HeldOut.TUNING
    """The n_val questions that val/* reads: tuning (split off beside the training questions; choose
    regimes, learning rates and sweep trials on it) or test (n_val more drawn after them, in no
    training or tuning set; report on it). The training questions are the same for both."""

    @model_validator(mode="after")
    def _enough_questions(self) -> TextArithmeticTaskConfig:
        # the task draws its questions only when it is built, after the warm start: refuse here instead
        test = self.held_out == HeldOut.TEST
        wanted = self.n_train + self.n_val * (2 if test else 1)
        most = rl_questions_bound(self.problems)
        if wanted > most:
            asked = f"task.n_train={self.n_train} + task.n_val={self.n_val}" + (" twice (held_out: test)" if test else "")
            raise ValueError(f"{asked} asks for {wanted} distinct RL questions, but task.problems makes at most {most}; "
                             "lower task.n_train (or task.n_val), or widen task.problems (max_operand, max_operands, ops)")
        return self




SUPPORTED: Final[tuple[str, ...]] = ("basic_arithmetic", "chain_sum", "products", "simple_equations")
REFUSED: Final[dict[str, str]] = {
    "gsm_symbolic": (
        "reasoning-gym's gsm_symbolic is refused: its templates are paraphrases of GSM8K *test* items "
        "(GSM-Symbolic style; 148 of 200 sampled items have word-Jaccard > 0.5 with a GSM8K test question, "
        "e.g. 'James gets 160 emails a day. 30% ...' vs GSM8K test 'James gets 80 emails a day. 20% ...'; "
        "see shared/docs/offline-assets.md §2.2). Training on it contaminates any GSM8K-test evaluation. "
        f"Use {', '.join(SUPPORTED)} instead."
    ),
}
SEED_STRIDE: Final[int] = 1 << 40
"""RNG-seed distance between split seeds."""
DATASET_STRIDE: Final[int] = 1 << 32
"""RNG-seed distance between datasets within a split (and the most items one split may try)."""


class _TermsDigits(_Strict):
    @model_validator(mode="after")
    def _ranges(self):
        if self.min_terms > self.max_terms:
            raise ValueError(f"min_terms={self.min_terms} must be <= max_terms={self.max_terms}")
        if self.min_digits > self.max_digits:
            raise ValueError(f"min_digits={self.min_digits} must be <= max_digits={self.max_digits}")
        return self


class BasicArithmeticKnobs(_TermsDigits):
    """reasoning-gym ``basic_arithmetic``: "Calculate 7 - 5 * 2." (integer results; "/" is exact)."""

    min_terms: int = Field(2, ge=1, le=12)
    """Fewest operands in an expression."""
    max_terms: int = Field(3, ge=1, le=12)
    """Most operands in an expression."""
    min_digits: int = Field(1, ge=1, le=10)
    """Fewest digits per operand (one digit count is drawn per question)."""
    max_digits: int = Field(2, ge=1, le=10)
    """Most digits per operand."""
    operators: tuple[Literal["+", "-", "*", "/"], ...] = ("+", "-", "*")
    """Operators to draw from ("/" is integer-exact division)."""
    allow_parentheses: bool = False
    """Allow parenthesised sub-expressions (reasoning-gym's "complex" generator)."""
    allow_negation: bool = False
    """Allow negated groups like "-(3 + 4)" (only with parentheses)."""
    format_style: Literal["simple", "natural"] = "simple"
    """"simple": "Calculate E."; "natural": one of "What is E?", "Solve E.", "Compute E.", "Evaluate: E."."""
    whitespace: Literal["no_space", "single", "random"] = "single"
    """Spacing between terms in the expression."""

    @field_validator("operators")
    @classmethod
    def _nonempty(cls, v):
        if not v:
            raise ValueError("operators must not be empty")
        return v


class ChainSumKnobs(_TermsDigits):
    """reasoning-gym ``chain_sum``: "State the final answer to the following arithmetic problem: 4 + 3 =" (+/- only)."""

    min_terms: int = Field(2, ge=1, le=12)
    """Fewest operands."""
    max_terms: int = Field(3, ge=1, le=12)
    """Most operands."""
    min_digits: int = Field(1, ge=1, le=10)
    """Fewest digits per operand (one digit count is drawn per question)."""
    max_digits: int = Field(2, ge=1, le=10)
    """Most digits per operand."""
    allow_negation: bool = False
    """Allow negative operands."""


class ProductsKnobs(_TermsDigits):
    """reasoning-gym ``products``: "Solve the following multiplication: 4 * 3. Give only the result as your final answer."."""

    min_terms: int = Field(2, ge=1, le=12)
    """Fewest factors."""
    max_terms: int = Field(2, ge=1, le=12)
    """Most factors."""
    min_digits: int = Field(1, ge=1, le=10)
    """Fewest digits per factor (one digit count is drawn per question)."""
    max_digits: int = Field(2, ge=1, le=10)
    """Most digits per factor."""
    allow_negation: bool = False
    """Allow negative factors."""


class SimpleEquationsKnobs(_Strict):
    """reasoning-gym ``simple_equations``: "Solve for p: 7 - 17*p = -197" (integer solution)."""

    min_terms: int = Field(2, ge=1, le=20)
    """Fewest terms on the left-hand side (one of them holds the variable)."""
    max_terms: int = Field(2, ge=1, le=20)
    """Most terms on the left-hand side."""
    min_value: int = Field(1, ge=1)
    """Smallest constant, coefficient and solution."""
    max_value: int = Field(20, ge=1)
    """Largest constant, coefficient and solution."""
    operators: tuple[Literal["+", "-", "*"], ...] = ("+", "-", "*")
    """Operators joining the terms ("*" present also gives the variable a coefficient)."""
    operators_weights: tuple[float, ...] = (0.4, 0.4, 0.2)
    """Sampling weights of ``operators`` (same length, summing to 1)."""

    @model_validator(mode="after")
    def _check(self) -> SimpleEquationsKnobs:
        if self.min_terms > self.max_terms:
            raise ValueError(f"min_terms={self.min_terms} must be <= max_terms={self.max_terms}")
        if self.min_value > self.max_value:
            raise ValueError(f"min_value={self.min_value} must be <= max_value={self.max_value}")
        if not self.operators or len(self.operators) != len(self.operators_weights):
            raise ValueError("operators must be non-empty and as long as operators_weights")
        if round(sum(self.operators_weights), 1) != 1.0:
            raise ValueError(f"operators_weights={self.operators_weights} must sum to 1")
        return self


_KNOBS: Final[dict[str, type[_Strict]]] = {
    "basic_arithmetic": BasicArithmeticKnobs,
    "chain_sum": ChainSumKnobs,
    "products": ProductsKnobs,
    "simple_equations": SimpleEquationsKnobs,
}


def check_dataset_name(name: str) -> str:
    """``name`` if supported; ValueError explaining why otherwise (gsm_symbolic: contamination)."""
    if name in REFUSED:
        raise ValueError(REFUSED[name])
    if name not in SUPPORTED:
        raise ValueError(f"reasoning-gym dataset {name!r} is not supported here; choose from {', '.join(SUPPORTED)}")
    return name


class ReasoningGymTaskConfig(IntegerGoldTaskConfig):
    """A mixture of reasoning-gym generators with train/held-out splits by seed."""

    kind: Literal["reasoning_gym"] = "reasoning_gym"
    """Task registry key."""
    datasets: dict[str, float] = Field(default_factory=lambda: {n: 1.0 for n in SUPPORTED})
    """Generator name -> relative share of questions (0 drops it); names from SUPPORTED."""
    basic_arithmetic: BasicArithmeticKnobs = BasicArithmeticKnobs()
    """Difficulty knobs of basic_arithmetic."""
    chain_sum: ChainSumKnobs = ChainSumKnobs()
    """Difficulty knobs of chain_sum."""
    products: ProductsKnobs = ProductsKnobs()
    """Difficulty knobs of products."""
    simple_equations: SimpleEquationsKnobs = SimpleEquationsKnobs()
    """Difficulty knobs of simple_equations."""
    n_train: int = Field(1000, ge=1)
    """Training questions (distinct, none in the held-out split)."""
    n_val: int = Field(200, ge=1)
    """Held-out questions (distinct; fixed by val_seed and n_val alone)."""
    train_seed: int = Field(0, ge=0, lt=1 << 20)
    """Split seed of the training questions."""
    val_seed: int = Field(1, ge=0, lt=1 << 20)
    """Split seed of the held-out questions (must differ from train_seed)."""
    answer_instruction: str = "Put the final answer in \\boxed{}."
    """Appended (after a space) to every question in the prompt; "" for the bare question."""

    @field_validator("datasets")
    @classmethod
    def _datasets(cls, v: dict[str, float]) -> dict[str, float]:
        for name, w in v.items():
            check_dataset_name(name)
            if not w >= 0:
                raise ValueError(f"datasets[{name!r}]={w} must be >= 0")
        if not any(w > 0 for w in v.values()):
            raise ValueError("datasets needs at least one generator with a positive share")
        return v

    @model_validator(mode="after")
    def _seeds(self) -> ReasoningGymTaskConfig:
        if self.train_seed == self.val_seed:
            raise ValueError(f"train_seed and val_seed must differ (both {self.train_seed})")
        return self
