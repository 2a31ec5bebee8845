"""A question file in veRL's RLHFDataset layout as a task (``task.kind: file``): the ExGRPO
reference's OpenR1-Math-46k parquet (its ``data.train_files``), or your own parquet or JSONL.

The rows and their checks are :mod:`exgrpo.tasks.rlhf_file`'s (``shared/docs/exgrpo-spec.md`` §8 for
the reference's ``prepare_train.py``); here they become a Task (interfaces.py):

* Questions: the rows of ``path`` (after the prompt length filter) are the training questions; the
  held-out ones are the rows of ``val_path``, else ``n_val`` of ``path``'s drawn by ``split_seed``.
* ``dataframe_uid``: the file's column if present, else the row position **after** the prompt
  length filter, as the reference does (``RLHFDatasetWithTargetExperience`` assigns
  ``range(len(dataframe))`` after its parent class filtered the prompts). ``rows`` keeps each
  question's position in its file.
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

from exgrpo.config.tasks import FileTaskConfig
from exgrpo.rewards.extraction import after_think
from exgrpo.rewards.math_reward import MathVerifier
from exgrpo.tasks.rlhf_file import DataFileError, FileQuestion, read_questions
from exgrpo.tasks.tokenizers import chat_prompt_ids

__all__ = ["OpenR1FormatError", "OpenR1Task", "OpenR1TaskConfig", "load_openr1"]

OpenR1TaskConfig = FileTaskConfig
"""The task's config: ``task.kind: file`` (exgrpo.config.tasks)."""
OpenR1FormatError = DataFileError
"""A file the task cannot use (one line naming the field, the file and its bad rows)."""


class OpenR1Task:
    """Questions, golds and chat prompts of a question file (Task protocol).

    Per question ``q`` (training questions first, then those of ``val_path``): ``messages[q]``,
    ``questions[q]`` (the last user message), ``golds[q]``, ``data_sources[q]``, ``indices[q]``
    (``extra_info.index`` or None), ``targets[q]`` (or None), ``uids[q]`` (dataframe_uid) and
    ``rows[q]`` (row of its file)."""

    def __init__(self, cfg: FileTaskConfig, tokenizer: Any = None, verifier: Any = None) -> None:
        self.cfg = cfg
        self.path = Path(cfg.path)
        self.tokenizer = tokenizer
        self._verifier = verifier
        self.template = "chat-template"
        """Name of the prompt template (recorded beside evaluation scores): the model's own."""
        if cfg.max_prompt_length is not None and tokenizer is None:
            raise ValueError("max_prompt_length needs a tokenizer (prompt lengths are counted in its tokens)")
        self.messages: list[list[dict[str, str]]] = []
        self.golds: list[str] = []
        self.data_sources: list[str] = []
        self.targets: list[Any] = []
        self.indices: list[int | None] = []
        self.rows: list[int] = []
        self.uids: list[int] = []
        self._prompt_ids: list[list[int]] = []
        self.prompt_lengths: list[int] = []
        train = read_questions(cfg.path, "task.path")
        self.n_rows = len(train)
        n_train = self._add(train, "task.path", cfg.path)
        self.n_filtered = self.n_rows - n_train
        if cfg.val_path is not None:
            n_val = self._add(read_questions(cfg.val_path, "task.val_path"), "task.val_path", cfg.val_path)
            self.train_ids: list[int] = list(range(n_train))
            self.val_ids: list[int] = list(range(n_train, n_train + n_val))
        else:
            if cfg.n_val >= n_train:
                raise DataFileError(f"task.n_val={cfg.n_val} must be < the {n_train} questions of task.path={self.path}")
            perm = np.random.default_rng(cfg.split_seed).permutation(n_train)
            self.val_ids = sorted(int(i) for i in perm[: cfg.n_val])
            self.train_ids = sorted(int(i) for i in perm[cfg.n_val :])
        self.questions: list[str] = [[m for m in msgs if m["role"] == "user"][-1]["content"] for msgs in self.messages]

    def _add(self, questions: list[FileQuestion], field: str, path: str) -> int:
        """Append the questions that pass the prompt length filter; how many did."""
        start = len(self.messages)
        has_uids = all(q.uid is not None for q in questions)
        for q in questions:
            msgs = [m for m in q.messages if m["role"] != "system"] if self.cfg.remove_system else q.messages
            if self.tokenizer is not None:
                ids = self._render(msgs)
                if self.cfg.max_prompt_length is not None and len(ids) > self.cfg.max_prompt_length:
                    continue
                self._prompt_ids.append(ids)
                self.prompt_lengths.append(len(ids))
            self.messages.append(msgs)
            self.golds.append(q.gold)
            self.data_sources.append(q.data_source)
            self.targets.append(q.target)
            self.indices.append(q.index)
            self.rows.append(q.row)
            if has_uids:
                self.uids.append(int(q.uid))
        added = len(self.messages) - start
        if not has_uids:
            self.uids += list(range(added))  # row position after filtering, as the reference
        if not added:
            raise DataFileError(f"{field}={path}: no questions left (rows: {len(questions)}, task.max_prompt_length: "
                                f"{self.cfg.max_prompt_length})")
        return added

    # ------------------------------------------------------------------ prompts
    def _render(self, msgs: list[dict[str, str]]) -> list[int]:
        return chat_prompt_ids(self.tokenizer, msgs)

    def prompt_fn(self, text: str) -> list[int]:
        """A benchmark question as a user message in the model's chat template (exgrpo eval)."""
        return self._render([{"role": "user", "content": text}])

    def decode_fn(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

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
        return after_think(text) if self.cfg.require_think else text

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
    """Load a question file (see the module docstring; :mod:`exgrpo.tasks.rlhf_file` for the rows).

    Raises:
        OpenR1FormatError: no such file, an unreadable file, a missing column or bad rows (one line
            naming the file, the column or the rows).
    """
    cfg = OpenR1TaskConfig(path=str(path), max_prompt_length=max_prompt_length, remove_system=remove_system, **kwargs)
    return OpenR1Task(cfg, tokenizer=tokenizer)
