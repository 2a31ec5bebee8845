"""Tests for exgrpo.rewards: answer extraction, the math-verify reward, and its safety.

The hostile corpus checks that scoring never raises and that every call
returns within a bound derived from the verifier's configured timeouts
(plus a generous, explicitly named allowance for process start-up and CI
noise), not a tight wall-clock claim.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exgrpo.rewards import (
    GRADER_NAME,
    MathVerifier,
    RewardBatch,
    RewardStatus,
    build_prediction,
    extract_answer,
    extract_boxed,
    extract_last_number,
)
from exgrpo.config import AnswerFormat
from exgrpo.rewards._faults import CRASH, HANG, faulty_score_item
from exgrpo.rewards.math_reward import MAX_VERIFY_PAIRS

# Small inner timeouts keep the hostile corpus fast; bounds below derive from them.
PARSE_TIMEOUT = 1
VERIFY_TIMEOUT = 1
#: Slack for interpreter noise on a loaded 2-core box (not part of any guarantee).
NOISE_S = 5.0
#: Allowance for (re)starting spawn workers, which import math-verify (~1-2 s each).
STARTUP_ALLOWANCE_S = 20.0


def in_process_bound(v: MathVerifier) -> float:
    """Worst case of one in-process item: two parses + every verify pair, + noise."""
    return 2 * v.parse_timeout + MAX_VERIFY_PAIRS * v.verify_timeout + NOISE_S


def pool_bound(v: MathVerifier) -> float:
    """Worst case of one pooled single-item call: the outer deadline + a pool restart."""
    return v.item_timeout + STARTUP_ALLOWANCE_S


@pytest.fixture(scope="module")
def inproc() -> MathVerifier:
    """In-process verifier with math-verify's default 5 s timeouts (robust under load)."""
    with MathVerifier(workers=0) as v:
        yield v


@pytest.fixture(scope="module")
def pool() -> MathVerifier:
    """Process-pool verifier with math-verify's default 5 s timeouts."""
    with MathVerifier(workers=2) as v:
        yield v


@pytest.fixture(params=["inproc", "pool"])
def verifier(request: pytest.FixtureRequest) -> MathVerifier:
    return request.getfixturevalue(request.param)


@pytest.fixture(scope="module")
def inproc_fast() -> MathVerifier:
    """In-process verifier with 1 s inner timeouts, for the hostile corpus."""
    with MathVerifier(workers=0, parse_timeout=PARSE_TIMEOUT, verify_timeout=VERIFY_TIMEOUT) as v:
        yield v


@pytest.fixture(scope="module")
def pool_fast() -> MathVerifier:
    """Process-pool verifier with 1 s inner timeouts, for the hostile corpus."""
    with MathVerifier(workers=2, parse_timeout=PARSE_TIMEOUT, verify_timeout=VERIFY_TIMEOUT) as v:
        yield v


# ------------------------------------------------------------------ extraction


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"so \boxed{\frac{1}{2}}.", r"\frac{1}{2}"),
        (r"\boxed{1} then \boxed{2}", "2"),  # the raw last-box rule (extract_answer refuses the pair)
        (r"\boxed{\left( 3, \frac{\pi}{2} \right)}", r"\left( 3, \frac{\pi}{2} \right)"),
        (r"\boxed{\{1,2\}}", r"\{1,2\}"),  # escaped braces are literal
        (r"\boxed{  7 }", "7"),
        (r"\boxed {7}", "7"),
        (r"\fbox{8}", "8"),
        (r"\boxed{3} and then \boxed{\frac{1}{2", "3"),  # unterminated last box is skipped
        (r"\boxed{}", ""),
        ("no box here", None),
        (r"\boxedx{1}", None),
    ],
)
def test_extract_boxed(text: str, expected: str | None) -> None:
    assert extract_boxed(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("She makes 9 * 2 = 18 dollars.", "18"),
        ("The total is 1,250.5 pounds.", "1250.5"),
        ("It is -3 degrees", "-3"),
        ("from 5-3", "3"),
        ("ratio 7/8", "7/8"),
        ("list 1,2,3", "3"),
        ("nothing", None),
    ],
)
def test_extract_last_number(text: str, expected: str | None) -> None:
    assert extract_last_number(text) == expected


def test_extract_answer_prefers_box_over_numbers() -> None:
    lenient = AnswerFormat.BOXED_OR_LAST_NUMBER
    assert extract_answer(r"\boxed{42}. Check: 6*7=42, 100") == "42"
    assert extract_answer(r"\boxed{42}. Check: 6*7=42, 100", lenient) == "42"
    assert extract_answer("so the answer is 18.") is None  # strict: no box, no answer
    assert extract_answer("so the answer is 18.", lenient) == "18"
    assert extract_answer(r"\boxed{} but 5", lenient) is None  # empty box: no fallback
    assert extract_answer("no digits", lenient) is None


