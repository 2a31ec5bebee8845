"""The multiple-choice grader: the option letter a response commits to, and nothing for hedging."""

import pytest

from exgrpo.rewards.choice import LetterGrader, extract_choice
from exgrpo.rewards.grading import RewardStatus


@pytest.mark.parametrize("response,letter", [
    ("so the answer is \\boxed{B}", "B"),
    ("\\boxed{(C)}", "C"),
    ("\\boxed{D. survival rate}", "D"),
    ("first \\boxed{A} then, on reflection, \\boxed{C}", "C"),  # the last box
    ("Answer: B", "B"),
    ("The answer is (A).", "A"),
    ("I think the answer is D", "D"),
    ("A, B, C or D, hard to say", None),  # listing options is not an answer
    ("\\boxed{A, B}", None),  # two letters
    ("\\boxed{}", None),
    ("\\boxed{Paris}", None),  # text, not a letter
    ("the answer is a bit unclear", None),  # a lower-case word, not an option
    ("Answer: E", None),  # not one of the options
    ("B", None),  # a bare letter is not a stated answer
    ("", None),
    (None, None),
])
def test_extract_choice(response, letter):
    assert extract_choice(response, "ABCD") == letter


def test_letter_grader_statuses_and_labels():
    res = LetterGrader().score(["\\boxed{B}", "\\boxed{A}", "no idea", "Answer: E"], ["B", "B", "B", "E"],
                               labels=[["A", "B", "C", "D"]] * 3 + [["A", "B", "C", "D", "E"]])
    assert res.rewards == [1.0, 0.0, 0.0, 1.0]
    assert res.statuses == [RewardStatus.CORRECT, RewardStatus.WRONG, RewardStatus.NO_ANSWER, RewardStatus.CORRECT]
    bad = LetterGrader().score(["\\boxed{A}"], ["Paris"])
    assert bad.statuses == [RewardStatus.BAD_GOLD] and bad.rewards == [0.0]
