"""Question files in veRL's RLHFDataset layout (parquet or JSONL), read and checked row by row.

A row (a parquet row, or one JSON object per line of a JSONL file):

=============================  ==========================================================  =========
field                          content                                                     here
=============================  ==========================================================  =========
``prompt``                     non-empty list of ``{"role", "content"}`` string messages,   required
                               one of them ``user``
``reward_model.ground_truth``  the gold answer, a non-blank string (graded by math-verify)  required
``data_source``                source tag of the question, a string                        required
``extra_info.index``           the question's index in its source, an integer              optional
``target``                     a reference solution (read, unused by the RL step)          optional
``dataframe_uid``              question uid, an integer                                    optional
=============================  ==========================================================  =========

Every row is checked before a question is used: :func:`read_questions` raises one
:class:`DataFileError` (a :class:`~exgrpo.config.ConfigError`: exit 2 from the command line) whose one
line names the config field, the file, how many rows are bad, and the first few by row number
(counted from 0, blank JSONL lines not counted). A parquet file without a required column is named
by its column instead.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exgrpo.config import ConfigError
from exgrpo.config.tasks import DATA_FILE_SUFFIXES, FileTaskConfig

__all__ = ["LAYOUT", "REQUIRED", "DataFileError", "FileQuestion", "check_task_files", "read_questions"]

LAYOUT = "veRL's RLHFDataset layout"
REQUIRED: tuple[str, ...] = ("data_source", "prompt", "reward_model.ground_truth")
"""Fields every row must have (dotted names are fields of a struct/object)."""
OPTIONAL: tuple[str, ...] = ("target", "extra_info.index", "dataframe_uid")
SHOWN_ROWS = 5
"""Bad rows an error names one by one; it counts the rest."""


class DataFileError(ConfigError):
    """A question file that cannot be used: one line naming the field, the file and its bad rows."""


@dataclass(frozen=True)
class FileQuestion:
    """One row of a question file."""

    messages: list[dict[str, str]]
    gold: str
    data_source: str
    index: int | None
    target: Any
    uid: int | None
    row: int
    """Position in the file (from 0)."""


def _get(row: dict[str, Any], dotted: str) -> Any:
    if dotted in row:  # a flat parquet column named `reward_model.ground_truth`
        return row[dotted]
    node: Any = row
    for part in dotted.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _problem(row: dict[str, Any]) -> str | None:
    """Why ``row`` is not a question of the layout, or None."""
    prompt = row.get("prompt")
    if prompt is None:
        return "prompt is missing"
    if not isinstance(prompt, (list, tuple)):
        return f"prompt must be a list of {{role, content}} messages, got {type(prompt).__name__}"
    if not prompt:
        return "prompt is empty"
    if not all(isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
               for m in prompt):
        return "prompt has a message without a string role and content"
    if not any(m["role"] == "user" for m in prompt):
        return "prompt has no user message"
    gold = _get(row, "reward_model.ground_truth")
    if gold is None:
        return "reward_model.ground_truth is missing"
    if not isinstance(gold, str):
        return f"reward_model.ground_truth is {gold!r} ({type(gold).__name__}), not a string"
    if not gold.strip():
        return "reward_model.ground_truth is empty"
    source = row.get("data_source")
    if source is None:
        return "data_source is missing"
    if not isinstance(source, str):
        return f"data_source is {source!r} ({type(source).__name__}), not a string"
    for name in ("extra_info.index", "dataframe_uid"):
        value = _get(row, name)
        if value is not None and not _is_int(value):
            return f"{name} is {value!r} ({type(value).__name__}), not an integer"
    return None


def _rows_of_parquet(path: Path, where: str) -> list[dict[str, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise DataFileError(f"{where}: cannot be read as parquet ({exc})") from None
    top = set(table.column_names)
    names = set(table.flatten().column_names)  # struct column `reward_model` -> `reward_model.ground_truth`
    for col in REQUIRED:
        if col in names:
            continue
        parent = col.split(".")[0]
        if "." in col and parent in top:
            raise DataFileError(f"{where}: missing column {col!r}: column {parent!r} has type "
                                f"{table.schema.field(parent).type}, expected a struct with field {col.split('.', 1)[1]!r}")
        raise DataFileError(f"{where}: missing column {col!r} (required: {', '.join(REQUIRED)}; found: "
                            f"{', '.join(sorted(top))})")
    roots = {c.split(".")[0] for c in REQUIRED + OPTIONAL}
    return table.select(sorted(c for c in top if c.split(".")[0] in roots)).to_pylist()


def _rows_of_jsonl(path: Path, where: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                row = {"__unreadable__": f"not a JSON object (line {number}: {exc.msg})"}
            if not isinstance(row, dict):
                row = {"__unreadable__": f"not a JSON object (line {number}: a {type(row).__name__})"}
            rows.append(row)
    return rows


_READERS: dict[str, Callable[[Path, str], list[dict[str, Any]]]] = {
    ".parquet": _rows_of_parquet,
    ".jsonl": _rows_of_jsonl,
}
"""How each format of :data:`~exgrpo.config.tasks.DATA_FILE_SUFFIXES` is read into row mappings."""
assert tuple(_READERS) == DATA_FILE_SUFFIXES


def read_questions(path: str | Path, field: str = "task.path") -> list[FileQuestion]:
    """Every row of the file at ``path`` (the value of config field ``field``) as a question.

    Raises:
        DataFileError: no such file, an unreadable file, a missing parquet column, or bad rows (one
            line naming ``field``, the file and the rows)."""
    path = Path(path)
    where = f"{field}={path}"
    if not path.is_file():
        raise DataFileError(f"{where}: no such file (a {' or '.join(DATA_FILE_SUFFIXES)} file in {LAYOUT})")
    reader = _READERS.get(path.suffix)
    if reader is None:
        raise DataFileError(f"{where}: not a {' or '.join(DATA_FILE_SUFFIXES)} file")
    rows = reader(path, where)
    bad = [(r, row.get("__unreadable__") or _problem(row)) for r, row in enumerate(rows)]
    bad = [(r, why) for r, why in bad if why]
    if bad:
        shown = "; ".join(f"row {r}: {why}" for r, why in bad[:SHOWN_ROWS])
        more = f"; and {len(bad) - SHOWN_ROWS} more" if len(bad) > SHOWN_ROWS else ""
        raise DataFileError(f"{where}: {len(bad)} of {len(rows)} rows are not in {LAYOUT} (prompt: chat messages, "
                            f"reward_model.ground_truth: a string, data_source: a string): {shown}{more}")
    if not rows:
        raise DataFileError(f"{where}: no rows")
    return [FileQuestion(
        messages=[{"role": m["role"], "content": m["content"]} for m in row["prompt"]],
        gold=_get(row, "reward_model.ground_truth"),
        data_source=row["data_source"],
        index=_get(row, "extra_info.index"),
        target=row.get("target"),
        uid=row.get("dataframe_uid"),
        row=r,
    ) for r, row in enumerate(rows)]


def check_task_files(cfg: FileTaskConfig) -> None:
    """Read and check every file of a file task (its training file and its held-out file), before a
    run does any work; :class:`DataFileError` names the first bad one."""
    n = len(read_questions(cfg.path, "task.path"))
    if cfg.val_path is not None:
        read_questions(cfg.val_path, "task.val_path")
    elif cfg.n_val >= n:
        raise DataFileError(f"task.n_val={cfg.n_val} must be < the {n} questions of task.path={cfg.path}, which "
                            "would leave none to train on; lower it, or give the held-out questions in task.val_path")