def test_extraction_is_linear_on_pathological_input() -> None:
    text = "\\boxed{" * 20_000 + "{" * 50_000 + "1" * 50_000
    t0 = time.monotonic()
    assert extract_boxed(text) is None
    assert extract_answer(text, AnswerFormat.BOXED_OR_LAST_NUMBER, None) == "1" * 50_000
    assert time.monotonic() - t0 < 5.0  # quadratic scanning would take minutes


def test_build_prediction_protocol() -> None:
    assert build_prediction(r"thus \boxed{\frac12}") == r"\boxed{\frac12}"
    assert build_prediction("it is 18 eggs") is None  # strict: no box
    assert build_prediction("it is 18 eggs", AnswerFormat.BOXED_OR_LAST_NUMBER) == r"\boxed{18}"
    # The raw text never reaches math-verify, whose own extraction would find numbers in noise.
    assert build_prediction("the answer is $\\pi$", AnswerFormat.BOXED_OR_LAST_NUMBER) is None
    assert build_prediction("") is None
    assert build_prediction(None) is None
    assert build_prediction(r"\boxed{ }") is None
    # A long response is not truncated: its one box is graded wherever it stands.
    long = "x" * 10_000 + r" \boxed{7}"
    assert build_prediction(long) == r"\boxed{7}"
    assert build_prediction(r"\boxed{7} " + "x" * 10_000) == r"\boxed{7}"
    assert build_prediction("\x00\\boxed{5}\x00") == r"\boxed{5}"


# ------------------------------------------------------------------ correctness

CORRECTNESS_CASES = [
    (r"The answer is \boxed{\frac12}.", "0.5", 1.0),
    (r"\boxed{\frac{1}{2}}", "1/2", 1.0),
    (r"\boxed{2\sqrt{2}}", r"\sqrt{8}", 1.0),
    (r"\boxed{x^2+2x+1}", "(x+1)^2", 1.0),
    (r"\boxed{\left( 3, \frac{\pi}{2} \right)}", r"\left( 3, \frac{\pi}{2} \right)", 1.0),
    (r"\boxed{\{1,2\}}", r"\{2,1\}", 1.0),
    (r"\boxed{\frac{14}{3}}", r"\frac{14}{3}", 1.0),
    (r"\boxed{3}", "4", 0.0),
    (r"\boxed{\frac{1}{3}}", "0.5", 0.0),
    ("I do not know.", "5", 0.0),
    ("", "5", 0.0),
    ("Janet sells 9 eggs, so she makes 9 * 2 = 18 dollars.", "18", 0.0),  # strict: no box
    (r"so she makes 9 * 2 = \boxed{18} dollars.", "18", 1.0),
    (r"The total is \boxed{2,125} apples", "2125", 1.0),
    (r"\boxed{}", "0", 0.0),
]


@pytest.mark.parametrize(("response", "gold", "reward"), CORRECTNESS_CASES)
def test_correctness_cases(verifier: MathVerifier, response: str, gold: str, reward: float) -> None:
    assert verifier.score_one(response, gold) == reward


def test_batch_alignment_statuses_and_counts(verifier: MathVerifier) -> None:
    responses = [r"\boxed{1}", r"\boxed{2}", "nothing 3", r"\boxed{1}", None]
    golds = ["1", "1", "3", "1", 4]  # int gold is accepted
    b = verifier.score(responses, golds)
    assert isinstance(b, RewardBatch)
    assert b.rewards == [1.0, 0.0, 0.0, 1.0, 0.0]
    assert b.statuses == [
        RewardStatus.CORRECT,
        RewardStatus.WRONG,
        RewardStatus.NO_ANSWER,
        RewardStatus.CORRECT,
        RewardStatus.NO_ANSWER,
    ]
    assert (b.n_timeout, b.n_error) == (0, 0)
    assert b.mean == pytest.approx(0.4)
    assert b.counts()["correct"] == 2 and sum(b.counts().values()) == 5
    assert verifier.score([], []).rewards == []


def test_bad_gold_is_scored_not_raised(verifier: MathVerifier) -> None:
    b = verifier.score([r"\boxed{1}"], [""])
    assert b.rewards == [0.0]
    assert b.statuses[0] in (RewardStatus.BAD_GOLD, RewardStatus.WRONG, RewardStatus.NO_ANSWER)


def test_grader_metadata(inproc: MathVerifier) -> None:
    assert inproc.grader_name == GRADER_NAME == "math-verify"
    assert inproc.grader_version == "0.9.0"
    assert "math-verify==0.9.0" in repr(inproc)


