"""Your data: ``task.kind: file``, questions from a parquet or JSONL file in veRL's RLHFDataset layout,
graded by math-verify. Bad rows are named by row number in one line before training starts; the
held-out questions are a file of their own or a split of the file; the veRL backend's data derive from
the same field."""

from __future__ import annotations


import pytest
import yaml

from exgrpo.cli import main
from exgrpo.config import ConfigError, load_experiment
from exgrpo.tasks.openr1 import OpenR1Task
from exgrpo.tasks.rlhf_file import check_task_files, read_questions

from datafiles import arithmetic_rows, write_jsonl, write_parquet


class ChatChars:
    """A character tokenizer with a chat template (stands in for a model's own)."""

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        text = "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(map(chr, ids))


def _file_cfg(**task):
    return load_experiment(None, {"tier": "hf", "policy.path": "/m", **{f"task.{k}": v for k, v in task.items()}})


# ------------------------------------------------------------------------------------------------ reading
@pytest.mark.parametrize("write", [write_parquet, write_jsonl])
def test_parquet_and_jsonl_read_the_same_questions(tmp_path, write):
    path = write(tmp_path / f"q{'.parquet' if write is write_parquet else '.jsonl'}", arithmetic_rows(5, start=10))
    questions = read_questions(path)
    assert [q.gold for q in questions] == ["6", "8", "10", "12", "7"]
    assert questions[0].messages == [{"role": "user", "content": "What is 4 + 2? Put the final answer in \\boxed{}."}]
    assert [q.index for q in questions] == [10, 11, 12, 13, 14]
    assert {q.data_source for q in questions} == {"arith"}


def test_the_held_out_questions_are_a_file_of_their_own_or_a_split(tmp_path):
    train = write_parquet(tmp_path / "train.parquet", arithmetic_rows(6))
    val = write_jsonl(tmp_path / "val.jsonl", arithmetic_rows(3, start=100))
    task = OpenR1Task(_file_cfg(path=str(train), val_path=str(val)).task, tokenizer=ChatChars())
    assert task.train_ids == [0, 1, 2, 3, 4, 5] and task.val_ids == [6, 7, 8]
    assert [task.golds[q] for q in task.val_ids] == [q.gold for q in read_questions(val)]
    split = OpenR1Task(_file_cfg(path=str(train), n_val=2).task, tokenizer=ChatChars())
    assert len(split.train_ids) == 4 and len(split.val_ids) == 2 and not set(split.train_ids) & set(split.val_ids)
    # graded by math-verify against reward_model.ground_truth
    pytest.importorskip("math_verify")
    q = task.val_ids[0]
    assert task.score_texts([q, q], [f"so \\boxed{{{task.golds[q]}}}", "\\boxed{-1}"]) == [1.0, 0.0]


def test_a_file_task_needs_held_out_questions_and_one_source_of_them():
    with pytest.raises(ConfigError, match=r"task.kind=file needs held-out questions to evaluate on: set task.val_path"):
        _file_cfg(path="train.parquet")
    with pytest.raises(ConfigError, match=r"val_path and n_val=4 both name held-out questions; set one"):
        _file_cfg(path="train.parquet", val_path="val.parquet", n_val=4)
    with pytest.raises(ConfigError, match=r"task.path: .*'train.csv' is not a .parquet or .jsonl file"):
        _file_cfg(path="train.csv", n_val=1)


def test_the_sample_experiment_reads_the_files_shipped_beside_it():
    from exgrpo.policies.inputs import check_inputs

    cfg = load_experiment("experiments/smollm2-file.yaml")
    assert (cfg.policy.path, cfg.task.kind) == ("smollm2", "file")
    check_inputs(cfg)
    assert [len(read_questions(p)) for p in (cfg.task.path, cfg.task.val_path)] == [64, 16]


# ------------------------------------------------------------------------------------------------ bad rows
def _bad_rows() -> list[dict]:
    rows = arithmetic_rows(8)
    del rows[1]["reward_model"]  # missing field
    rows[2]["prompt"] = []  # empty prompt
    rows[3]["reward_model"]["ground_truth"] = 42  # a non-string answer
    rows[4]["data_source"] = None
    rows[5]["prompt"] = [{"role": "system", "content": "Be brief."}]  # no user message
    rows[6]["prompt"] = [{"role": "user"}]  # a message without content
    return rows


