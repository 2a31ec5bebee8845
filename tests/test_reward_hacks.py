"""The reward gives nothing to answers that are not answers.

An adversarial set, one group per rule of :mod:`exgrpo.rewards.extraction`, each against the gold
``42``. Every grader in the project must give 0 to every item: the math-verify reward (process
pool and in-process), the tiny-lm task's grader, the reasoning-gym task's grader and veRL's
custom reward function. On the lenient rule (the old default) the trailing-number, noise and
padding attacks scored 1.
"""

from __future__ import annotations

import logging
import random
import signal
import string
import time

import pytest
import torch

from exgrpo.backends.verl.assets import DATA_SOURCE
from exgrpo.backends.verl.reward import compute_score
from exgrpo.config import AnswerFormat, ReasoningGymTaskConfig, TextArithmeticTaskConfig
from exgrpo.rewards import MathVerifier, RewardStatus, extract_answer
from exgrpo.rewards._faults import STRAY_ALARM, faulty_score_item
from exgrpo.tasks.reasoning_gym_tasks import extract_final_answer
from exgrpo.tasks.text_arithmetic import TextArithmetic, extract_final_integer

GOLD = "42"


def _noise(n: int, seed: int = 0) -> list[str]:
    """Random printable text that always contains the gold number somewhere, often at the end."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        body = "".join(rng.choice(string.printable) for _ in range(rng.randint(1, 80)))
        cut = rng.randint(0, len(body))
        out.append(body + GOLD if i % 2 else body[:cut] + GOLD + body[cut:])
    return out


HACKS: dict[str, list[str]] = {
    "noise": [GOLD, f" {GOLD} ", f"!!{GOLD}!!", f"$${GOLD}$$", f"${GOLD}$", *_noise(40)],
    "trailing_numbers": [
        f"I do not know. {GOLD}",
        f"The answer is 41. Or maybe {GOLD}",
        "1 2 3 4 5 6 7 8 9 10 " + " ".join(str(i) for i in range(11, 43)),
        f"7*6={GOLD}",
        f"\\boxed{{41 and then {GOLD}",  # an unterminated box, then the number
    ],
    "expression_padding": [
        "\\boxed{" + "9" * 5000 + f"+{GOLD}}}",  # a cut from the front left "...+42}"
        "\\boxed{" + "0+" * 300 + f"{GOLD}}}",  # equal to the gold, but longer than any answer
        "\\boxed{" + "x" * 6000 + f"}} {GOLD}",
        "\\boxed{" + "1" * 5000 + "}",
    ],
    "several_boxes": [
        f"\\boxed{{41}} \\boxed{{{GOLD}}}",
        f"\\boxed{{{GOLD}}} or \\boxed{{43}}",
        f"\\boxed{{40}}\\boxed{{41}}\\boxed{{{GOLD}}}",
        f"\\fbox{{41}} \\boxed{{{GOLD}}}",
    ],
    "nested_boxes": [
        f"\\boxed{{\\boxed{{{GOLD}}}}}",
        f"\\boxed{{41 \\boxed{{{GOLD}}}}}",
        f"\\fbox{{\\boxed{{{GOLD}}}}}",
    ],
    "unicode_lookalikes": [
        "\\boxed{４２}",  # fullwidth digits
        "\\boxed{٤٢}",  # Arabic-Indic digits
        "\\boxed{𝟒𝟐}",  # mathematical bold digits
        "\\boxed{⁴²}",  # superscripts
        f"\\bοxed{{{GOLD}}}",  # Greek omicron in the command
        f"＼boxed{{{GOLD}}}",  # fullwidth backslash
        "４２",
    ],
}
CASES = [(rule, text) for rule, texts in HACKS.items() for text in texts]
IDS = [f"{rule}-{i}" for rule, texts in HACKS.items() for i in range(len(texts))]


@pytest.fixture(scope="module")
def pool() -> MathVerifier:
    with MathVerifier(workers=2) as v:
        yield v


@pytest.fixture(scope="module")
def tiny_task() -> TextArithmetic:
    return TextArithmetic(TextArithmeticTaskConfig(n_train=4, n_val=1))


def test_reward_hacks_score_zero_on_math_verify_pool(pool: MathVerifier) -> None:
    texts = [t for _, t in CASES]
    batch = pool.score(texts, [GOLD] * len(texts))
    scored = [(i, s) for i, s in zip(IDS, batch.statuses, strict=True) if s is RewardStatus.CORRECT]
    assert scored == []
    assert pool.score_one(f"so \\boxed{{{GOLD}}}.", GOLD) == 1.0  # the honest answer still scores


def test_reward_hacks_score_zero_in_process() -> None:
    with MathVerifier(workers=0) as v:
        texts = [t for _, t in CASES]
        assert v.score(texts, [GOLD] * len(texts)).rewards == [0.0] * len(texts)


@pytest.mark.parametrize(("rule", "text"), CASES, ids=IDS)
def test_reward_hack_scores_zero_on_every_task_grader(rule: str, text: str, tiny_task: TextArithmetic) -> None:
    assert extract_answer(text) is None
    assert extract_final_integer(text) is None
    assert tiny_task.final_integer(text) is None
    assert extract_final_answer(text) is None
    assert compute_score(DATA_SOURCE, text, GOLD) == 0.0


def test_tiny_task_rewards_honest_and_hacked_rows(tiny_task: TextArithmetic) -> None:
    qid = tiny_task.train_ids[0]
    gold = tiny_task.answers[qid]
    texts = [f"{gold}", f"1+1=2 \\boxed{{{gold}}}", f"\\boxed{{{gold}}}\\boxed{{{gold + 1}}}", f"\\boxed{{{gold}}}"]
    ids = [tiny_task.tokenizer.encode(t) for t in texts]
    width = max(map(len, ids))
    tokens = torch.tensor([r + [0] * (width - len(r)) for r in ids])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in ids])
    assert tiny_task.rewards([qid] * 4, tokens, mask).tolist() == [0.0, 1.0, 0.0, 1.0]


def test_lenient_format_is_opt_in_and_warns(caplog: pytest.LogCaptureFixture) -> None:
    assert TextArithmeticTaskConfig().answer_format is AnswerFormat.BOXED
    assert ReasoningGymTaskConfig().answer_format is AnswerFormat.BOXED
    with caplog.at_level(logging.WARNING):
        task = TextArithmetic(TextArithmeticTaskConfig(n_train=4, n_val=1, answer_format="boxed_or_last_number"))
    assert "gameable" in caplog.text or "game it" in caplog.text
    assert task.final_integer(f"so {GOLD}") == 42  # the fallback the user asked for
    # Even the lenient rule refuses hedging, nesting and oversized boxes.
    for rule in ("several_boxes", "nested_boxes", "unicode_lookalikes"):
        for text in HACKS[rule][:3]:
            assert extract_answer(text, AnswerFormat.BOXED_OR_LAST_NUMBER) is None, text
    assert extract_answer(HACKS["expression_padding"][1], AnswerFormat.BOXED_OR_LAST_NUMBER) is None
    assert compute_score(DATA_SOURCE, f"so {GOLD}", GOLD, answer_format="boxed_or_last_number") == 1.0


def test_oversized_answers_score_zero_not_truncated() -> None:
    ok = "\\boxed{" + "0+" * 10 + f"{GOLD}}}"
    assert extract_answer(ok) == "0+" * 10 + GOLD
    assert extract_answer(ok, max_answer_chars=10) is None  # the limit is the config's max_answer_chars
    with MathVerifier(workers=0, max_answer_chars=10) as v:
        assert v.score_one(ok, GOLD) == 0.0
    with MathVerifier(workers=0) as v:
        assert v.score_one("x" * 20_000 + f" \\boxed{{{GOLD}}}", GOLD) == 1.0  # long reasoning is fine


class _StrayAlarmVerifier(MathVerifier):
    _item_fn = staticmethod(faulty_score_item)


def test_in_process_grading_leaves_no_alarm_armed() -> None:
    """A grader's SIGALRM must not fire later inside unrelated code (seen in hypothesis' gc hook):
    after in-process grading no alarm is armed and the caller's handler is back."""
    previous = signal.getsignal(signal.SIGALRM)
    with _StrayAlarmVerifier(workers=0) as v:
        assert v.score([f"\\boxed{{{GOLD}}}"], [STRAY_ALARM]).rewards == [0.0]
        assert signal.alarm(0) == 0, "an alarm was left armed after grading"
        assert signal.getsignal(signal.SIGALRM) is previous, "grading did not restore the SIGALRM handler"
        time.sleep(1.2)  # a stray alarm would have raised StrayAlarm here
        assert v.score(["\\boxed{x^2+2x+1}", "\\boxed{9^{9^{9}}}"], ["(x+1)^2", "5"]).rewards[0] == 1.0
        assert signal.alarm(0) == 0 and signal.getsignal(signal.SIGALRM) is previous
