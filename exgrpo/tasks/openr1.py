"""OpenR1-Math-46k-style parquet files (the ExGRPO reference's ``data.train_files``) as a task.

Format (``shared/docs/exgrpo-spec.md`` §8, written by the reference's ``prepare_train.py``):

=============================  ==========================================================  =========
column                         content                                                     here
=============================  ==========================================================  =========
``data_source``                source tag of the question (e.g. ``"openr1"``)               required
``prompt``                     list of ``{"role", "content"}`` messages (system + user)     required
``reward_model.ground_truth``  gold answer (LaTeX string); a struct column ``reward_model``  required
                               with field ``ground_truth``, or a flat column of that name
``target``                     an R1 reasoning trace (unused by ExGRPO)                     optional
``extra_info.index``           original index; a struct ``extra_info`` with ``index``       optional
``dataframe_uid``              question uid                                                 optional
=============================  ==========================================================  =========

* ``dataframe_uid``: the file's column if present, else the row position **after** the prompt
  length filter, as the reference does (``RLHFDatasetWithTargetExperience`` assigns
  ``range(len(dataframe))`` after its parent class filtered the prompts). ``rows`` keeps each
  question's position in the file.
* Prompts: the ``prompt`` messages rendered by the tokenizer's chat template with
  ``add_generation_prompt=True`` (:func:`~exgrpo.tasks.tokenizers.chat_prompt_ids`).
  ``remove_system=True`` drops system messages first (the reference's evaluation does; training
  keeps them). Note SmolLM2's template inserts its own default system prompt when none is given.
* ``max_prompt_length``: questions whose rendered prompt is longer (in tokens) are dropped (the
  reference trains with 1024 and ``filter_prompts=True``).
* Reward: binary, graded by :class:`~exgrpo.rewards.math_reward.MathVerifier` against
  ``ground_truth`` (the reference grades with math-verify, ``parse("$" + gt + "$")``).
  ``require_think=True`` mirrors the reference's ``reward_fn_math_verify`` (version 3) for
  ``<think>`` chat templates: a response without ``</think>`` scores 0, otherwise only the text
  after the first ``</think>`` is graded.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import Field

from exgrpo.config.tasks import GradedTaskConfig
from exgrpo.rewards.math_reward import MathVerifier
from exgrpo.tasks.tokenizers import chat_prompt_ids

__all__ = ["REQUIRED_COLUMNS", "OpenR1FormatError", "OpenR1Task", "OpenR1TaskConfig", "load_openr1"]

REQUIRED_COLUMNS: tuple[str, ...] = ("data_source", "prompt", "reward_model.ground_truth")
"""Columns every file must have (dotted names are fields of struct columns)."""
OPTIONAL_COLUMNS: tuple[str, ...] = ("target", "extra_info.index", "dataframe_uid")


class OpenR1FormatError(ValueError):
    """The parquet file does not have the OpenR1-Math layout; the message names the file and column."""


class OpenR1TaskConfig(GradedTaskConfig):
    """An OpenR1-Math-46k-style parquet file as a task."""

    kind: str = "openr1"
    """Task registry key."""
    path: str
    """The parquet file (e.g. the reference's openr1.parquet)."""
    max_prompt_length: int | None = Field(None, ge=1)
    """Drop questions whose chat prompt has more tokens (the reference uses 1024); None keeps all."""
    remove_system: bool = False
    """Drop system messages before applying the chat template (the reference's eval setting)."""
    require_think: bool = False
    """Grade only the text after the first </think> and give 0 without one (reference reward v3)."""
    n_val: int = Field(0, ge=0)
    """Questions held out as val_ids (a seeded random subset); 0 puts all into train_ids."""
    split_seed: int = 0
    """Seed of the held-out subset."""


def _fail(path: Path, msg: str) -> OpenR1FormatError:
    return OpenR1FormatError(f"{path}: {msg}")


def _read_columns(path: Path) -> tuple[dict[str, list[Any]], int]:
    """The needed columns as Python lists (struct columns flattened to dotted names)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not path.is_file():
        raise FileNotFoundError(f"OpenR1 parquet file not found: {path}")
    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise _fail(path, f"cannot be read as parquet ({exc})") from exc
    top = set(table.column_names)
    flat = table.flatten()  # struct column `reward_model` -> `reward_model.ground_truth`, ...
    names = set(flat.column_names)
    for col in REQUIRED_COLUMNS:
        if col in names:
            continue
        parent = col.split(".")[0]
        if "." in col and parent in top:
            kind = table.schema.field(parent).type
            raise _fail(
                path,
                f"missing column {col!r}: column {parent!r} has type {kind}, expected a struct with field "
                f"{col.split('.', 1)[1]!r}",
            )
        raise _fail(path, f"missing column {col!r} (required: {', '.join(REQUIRED_COLUMNS)}; found: {sorted(top)})")
    cols = {c: flat.column(c).to_pylist() for c in REQUIRED_COLUMNS + OPTIONAL_COLUMNS if c in names}
    return cols, flat.num_rows


def _messages(path: Path, row: int, cell: Any) -> list[dict[str, str]]:
    if not isinstance(cell, (list, tuple)) or not cell:
        raise _fail(path, f"row {row}: column 'prompt' must be a non-empty list of {{role, content}} messages, "
                    f"got {type(cell).__name__}: {str(cell)[:80]!r}")  # fmt: skip
    out = []
    for m in cell:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise _fail(path, f"row {row}: column 'prompt' has a message without string 'role'/'content': {m!r}")
        out.append({"role": m["role"], "content": m["content"]})
    if not any(m["role"] == "user" for m in out):
        raise _fail(path, f"row {row}: column 'prompt' has no user message")
    return out


class OpenR1Task:
    """Questions, golds and chat prompts of an OpenR1-Math-style parquet file (Task protocol).

    Per question ``q`` (positions after the length filter): ``messages[q]``, ``questions[q]`` (the
    last user message), ``golds[q]``, ``data_sources[q]``, ``indices[q]`` (``extra_info.index``
    or None), ``targets[q]`` (or None), ``uids[q]`` (dataframe_uid) and ``rows[q]`` (file row)."""

    def __init__(self, cfg: OpenR1TaskConfig, tokenizer: Any = None, verifier: Any = None) -> None:
        self.cfg = cfg
        self.path = path = Path(cfg.path)
        self.tokenizer = tokenizer
        self._verifier = verifier
        if cfg.max_prompt_length is not None and tokenizer is None:
            raise ValueError("max_prompt_length needs a tokenizer (prompt lengths are counted in its tokens)")
        cols, n_rows = _read_columns(path)
        self.n_rows = n_rows
        self.messages: list[list[dict[str, str]]] = []
        self.golds: list[str] = []
        self.data_sources: list[str] = []
        self.targets: list[str | None] = []
        self.indices: list[int | None] = []
        self.rows: list[int] = []
        self.uids: list[int] = []
        self._prompt_ids: list[list[int]] = []
        self.prompt_lengths: list[int] = []
        for r in range(n_rows):
            msgs = _messages(path, r, cols["prompt"][r])
            if cfg.remove_system:
                msgs = [m for m in msgs if m["role"] != "system"]
            gold = cols["reward_model.ground_truth"][r]
            if gold is None or isinstance(gold, (bool, dict, list)) or (isinstance(gold, str) and not gold.strip()):
                raise _fail(path, f"row {r}: column 'reward_model.ground_truth' is empty or not a string: {gold!r}")
            source = cols["data_source"][r]
            if source is None:
                raise _fail(path, f"row {r}: column 'data_source' is null")
            ids = None
            if tokenizer is not None:
                ids = self._render(msgs)
                if cfg.max_prompt_length is not None and len(ids) > cfg.max_prompt_length:
                    continue
            self.messages.append(msgs)
            self.golds.append(str(gold))
            self.data_sources.append(str(source))
            self.targets.append(cols["target"][r] if "target" in cols else None)
            index = cols["extra_info.index"][r] if "extra_info.index" in cols else None
            self.indices.append(None if index is None else int(index))
            self.rows.append(r)
            if "dataframe_uid" in cols:
                self.uids.append(int(cols["dataframe_uid"][r]))
            if ids is not None:
                self._prompt_ids.append(ids)
                self.prompt_lengths.append(len(ids))
        if not self.messages:
            raise _fail(path, f"no questions left (rows: {n_rows}, max_prompt_length: {cfg.max_prompt_length})")
        if "dataframe_uid" not in cols:
            self.uids = list(range(len(self.messages)))  # row position after filtering, as the reference
        self.n_filtered = n_rows - len(self.messages)
        self.questions: list[str] = [[m for m in msgs if m["role"] == "user"][-1]["content"] for msgs in self.messages]
        n = len(self.messages)
        if cfg.n_val >= n:
            raise ValueError(f"n_val={cfg.n_val} must be < the {n} questions of {path}")
        perm = np.random.default_rng(cfg.split_seed).permutation(n)
        self.val_ids: list[int] = sorted(int(i) for i in perm[: cfg.n_val])
        self.train_ids: list[int] = sorted(int(i) for i in perm[cfg.n_val :])

    # ------------------------------------------------------------------ prompts
    def _render(self, msgs: list[dict[str, str]]) -> list[int]:
        return chat_prompt_ids(self.tokenizer, msgs)

    def __len__(self) -> int:
        return len(self.messages)

    def question_text(self, qid: int) -> str:
        return self.questions[int(qid)]

    def prompts(self, qids: Sequence[int]) -> list[list[int]]:
        """Chat-template token ids per id (``add_generation_prompt=True``)."""
        if self.tokenizer is None:
            raise ValueError("OpenR1Task.prompts needs a tokenizer (pass one to the constructor / load_openr1)")
        return [list(self._prompt_ids[int(q)]) for q in qids]

    # ------------------------------------------------------------------ rewards
    @property
    def verifier(self):
        if self._verifier is None:
            # The process pool: graded on its workers' main threads, bounded from outside.
            self._verifier = MathVerifier(answer_format=self.cfg.answer_format, max_answer_chars=self.cfg.max_answer_chars)
        return self._verifier

    def gradable_text(self, text: str) -> str | None:
        """What is graded: the text, or with ``require_think`` the part after the first ``</think>``
        (None without one)."""
        if not self.cfg.require_think:
            return text
        _, sep, tail = text.partition("</think>")
        return tail if sep else None

    def score_texts(self, qids: Sequence[int], texts: Sequence[str]) -> list[float]:
        """Binary math-verify rewards of response texts against the golds."""
        graded = [self.gradable_text(t) for t in texts]
        golds = [self.golds[int(q)] for q in qids]
        return list(self.verifier.score(graded, golds).rewards)

    def decode(self, tokens: torch.Tensor, mask: torch.Tensor) -> list[str]:
        if self.tokenizer is None:
            raise ValueError("OpenR1Task.decode needs a tokenizer")
        return [self.tokenizer.decode(row[m].tolist(), skip_special_tokens=True) for row, m in zip(tokens, mask.bool(), strict=True)]

    def rewards(self, qids: Sequence[int], tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(N,) float binary rewards of response rows."""
        return torch.tensor(self.score_texts(qids, self.decode(tokens, mask)), dtype=torch.float32)


def load_openr1(
    path: str | Path,
    tokenizer: Any = None,
    max_prompt_length: int | None = None,
    remove_system: bool = False,
    **kwargs: Any,
) -> OpenR1Task:
    """Load an OpenR1-Math-style parquet file (see the module docstring for the columns).

    Raises:
        FileNotFoundError: no such file.
        OpenR1FormatError: unreadable parquet, a missing column or a malformed cell (the message
            names the file, the column and the row).
    """
    cfg = OpenR1TaskConfig(path=str(path), max_prompt_length=max_prompt_length, remove_system=remove_system, **kwargs)
    return OpenR1Task(cfg, tokenizer=tokenizer)