def test_argument_errors_name_the_field(inproc: MathVerifier) -> None:
    with pytest.raises(ValueError, match="same length"):
        inproc.score(["a"], [])
    with pytest.raises(TypeError, match=r"golds\[0\]"):
        inproc.score(["a"], [None])  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"responses\[1\]"):
        inproc.score(["a", 3], ["1", "2"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="parse_timeout"):
        MathVerifier(parse_timeout=0)
    with pytest.raises(ValueError, match="verify_timeout"):
        MathVerifier(verify_timeout=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="workers"):
        MathVerifier(workers=-1)


def test_default_item_timeout_covers_inner_timeouts() -> None:
    v = MathVerifier(workers=2, parse_timeout=5, verify_timeout=5)
    assert v.item_timeout > 2 * 5 + MAX_VERIFY_PAIRS * 5
    v.close()


# ------------------------------------------------------------------ hostile corpus

POLY_200 = r"\boxed{" + "+".join(f"{i}x^{{{i}}}" for i in range(1, 201)) + "}"

HOSTILE: dict[str, str] = {
    "power_tower": r"\boxed{9^{9^{9^{9}}}}",
    "power_tower_5": r"\boxed{10^{10^{10^{10^{10}}}}}",
    "two_tower": r"\boxed{2^{2^{2^{2^{2^{2}}}}}}",
    "factorial_of_googol": r"\boxed{(10^{100})!}",
    "factorial_1e5": r"\boxed{100000!}",
    "polynomial_200_terms": POLY_200,
    "nested_braces": "\\boxed{" + "{" * 2000 + "1" + "}" * 2000 + "}",
    "nested_fracs": "\\boxed{" + "\\frac{1}{" * 300 + "2" + "}" * 300 + "}",
    "nested_parens": "\\boxed{" + "(" * 1000 + "1" + ")" * 1000 + "}",
    "unbalanced_open": r"\boxed{\frac{1}{2",
    "unbalanced_mixed": "}}}}{{{{\\boxed{" + "{" * 5000,
    "string_100kB_text": "lorem ipsum 12 " * 7000,
    "string_100kB_digits": "\\boxed{" + "9" * 100_000 + "}",
    "string_100kB_sum": "1+" * 50_000 + "1",
    "odd_unicode": "答案是 \\boxed{½} \u202e\u200b 🤖 e\u0301 \\boxed{𝟓} \ud800",
    "null_bytes": "\x00\\boxed{5}\x00" + "\x00" * 1000,
    "only_null_bytes": "\x00" * 5000,
    "empty_box": r"\boxed{}",
    "matrix": r"\boxed{\begin{pmatrix}1&2\\3&4\end{pmatrix}}",
    "integral": r"\boxed{\int_0^\infty e^{-x^2} dx}",
    "divergent_sum": r"\boxed{\sum_{n=1}^{\infty} n}",
    "huge_float": r"\boxed{1e999999}",
    "division_by_zero": r"\boxed{\frac{1}{0}}",
    "dollar_storm": "$" * 5000,
    "backslash_storm": "\\" * 5001,
}


def _check_hostile(v: MathVerifier, text: str, bound: float) -> RewardBatch:
    t0 = time.monotonic()
    b = v.score([text], ["5"])
    elapsed = time.monotonic() - t0
    assert elapsed < bound, f"call took {elapsed:.1f}s, bound {bound:.1f}s"
    assert b.rewards[0] in (0.0, 1.0)
    return b


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_in_process_never_raises(inproc_fast: MathVerifier, name: str) -> None:
    # The in-process path only has math-verify's signal.alarm timeouts, which cannot interrupt work
    # inside C code, so no time bound is claimed for it (seen: 12.6 s on nested braces under load);
    # the bounded path is the process pool (the default, tested with its bound below).
    b = inproc_fast.score([HOSTILE[name]], ["5"])
    assert b.rewards[0] in (0.0, 1.0)


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_pool(pool_fast: MathVerifier, name: str) -> None:
    _check_hostile(pool_fast, HOSTILE[name], pool_bound(pool_fast))


def test_hostile_batch_pool_and_hostile_gold(pool_fast: MathVerifier) -> None:
    pool = pool_fast
    texts = list(HOSTILE.values()) + [r"\boxed{5}", r"\boxed{5}"]
    golds = ["5"] * len(HOSTILE) + [r"9^{9^{9^{9}}}", "\x00{{{"]
    t0 = time.monotonic()
    b = pool.score(texts, golds)
    elapsed = time.monotonic() - t0
    # Serial worst case spread over the workers, plus start-up allowance.
    bound = len(texts) * pool.item_timeout / pool.workers + STARTUP_ALLOWANCE_S
    assert elapsed < bound
    assert len(b.rewards) == len(texts)
    assert b.n_timeout >= 1  # e.g. the 200-term polynomial exceeds a 1 s parse timeout
    assert b.statuses[list(HOSTILE).index("null_bytes")] is RewardStatus.CORRECT
    assert b.rewards[-2:] == [0.0, 0.0]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.one_of(
            st.text(max_size=8),
            st.sampled_from(["\\boxed{", "{", "}", "^", "\\frac", "$", "9", "\\", "!", "(", ")", "\x00"]),
        ),
        max_size=40,
    ).map("".join)
)
def test_random_text_never_raises(pool_fast: MathVerifier, text: str) -> None:
    # The pool: hypothesis runs gc callbacks, where an in-process SIGALRM timeout would be swallowed.
    b = pool_fast.score([text], ["5"])
    assert b.rewards[0] in (0.0, 1.0)


