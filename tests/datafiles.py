"""Small question files in veRL's RLHFDataset layout (the layout ``task.kind: file`` reads), for tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def arithmetic_rows(n: int, start: int = 0) -> list[dict[str, Any]]:
    """``n`` rows "What is a + b?" with their answers, ``extra_info.index`` counting from ``start``."""
    rows = []
    for i in range(start, start + n):
        a, b = i % 7 + 1, i % 5 + 2
        rows.append({
            "data_source": "arith",
            "prompt": [{"role": "user", "content": f"What is {a} + {b}? Put the final answer in \\boxed{{}}."}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(a + b)},
            "extra_info": {"index": i, "split": "train"},
        })
    return rows


def write_parquet(path: Path, rows: list[dict[str, Any]]) -> Path:
    import pandas as pd

    pd.DataFrame(rows).to_parquet(path, index=False)
    return path


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def user_question_files(directory: Path) -> dict[str, Path]:
    """The question files a user brings, as the end-to-end tests of both backends train on them: a train
    parquet of 16 questions and a held-out parquet of 4."""
    directory.mkdir(parents=True, exist_ok=True)
    return {"train.parquet": write_parquet(directory / "train.parquet", arithmetic_rows(16)),
            "val.parquet": write_parquet(directory / "val.parquet", arithmetic_rows(4, start=100))}