def test_bad_jsonl_rows_are_named_by_row_number_in_one_line(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", _bad_rows())
    with pytest.raises(ConfigError) as err:
        read_questions(path, field="task.path")
    (line,) = str(err.value).splitlines()
    assert line.startswith(f"task.path={path}: 6 of 8 rows are not in veRL's RLHFDataset layout")
    for row, why in [(1, "reward_model.ground_truth is missing"), (2, "prompt is empty"),
                     (3, "reward_model.ground_truth is 42 (int), not a string"), (4, "data_source is missing"),
                     (5, "prompt has no user message")]:
        assert f"row {row}: {why}" in line, line
    assert "and 1 more" in line and "row 0" not in line and "row 7" not in line


def test_bad_parquet_rows_and_a_missing_column_are_named_in_one_line(tmp_path):
    rows = arithmetic_rows(4)
    rows[2]["reward_model"]["ground_truth"] = " "
    path = write_parquet(tmp_path / "bad.parquet", rows)
    with pytest.raises(ConfigError) as err:
        read_questions(path, field="task.val_path")
    (line,) = str(err.value).splitlines()
    assert line.startswith(f"task.val_path={path}: 1 of 4 rows are not in veRL's RLHFDataset layout")
    assert "row 2: reward_model.ground_truth is empty" in line
    for row in rows:
        del row["data_source"]
    path = write_parquet(tmp_path / "nosource.parquet", rows)
    with pytest.raises(ConfigError, match=r"nosource.parquet: missing column 'data_source' \(required: data_source, "
                                          r"prompt, reward_model.ground_truth; found: .*\)$"):
        read_questions(path)


def test_unreadable_and_missing_files_are_one_line(tmp_path):
    (tmp_path / "junk.jsonl").write_text('{"prompt": []}\nnot json\n')
    with pytest.raises(ConfigError, match=r"junk.jsonl: 2 of 2 rows .*row 1: not a JSON object"):
        read_questions(tmp_path / "junk.jsonl")
    (tmp_path / "junk.parquet").write_text("not parquet")
    with pytest.raises(ConfigError, match=r"junk.parquet: cannot be read as parquet"):
        read_questions(tmp_path / "junk.parquet")
    with pytest.raises(ConfigError, match=r"task.path=.*nope.parquet: no such file"):
        read_questions(tmp_path / "nope.parquet", field="task.path")


def test_check_task_files_reads_both_files(tmp_path):
    train = write_parquet(tmp_path / "train.parquet", arithmetic_rows(4))
    val = write_jsonl(tmp_path / "val.jsonl", _bad_rows())
    check_task_files(_file_cfg(path=str(train), n_val=1).task)
    with pytest.raises(ConfigError, match=r"^task.val_path=.*val.jsonl: 6 of 8 rows"):
        check_task_files(_file_cfg(path=str(train), val_path=str(val)).task)


def test_train_refuses_bad_rows_with_exit_2_and_one_line_before_any_work(tmp_path, capsys):
    data = write_jsonl(tmp_path / "bad.jsonl", _bad_rows())
    config = tmp_path / "mine.yaml"
    config.write_text(yaml.safe_dump({"name": "mine", "tier": "hf", "task": {"path": str(data), "n_val": 2}}))
    out = tmp_path / "runs"
    assert main(["train", str(config), "--no-tracking", "--no-progress", "--output-dir", str(out)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: task.path={data}: 6 of 8 rows are not in veRL's RLHFDataset layout")
    assert not out.exists()


# ------------------------------------------------------------------------------------------------ veRL
def test_the_verl_overrides_take_the_data_from_the_task_file(tmp_path):
    """The task's file is the veRL run's one data source: its rows (the same train/held-out split as
    the native task) are written as veRL parquet, and the composed config reads those files."""
    pytest.importorskip("verl")
    import pandas as pd

    from exgrpo.backends.verl.assets import write_dataset
    from exgrpo.backends.verl.overrides import RunPaths, compose, hydra_overrides

    source = write_jsonl(tmp_path / "mine.jsonl", arithmetic_rows(8, start=50))
    cfg = load_experiment(None, {"tier": "hf", "task.path": str(source), "task.n_val": 3, "backend.name": "verl",
                                 "policy.path": "/m", "policy.max_new_tokens": 16})
    train, val = write_dataset(cfg, tmp_path / "data", "/m")
    config = compose(hydra_overrides(cfg, RunPaths("/m", str(train), str(val), tmp_path / "c", tmp_path / "r.py")))
    assert (config.data.train_files, config.data.val_files) == (str(train), str(val))
    assert config.data.max_response_length == 16 and config.actor_rollout_ref.model.path == "/m"
    native = OpenR1Task(cfg.task, tokenizer=ChatChars())
    written = {split: pd.read_parquet(p) for split, p in (("train", train), ("val", val))}
    for split, ids in (("train", native.train_ids), ("val", native.val_ids)):
        frame = written[split]
        assert [r["ground_truth"] for r in frame["reward_model"]] == [native.golds[q] for q in ids]
        assert [list(p) for p in frame["prompt"]] == [native.messages[q] for q in ids]
        # veRL's replay keys a question by its row in the file it reads
        assert [int(e["index"]) for e in frame["extra_info"]] == list(range(len(ids)))
        assert [int(e["source_index"]) for e in frame["extra_info"]] == [native.indices[q] for q in ids]
    assert set(written["train"]["data_source"]) == {"arith"}


def test_a_file_task_on_verl_refuses_a_second_data_source():
    with pytest.raises(ConfigError, match=r"task.path \(task.kind=file\) is the veRL run's data; drop "
                                          r"backend.verl.train_files/val_files"):
        load_experiment(None, {"tier": "hf", "task.path": "a.parquet", "task.n_val": 2, "backend.name": "verl",
                               "policy.path": "/m", "backend.verl.train_files": "b.parquet"})
