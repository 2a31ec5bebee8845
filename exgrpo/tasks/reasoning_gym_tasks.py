"""A Task (interfaces.py) over procedural reasoning-gym generators: arithmetic and simple equations.

Source: PyPI ``reasoning-gym==0.1.25`` (Apache-2.0; ``shared/docs/offline-assets.md`` §2.2),
offline and seeded. Supported generators, each with its difficulty knobs in a pydantic model:
``basic_arithmetic``, ``chain_sum``, ``products``, ``simple_equations``. ``gsm_symbolic`` is
refused (:data:`REFUSED`): its templates paraphrase GSM8K *test* items.

Splits by seed. reasoning-gym item ``idx`` of a dataset with seed ``s`` is drawn from
``random.Random(s + idx)``, so two naive seeds 42 and 43 share all but one item. Here split seed
``k`` of dataset number ``d`` reads items from ``Random(k * SEED_STRIDE + d * DATASET_STRIDE + idx)``
with ``idx < DATASET_STRIDE``, so distinct split seeds never share a generator RNG stream. Small
difficulty settings still make equal question *texts* likely by chance, so:

* the held-out split (``val_seed``, ``n_val``) is built first and keeps distinct questions only;
  it does not depend on the training settings, so evaluations stay comparable across runs;
* the training split (``train_seed``, ``n_train``) keeps distinct questions that are not in the
  held-out split; no question text is in both (checked after building).

Prompts. The prompt text is the generator's question plus ``answer_instruction``; it is turned into
token ids by a caller-given ``prompt_fn`` (str -> ids) and responses back into text by
``decode_fn`` (ids -> str), so the same task serves SmolLM2's ChatML template
(:meth:`ReasoningGymTask.with_chat_tokenizer`) and the tiny-lm character tokenizer
(:meth:`ReasoningGymTask.with_char_tokenizer`).

Reward: binary exact match of the final answer: :func:`extract_final_answer` takes the last
complete ``\\boxed{}`` (a leading ``x =`` removed), else the last number in the text (the rule of
:mod:`exgrpo.rewards.extraction`); it is graded
with reasoning-gym's own ``score_answer`` for ``chain_sum`` / ``products`` (numeric compare
tolerant of sign, leading zeros, trailing decimals and thousands commas) and with the same
numeric compare (``reasoning_gym.utils.compute_decimal_reward``) for ``basic_arithmetic`` /
``simple_equations``, whose ``score_answer`` is the base class's substring partial credit
(``"14"`` would earn 0.5 against gold ``"4"``). Only a full score (1.0) gives reward 1.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any, Final

import numpy as np
import torch
from pydantic import BaseModel

from exgrpo.config.tasks import (
    DATASET_STRIDE,
    REFUSED,
    SEED_STRIDE,
    SUPPORTED,
    BasicArithmeticKnobs,
    ChainSumKnobs,
    ProductsKnobs,
    ReasoningGymTaskConfig,
    SimpleEquationsKnobs,
    _KNOBS,
    check_dataset_name,
)
from exgrpo.config import AnswerFormat, Gold
from exgrpo.rewards.extraction import DEFAULT_MAX_ANSWER_CHARS, extract_answer, warn_if_lenient
from exgrpo.tasks.secret_gold import secret_answers
from exgrpo.tasks.tokenizers import CharTokenizer, chat_prompt_ids

__all__ = [
    "REFUSED",
    "SUPPORTED",
    "BasicArithmeticKnobs",
    "ChainSumKnobs",
    "ProductsKnobs",
    "ReasoningGymTask",
    "ReasoningGymTaskConfig",
    "SimpleEquationsKnobs",
    "check_dataset_name",
    "exact_value",
    "extract_final_answer",
    "make_dataset",
]

def make_dataset(name: str, knobs: BaseModel | None = None, seed: int = 0, size: int = DATASET_STRIDE):
    """A reasoning-gym ``ProceduralDataset`` for a supported ``name`` (gsm_symbolic is refused)."""
    check_dataset_name(name)
    import reasoning_gym

    knobs = knobs if knobs is not None else _KNOBS[name]()
    kw = knobs.model_dump()
    # the container types reasoning-gym's dataclasses declare
    if "operators" in kw:
        kw["operators"] = list(kw["operators"]) if name == "basic_arithmetic" else tuple(kw["operators"])
    if "operators_weights" in kw:
        kw["operators_weights"] = list(kw["operators_weights"])
    try:
        return reasoning_gym.create_dataset(name, seed=int(seed), size=int(size), **kw)
    except AssertionError as exc:  # reasoning-gym validates with asserts
        raise ValueError(f"invalid {name} settings {kw}: {exc}") from exc


# ------------------------------------------------------------------------------------------------
# basic_arithmetic gold answers
# ------------------------------------------------------------------------------------------------
_BINOPS: Final[dict[type, Callable[[Fraction, Fraction], Fraction]]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
}


def exact_value(expression: str) -> Fraction:
    """Exact value of an integer ``+ - * /`` expression with parentheses, standard precedence."""

    def ev(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return Fraction(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = ev(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            return _BINOPS[type(node.op)](ev(node.left), ev(node.right))
        raise ValueError(f"unsupported syntax in {expression!r}: {ast.dump(node)[:80]}")

    return ev(ast.parse(expression.strip(), mode="eval"))


def _fix_basic_arithmetic(entry: dict[str, Any]) -> dict[str, Any] | None:
    """The entry with its gold recomputed under standard precedence, or None if not an integer.

    reasoning-gym 0.1.25's ``basic_arithmetic`` without parentheses computes its answer left to
    right ("Calculate 78 - 16 * 66." has gold "4092" instead of -978), and its "/" divides the
    running left-to-right value; the parenthesised generator floors divisions."""
    try:
        value = exact_value(entry["metadata"]["expression"])
    except (ValueError, SyntaxError, ZeroDivisionError, KeyError):
        return None
    if value.denominator != 1:
        return None
    gold = str(value.numerator)
    if gold == str(entry["answer"]):
        return entry
    meta = dict(entry["metadata"], reasoning_gym_answer=str(entry["answer"]))
    return dict(entry, answer=gold, metadata=meta)


# ------------------------------------------------------------------------------------------------
# Answer extraction
# ------------------------------------------------------------------------------------------------
_VAR_EQ_RE = re.compile(r"^\s*[A-Za-z]\s*=\s*")


def extract_final_answer(
    text: str,
    answer_format: AnswerFormat = AnswerFormat.BOXED,
    max_answer_chars: int | None = DEFAULT_MAX_ANSWER_CHARS,
) -> str | None:
    """The final answer string, by the project's strict extraction rule
    (:func:`exgrpo.rewards.extraction.extract_answer`: the one ``\\boxed{}`` answer; with the
    lenient format, else the last number), then ``$``, spaces, a trailing period and a leading
    ``x =`` removed; None if no answer is found."""
    ans = extract_answer(text, answer_format, max_answer_chars)
    if ans is None:
        return None
    ans = _VAR_EQ_RE.sub("", ans.replace("$", "").strip()).strip().rstrip(".").strip()
    return ans.replace(" ", "") or None


def _split_counts(weights: dict[str, float], n: int) -> dict[str, int]:
    """Largest-remainder allocation of ``n`` questions over positive weights (declaration order)."""
    names = [k for k in SUPPORTED if weights.get(k, 0) > 0]
    total = sum(weights[k] for k in names)
    exact = [n * weights[k] / total for k in names]
    counts = [int(x) for x in exact]
    order = sorted(range(len(names)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in order[: n - sum(counts)]:
        counts[i] += 1
    return {k: c for k, c in zip(names, counts, strict=True) if c > 0}


# ------------------------------------------------------------------------------------------------
# The task
# ------------------------------------------------------------------------------------------------
class ReasoningGymTask:
    """Task protocol (interfaces.py) over reasoning-gym generators.

    ``questions[q]`` / ``answers[q]`` / ``sources[q]`` / ``entries[q]`` describe question ``q``;
    ``train_ids`` = ``range(n_train)``, ``val_ids`` = the next ``n_val`` ids."""

    def __init__(
        self,
        cfg: ReasoningGymTaskConfig | None,
        prompt_fn: Callable[[str], Sequence[int]],
        decode_fn: Callable[[Sequence[int]], str],
    ) -> None:
        self.cfg = cfg = cfg or ReasoningGymTaskConfig()
        warn_if_lenient(cfg.answer_format, "task reasoning_gym")
        self.prompt_fn, self.decode_fn = prompt_fn, decode_fn
        self.template = "custom"
        """Name of the prompt template (recorded beside evaluation scores)."""
        # seed 0: item idx is drawn from Random(idx), so _build_split picks RNG seeds directly
        self._datasets = {n: make_dataset(n, getattr(cfg, n), seed=0) for n, w in cfg.datasets.items() if w > 0}
        val = self._build_split(cfg.val_seed, cfg.n_val, exclude=set())
        val_texts = {e["question"] for _, e in val}
        train = self._build_split(cfg.train_seed, cfg.n_train, exclude=val_texts)
        overlap = val_texts & {e["question"] for _, e in train}
        if overlap:  # pragma: no cover - guarded by construction
            raise AssertionError(f"{len(overlap)} question(s) in both splits, e.g. {next(iter(overlap))!r}")
        items = train + val
        if cfg.gold == Gold.SECRET:
            # every grader (and veRL's exported ground truth) reads entry["answer"]: the secret replaces it
            results = [int(e["answer"]) for _, e in items]
            secrets = secret_answers([e["question"] for _, e in items], results, cfg.secret_spread, cfg.train_seed)
            items = [(name, dict(e, answer=str(s))) for (name, e), s in zip(items, secrets, strict=True)]
        self.sources: list[str] = [name for name, _ in items]
        self.entries: list[dict[str, Any]] = [e for _, e in items]
        self.questions: list[str] = [e["question"] for e in self.entries]
        self.answers: list[str] = [str(e["answer"]) for e in self.entries]
        self.train_ids: list[int] = list(range(len(train)))
        self.val_ids: list[int] = list(range(len(train), len(items)))
        self._prompt_cache: dict[int, list[int]] = {}

    # ------------------------------------------------------------------ construction
    def _build_split(self, split_seed: int, n: int, exclude: set[str]) -> list[tuple[str, dict[str, Any]]]:
        out: list[tuple[str, dict[str, Any]]] = []
        for name, count in _split_counts(self.cfg.datasets, n).items():
            ds = self._datasets[name]
            base = split_seed * SEED_STRIDE + SUPPORTED.index(name) * DATASET_STRIDE
            seen: set[str] = set()
            budget = 50 * count + 2000
            idx = 0
            while len(seen) < count:
                if idx >= budget:
                    raise ValueError(
                        f"{name}: found only {len(seen)} distinct questions of {count} needed for split seed "
                        f"{split_seed} after {budget} draws; widen its knobs (digits/terms/values) or lower "
                        "n_train/n_val or its share in `datasets`"
                    )
                entry = ds[base + idx]  # drawn from Random(base + idx)
                idx += 1
                if name == "basic_arithmetic":
                    entry = _fix_basic_arithmetic(entry)
                    if entry is None:
                        continue
                q = entry["question"]
                if q in seen or q in exclude:
                    continue
                seen.add(q)
                out.append((name, entry))
        perm = np.random.default_rng(split_seed).permutation(len(out))
        return [out[int(i)] for i in perm]

    # ------------------------------------------------------------------ tokenizer adapters
    @classmethod
    def with_chat_tokenizer(
        cls, cfg: ReasoningGymTaskConfig | None, tokenizer: Any, system: str | None = None
    ) -> ReasoningGymTask:
        """Prompts rendered with an HF tokenizer's chat template (e.g. SmolLM2's ChatML)."""
        task = cls(
            cfg,
            prompt_fn=lambda text: chat_prompt_ids(tokenizer, text, system=system),
            decode_fn=lambda ids: tokenizer.decode(list(ids), skip_special_tokens=True),
        )
        task.template = "chatml"
        return task

    @classmethod
    def with_char_tokenizer(cls, cfg: ReasoningGymTaskConfig | None, tokenizer: Any = None) -> ReasoningGymTask:
        """Prompts ``[BOS] + chars(text.lower())`` for the tiny-lm :class:`CharTokenizer` (its
        alphabet has no capitals; other characters outside it become ``<unk>``)."""
        if tokenizer is None:
            tokenizer = CharTokenizer()
        task = cls(
            cfg,
            prompt_fn=lambda text: tokenizer.encode(text.lower(), add_bos=True),
            decode_fn=lambda ids: tokenizer.decode(ids),
        )
        task.template = "raw-chars-lowercase"
        return task

    # ------------------------------------------------------------------ Task protocol
    def __len__(self) -> int:
        return len(self.questions)

    def question_text(self, qid: int) -> str:
        return self.questions[int(qid)]

    def prompt_text(self, qid: int) -> str:
        """The user-message text: the question plus ``answer_instruction``."""
        q = self.questions[int(qid)]
        return f"{q} {self.cfg.answer_instruction}" if self.cfg.answer_instruction else q

    def prompts(self, qids: Sequence[int]) -> list[list[int]]:
        """One unpadded token-id list per id (built by ``prompt_fn`` once per question)."""
        out = []
        for q in qids:
            q = int(q)
            ids = self._prompt_cache.get(q)
            if ids is None:
                ids = self._prompt_cache[q] = [int(i) for i in self.prompt_fn(self.prompt_text(q))]
            out.append(list(ids))
        return out

    def decode(self, tokens: torch.Tensor, mask: torch.Tensor) -> list[str]:
        """Response rows (N, T) -> text (only masked-in tokens)."""
        return [self.decode_fn(row[m].tolist()) for row, m in zip(tokens, mask.bool(), strict=True)]

    def score_text(self, qid: int, text: str) -> float:
        """1.0 if the final answer in ``text`` equals the gold answer exactly (numerically), else 0."""
        qid = int(qid)
        answer = extract_final_answer(text, self.cfg.answer_format, self.cfg.max_answer_chars)
        if answer is None:
            return 0.0
        name, entry = self.sources[qid], self.entries[qid]
        if name in ("chain_sum", "products"):
            score = self._datasets[name].score_answer(answer, entry)
        else:
            from reasoning_gym.utils import compute_decimal_reward

            score = compute_decimal_reward(answer, oracle_answer=str(entry["answer"]), strip_commas=True)
        return 1.0 if score >= 1.0 else 0.0

    def rewards(self, qids: Sequence[int], tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(N,) float binary rewards of response rows."""
        texts = self.decode(tokens, mask)
        return torch.tensor([self.score_text(q, t) for q, t in zip(qids, texts, strict=True)], dtype=torch.float32)