# ------------------------------------------------------------------ pool robustness


class FaultyVerifier(MathVerifier):
    """Verifier whose workers hang or die on sentinel golds."""

    _item_fn = staticmethod(faulty_score_item)


def _worker_pids(v: MathVerifier) -> list[int]:
    pool = v._holder.pool
    return list(getattr(pool, "_processes", {}) or {}) if pool is not None else []


def test_hung_worker_times_out_and_does_not_block_later_calls() -> None:
    with FaultyVerifier(workers=2, parse_timeout=1, verify_timeout=1, item_timeout=2.0) as v:
        v.score([r"\boxed{0}"], ["0"])  # start the pool outside the timed region
        hung_pids = _worker_pids(v)
        t0 = time.monotonic()
        b = v.score([r"\boxed{1}", r"\boxed{2}", r"\boxed{3}", r"\boxed{4}"], ["1", HANG, "3", "4"])
        elapsed = time.monotonic() - t0
        assert b.statuses == [
            RewardStatus.CORRECT,
            RewardStatus.TIMEOUT,
            RewardStatus.CORRECT,
            RewardStatus.CORRECT,
        ]
        assert (b.n_timeout, b.n_error) == (1, 0)
        assert elapsed < v.item_timeout + STARTUP_ALLOWANCE_S
        assert v.n_pool_restarts == 1
        # The hung worker was killed and reaped.
        if os.path.isdir("/proc"):
            time.sleep(0.2)
            assert not any(os.path.exists(f"/proc/{pid}") for pid in hung_pids)
        # A later call is not blocked by the hung worker.
        t1 = time.monotonic()
        assert v.score_one(r"\boxed{5}", "5") == 1.0
        assert time.monotonic() - t1 < pool_bound(v)


def test_crashing_worker_marks_only_the_culprit() -> None:
    with FaultyVerifier(workers=2, parse_timeout=1, verify_timeout=1, item_timeout=5.0) as v:
        b = v.score([r"\boxed{1}", r"\boxed{2}", r"\boxed{3}"], ["1", CRASH, "3"])
        assert b.statuses == [RewardStatus.CORRECT, RewardStatus.ERROR, RewardStatus.CORRECT]
        assert (b.n_timeout, b.n_error) == (0, 1)
        assert v.score_one(r"\boxed{4}", "4") == 1.0


def test_pool_works_off_main_thread_but_in_process_does_not(pool: MathVerifier, inproc: MathVerifier) -> None:
    with ThreadPoolExecutor(max_workers=1) as ex:
        assert ex.submit(pool.score_one, r"\boxed{\frac12}", "0.5").result() == 1.0
        with pytest.raises(RuntimeError, match="main thread"):
            ex.submit(inproc.score_one, r"\boxed{1}", "1").result()
    assert threading.current_thread() is threading.main_thread()


def test_close_is_idempotent_and_final() -> None:
    v = MathVerifier(workers=1, parse_timeout=1, verify_timeout=1)
    assert v.score_one(r"\boxed{2}", "2") == 1.0
    pids = _worker_pids(v)
    v.close()
    v.close()
    if os.path.isdir("/proc"):
        assert not any(os.path.exists(f"/proc/{pid}") for pid in pids)
    with pytest.raises(RuntimeError, match="closed"):
        v.score_one("1", "1")


def test_worker_start_failure_is_a_clear_error() -> None:
    # 50 MB of address space is too little to import math-verify: workers die at start-up.
    v = MathVerifier(workers=1, memory_limit_mb=50, startup_timeout=60.0)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="failed to start.*workers=0"):
        v.score_one(r"\boxed{1}", "1")
    assert time.monotonic() - t0 < 30.0  # fails fast, not after startup_timeout
    v.close()
