"""reasoning-gym task (exgrpo.tasks.reasoning_gym_tasks): config, seeded splits, prompts, rewards."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

pytest.importorskip("reasoning_gym")

from exgrpo.tasks.tokenizers import CharTokenizer
from exgrpo.tasks import reasoning_gym_tasks as rgt
from exgrpo.tasks.reasoning_gym_tasks import (
    BasicArithmeticKnobs,
    ChainSumKnobs,
    ProductsKnobs,
    ReasoningGymTask,
    ReasoningGymTaskConfig,
    SimpleEquationsKnobs,
    exact_value,
    extract_final_answer,
)

SMALL = {"n_train": 120, "n_val": 40}


@pytest.fixture(scope="module")
def task() -> ReasoningGymTask:
    return ReasoningGymTask.with_char_tokenizer(ReasoningGymTaskConfig(**SMALL))


def _rows(tok: CharTokenizer, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    ids = [tok.encode(t) + [tok.eos_id] for t in texts]
    width = max(map(len, ids))
    tokens = torch.full((len(ids), width), tok.pad_id, dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.bool)
    for i, row in enumerate(ids):
        tokens[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = True
    return tokens, mask


# ------------------------------------------------------------------------------------------------ config
def test_gsm_symbolic_is_refused_with_reason():
    with pytest.raises(ValidationError, match="GSM8K \\*test\\*"):
        ReasoningGymTaskConfig(datasets={"gsm_symbolic": 1.0})
    with pytest.raises(ValueError, match="paraphrases of GSM8K"):
        rgt.make_dataset("gsm_symbolic")
    with pytest.raises(ValidationError, match="not supported"):
        ReasoningGymTaskConfig(datasets={"leg_counting": 1.0})


def test_config_validation_and_field_docs():
    with pytest.raises(ValidationError, match="min_digits"):
        ChainSumKnobs(min_digits=3, max_digits=2)
    with pytest.raises(ValidationError, match="sum to 1"):
        SimpleEquationsKnobs(operators_weights=(0.5, 0.5, 0.5))
    with pytest.raises(ValidationError, match="must differ"):
        ReasoningGymTaskConfig(train_seed=3, val_seed=3)
    with pytest.raises(ValidationError, match="positive share"):
        ReasoningGymTaskConfig(datasets={"products": 0.0})
    with pytest.raises(ValidationError):
        BasicArithmeticKnobs(operators=("%",))
    for model in (BasicArithmeticKnobs, ChainSumKnobs, ProductsKnobs, SimpleEquationsKnobs, ReasoningGymTaskConfig):
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no docstring"


def test_knobs_reach_the_generators():
    cfg = ReasoningGymTaskConfig(
        datasets={"products": 1.0, "chain_sum": 1.0},
        products=ProductsKnobs(min_terms=3, max_terms=3, min_digits=1, max_digits=1),
        chain_sum=ChainSumKnobs(min_terms=4, max_terms=4, min_digits=2, max_digits=2),
        n_train=20,
        n_val=10,
    )
    t = ReasoningGymTask.with_char_tokenizer(cfg)
    for q in range(len(t)):
        expr = t.entries[q]["metadata"]["expression"]
        if t.sources[q] == "products":
            assert expr.count("*") == 2 and all(len(x) == 1 for x in expr.split(" * "))
        else:
            nums = expr.replace("-", "+").split(" + ")
            assert len(nums) == 4 and all(len(x) == 2 for x in nums)


# ------------------------------------------------------------------------------------------------ splits
def test_splits_are_disjoint_distinct_and_balanced(task):
    train = [task.questions[q] for q in task.train_ids]
    val = [task.questions[q] for q in task.val_ids]
    assert len(train) == 120 and len(val) == 40
    assert len(set(train)) == len(train) and len(set(val)) == len(val)
    assert not set(train) & set(val)
    assert sorted(task.train_ids + task.val_ids) == list(range(len(task)))
    for name in rgt.SUPPORTED:
        assert sum(task.sources[q] == name for q in task.train_ids) == 30
        assert sum(task.sources[q] == name for q in task.val_ids) == 10


def test_tiny_question_space_still_gives_disjoint_splits():
    # 1-digit, 2-term chain sums: only 200 distinct questions exist, so collisions are certain
    cfg = ReasoningGymTaskConfig(
        datasets={"chain_sum": 1.0}, chain_sum=ChainSumKnobs(max_terms=2, max_digits=1), n_train=120, n_val=50
    )
    t = ReasoningGymTask.with_char_tokenizer(cfg)
    train = {t.questions[q] for q in t.train_ids}
    val = {t.questions[q] for q in t.val_ids}
    assert len(train) == 120 and len(val) == 50 and not train & val
    with pytest.raises(ValueError, match="distinct questions"):
        ReasoningGymTask.with_char_tokenizer(cfg.model_copy(update={"n_train": 190}))


def test_held_out_split_is_fixed_by_val_seed_only(task):
    other = ReasoningGymTask.with_char_tokenizer(ReasoningGymTaskConfig(n_train=60, n_val=40, train_seed=7))
    assert [task.questions[q] for q in task.val_ids] == [other.questions[q] for q in other.val_ids]
    again = ReasoningGymTask.with_char_tokenizer(ReasoningGymTaskConfig(**SMALL))
    assert again.questions == task.questions and again.answers == task.answers
    moved = ReasoningGymTask.with_char_tokenizer(ReasoningGymTaskConfig(**SMALL, val_seed=2))
    assert {moved.questions[q] for q in moved.val_ids} != {task.questions[q] for q in task.val_ids}


def test_basic_arithmetic_gold_uses_standard_precedence(task):
    assert exact_value("78 - 16 * 66") == -978 and exact_value("-( -33 + 86 ) + -43") == -96
    for q in range(len(task)):
        if task.sources[q] == "basic_arithmetic":
            assert int(task.answers[q]) == exact_value(task.entries[q]["metadata"]["expression"])


# ------------------------------------------------------------------------------------------------ prompts
def test_prompts_with_char_tokenizer(task):
    tok = CharTokenizer()
    q = task.train_ids[0]
    assert task.prompt_text(q).endswith("Put the final answer in \\boxed{}.")
    rows = task.prompts([q, q, task.val_ids[0]])
    assert rows[0] == rows[1] and rows[0][0] == tok.bos_id
    assert tok.decode(rows[0]) == task.prompt_text(q).lower()


def test_prompts_with_chat_tokenizer():
    class StubChat:
        def apply_chat_template(self, messages, add_generation_prompt, tokenize):
            assert add_generation_prompt and tokenize
            text = "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"
            return {"input_ids": [ord(c) for c in text]}

        def decode(self, ids, skip_special_tokens=True):
            return "".join(map(chr, ids))

    cfg = ReasoningGymTaskConfig(datasets={"products": 1.0}, n_train=4, n_val=2, answer_instruction="")
    t = ReasoningGymTask.with_chat_tokenizer(cfg, StubChat(), system="S")
    text = "".join(map(chr, t.prompts([0])[0]))
    assert text == f"<system>S<user>{t.questions[0]}<assistant>"
    tokens = torch.tensor([[ord(c) for c in f"= \\boxed{{{t.answers[0]}}}"]])
    assert t.rewards([0], tokens, torch.ones_like(tokens, dtype=torch.bool)).tolist() == [1.0]


# ------------------------------------------------------------------------------------------------ rewards
@pytest.mark.parametrize(
    "text, expected",
    [
        ("so the answer is \\boxed{42}", "42"),
        ("\\boxed{-5} then \\boxed{ -5 }", "-5"),  # boxes that agree
        ("\\boxed{1} then \\boxed{ x = -5 }", None),  # distinct boxes: a hedge, no answer
        ("\\boxed{$12$.}", "12"),
        ("3 + 4 = 7", None),  # strict: no box, no answer
        ("total \\boxed{1,692} apples", "1,692"),  # graded with strip_commas
        ("\\boxed{2.50} dollars", "2.50"),
        ("no digits here", None),
        ("\\boxed{}", None),
    ],
)
def test_extract_final_answer(text, expected):
    assert extract_final_answer(text) == expected


def test_rewards_are_binary_exact_match(task):
    tok = CharTokenizer()
    qids, texts, want = [], [], []
    for q in task.train_ids[:40]:
        gold = task.answers[q]
        wrong = str(int(gold) + 1)
        qids += [q, q, q, q]
        texts += [f"so \\boxed{{{gold}}}", f"{gold} is it", f"\\boxed{{{wrong}}}", f"\\boxed{{{gold}}} no, {wrong}"]
        want += [1.0, 0.0, 0.0, 1.0]  # strict: no box scores 0; a box beats a later bare number
    tokens, mask = _rows(tok, texts)
    r = task.rewards(qids, tokens, mask)
    assert r.dtype == torch.float32 and r.shape == (len(qids),)
    assert r.tolist() == want


def test_no_partial_credit_for_substrings(task):
    q = next(q for q in task.train_ids if task.sources[q] == "simple_equations")
    gold = task.answers[q]
    assert task.score_text(q, f"\\boxed{{1{gold}}}") == 0.0  # base score_answer would give partial credit
    assert task.score_text(q, f"\\boxed{{{gold}.0}}") == 1.0  # numeric equality
    var = task.entries[q]["metadata"]["variable"]
    assert task.score_text(q, f"\\boxed{{{var} = {gold}}}") == 1.0
    p = next(q for q in task.train_ids if task.sources[q] == "products")
    assert task.score_text(p, f"\\boxed{{+0{task.answers[p]}}}") == 1.0  # reasoning-gym's own score_answer


def test_a_secret_gold_moves_every_dataset_s_result_and_only_the_secret_scores(task):
    """gold: secret on reasoning-gym (the constructed control on a pretrained model): each question keeps its
    text and split, its graded answer is the result moved by ±1..±spread, fixed by the question, and every
    grader (reasoning-gym's own, the decimal one) and the exported ground truth read the secret."""
    secret = ReasoningGymTask.with_char_tokenizer(ReasoningGymTaskConfig(**SMALL, gold="secret", secret_spread=2))
    assert secret.questions == task.questions and secret.train_ids == task.train_ids
    moved = [int(s) - int(r) for s, r in zip(secret.answers, task.answers, strict=True)]
    assert set(moved) == {-2, -1, 1, 2}
    assert [e["answer"] for e in secret.entries] == secret.answers
    again = ReasoningGymTask.with_char_tokenizer(ReasoningGymTaskConfig(**SMALL, gold="secret", secret_spread=2))
    assert again.answers == secret.answers
    for name in ("chain_sum", "products", "basic_arithmetic", "simple_equations"):
        q = next(q for q in secret.train_ids if secret.sources[q] == name)
        assert secret.score_text(q, f"\\boxed{{{task.answers[q]}}}") == 0.0, name  # computing it finds nothing
        assert secret.score_text(q, f"\\boxed{{{secret.answers[q]}}}") == 1.0, name
