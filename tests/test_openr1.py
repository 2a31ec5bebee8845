"""OpenR1-Math-46k-style parquet loader (exgrpo.tasks.openr1) on small files built in tmp_path."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from exgrpo.tasks.openr1 import OpenR1FormatError, OpenR1Task, OpenR1TaskConfig, load_openr1  # noqa: E402

SYSTEM = "Your task is to follow a systematic, thorough reasoning process before providing the final solution."
QUESTIONS = [
    ("What is $1+1$?", "2"),
    ("Compute $\\frac{1}{2}+\\frac{1}{4}$. " + "Show all steps carefully. " * 30, "\\frac{3}{4}"),
    ("Solve $x^2=9$ for $x>0$.", "3"),
    ("Find $\\gcd(12, 18)$.", "6"),
]


def _frame(n: int = len(QUESTIONS)) -> pd.DataFrame:
    rows = []
    for i, (q, gt) in enumerate(QUESTIONS[:n]):
        rows.append(
            {
                "data_source": "openr1",
                "prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}],
                "target": [{"role": "assistant", "content": f"<think>\nthink {i}\n</think>\n\\boxed{{{gt}}}"}],
                "reward_model": {"ground_truth": gt, "style": "rule"},
                "extra_info": {"index": 100 + i, "split": "train"},
            }
        )
    return pd.DataFrame(rows)


@pytest.fixture
def parquet(tmp_path):
    path = tmp_path / "openr1.parquet"
    _frame().to_parquet(path, index=False)
    return path


class ChatMLChars:
    """A character-level tokenizer with a ChatML chat template (stands in for SmolLM2's)."""

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        assert add_generation_prompt and tokenize
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return {"input_ids": [ord(c) for c in text + "<|im_start|>assistant\n"]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(map(chr, ids))


def test_schema_is_nested_structs(parquet):
    schema = pq.read_schema(parquet)
    assert pa.types.is_struct(schema.field("reward_model").type)
    assert pa.types.is_list(schema.field("prompt").type)


def test_loads_questions_golds_and_ids(parquet):
    task = load_openr1(parquet)
    assert len(task) == 4 and task.n_rows == 4 and task.n_filtered == 0
    assert task.questions == [q for q, _ in QUESTIONS]
    assert task.golds == [g for _, g in QUESTIONS]
    assert task.data_sources == ["openr1"] * 4
    assert task.indices == [100, 101, 102, 103]
    assert task.uids == task.rows == [0, 1, 2, 3]
    assert task.messages[0][0] == {"role": "system", "content": SYSTEM}
    assert task.targets[0][0]["content"].startswith("<think>")
    assert task.train_ids == [0, 1, 2, 3] and task.val_ids == []
    with pytest.raises(ValueError, match="tokenizer"):
        task.prompts([0])


def test_chat_prompts_and_length_filter(parquet):
    tok = ChatMLChars()
    full = load_openr1(parquet, tokenizer=tok)
    text = tok.decode(full.prompts([0])[0])
    assert text.startswith(f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\nWhat is $1+1$?")
    assert text.endswith("<|im_start|>assistant\n")
    assert full.prompt_lengths[1] > 700 > max(full.prompt_lengths[i] for i in (0, 2, 3))
    short = load_openr1(parquet, tokenizer=tok, max_prompt_length=400)
    assert short.n_filtered == 1 and short.rows == [0, 2, 3]
    assert short.uids == [0, 1, 2]  # dataframe_uid = row position after filtering (reference)
    assert short.golds == ["2", "3", "6"] and short.indices == [100, 102, 103]
    no_sys = load_openr1(parquet, tokenizer=tok, remove_system=True)
    assert tok.decode(no_sys.prompts([0])[0]).startswith("<|im_start|>user\n")
    with pytest.raises(ValueError, match="needs a tokenizer"):
        load_openr1(parquet, max_prompt_length=400)


def test_flat_column_names_and_uid_column(tmp_path):
    df = _frame()
    df["reward_model.ground_truth"] = [r["ground_truth"] for r in df.pop("reward_model")]
    df = df.drop(columns=["extra_info", "target"])
    df["dataframe_uid"] = [7, 5, 3, 1]
    path = tmp_path / "flat.parquet"
    df.to_parquet(path, index=False)
    task = load_openr1(path)
    assert task.golds == [g for _, g in QUESTIONS] and task.uids == [7, 5, 3, 1]
    assert task.indices == [None] * 4 and task.targets == [None] * 4


def test_held_out_subset(parquet):
    task = OpenR1Task(OpenR1TaskConfig(path=str(parquet), n_val=1, split_seed=3))
    assert len(task.val_ids) == 1 and sorted(task.train_ids + task.val_ids) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="n_val"):
        OpenR1Task(OpenR1TaskConfig(path=str(parquet), n_val=4))


# ------------------------------------------------------------------------------------------------ malformed
def _write(tmp_path, df, name="bad.parquet"):
    path = tmp_path / name
    df.to_parquet(path, index=False)
    return path


def test_missing_column_names_column_and_file(tmp_path):
    path = _write(tmp_path, _frame().drop(columns=["reward_model"]))
    with pytest.raises(OpenR1FormatError, match=r"bad\.parquet: missing column 'reward_model\.ground_truth'"):
        load_openr1(path)
    path = _write(tmp_path, _frame().drop(columns=["prompt"]), "noprompt.parquet")
    with pytest.raises(OpenR1FormatError, match=r"noprompt\.parquet: missing column 'prompt'"):
        load_openr1(path)


def test_struct_without_ground_truth_and_wrong_type(tmp_path):
    df = _frame()
    df["reward_model"] = [{"style": "rule"}] * len(df)
    with pytest.raises(OpenR1FormatError, match="expected a struct with field 'ground_truth'"):
        load_openr1(_write(tmp_path, df))
    df["reward_model"] = ["2"] * len(df)
    with pytest.raises(OpenR1FormatError, match="has type (large_)?string"):
        load_openr1(_write(tmp_path, df, "str.parquet"))


def test_malformed_cells_name_the_row(tmp_path):
    df = _frame()
    df["prompt"] = df["prompt"].astype(object)
    df.at[2, "prompt"] = [{"role": "system", "content": SYSTEM}]
    with pytest.raises(OpenR1FormatError, match="row 2: prompt has no user message"):
        load_openr1(_write(tmp_path, df))
    df = _frame()
    df["reward_model"] = [{"ground_truth": g, "style": "rule"} for g in ("2", None, "3", "6")]
    with pytest.raises(OpenR1FormatError, match="row 1: reward_model.ground_truth is missing"):
        load_openr1(_write(tmp_path, df, "nullgt.parquet"))
    df = _frame()
    df["prompt"] = [q for q, _ in QUESTIONS]  # plain strings instead of message lists
    with pytest.raises(OpenR1FormatError, match="row 0: prompt must be a list of {role, content} messages, got str"):
        load_openr1(_write(tmp_path, df, "strprompt.parquet"))


def test_not_parquet_and_missing_file(tmp_path):
    path = tmp_path / "junk.parquet"
    path.write_text("not a parquet file")
    with pytest.raises(OpenR1FormatError, match=r"junk\.parquet: cannot be read as parquet"):
        load_openr1(path)
    with pytest.raises(OpenR1FormatError, match="nope.parquet: no such file"):
        load_openr1(tmp_path / "nope.parquet")


# ------------------------------------------------------------------------------------------------ rewards
def test_math_verify_rewards(parquet):
    pytest.importorskip("math_verify")
    tok = ChatMLChars()
    task = load_openr1(parquet, tokenizer=tok)
    texts = ["so \\boxed{2}", "\\boxed{0.75}", "\\boxed{-3}", "I think it is 6", "\\boxed{6}"]
    assert task.score_texts([0, 1, 2, 3, 3], texts) == [1.0, 1.0, 0.0, 0.0, 1.0]  # strict: no box, no reward
    tokens = torch.tensor([[ord(c) for c in "x \\boxed{2}"]])
    assert task.rewards([0], tokens, torch.ones_like(tokens, dtype=torch.bool)).tolist() == [1.0]
    think = load_openr1(parquet, tokenizer=tok, require_think=True)
    assert think.score_texts([0, 0, 0], ["\\boxed{2}", "a </think> \\boxed{2}", "\\boxed{2} </think> 5"]) == [
        0.0,
        1.0,
        0.0,
    ]
