"""The toy tier's environment (notebook-toy.md): integer addition/subtraction from features.

Questions are every (a, op, b) with a, b in 0..M and op in {+, -}; the answer lies in [-M, 2M]
(M = ``max_operand``, default 30: the notebook did not preserve its bound, so this is ours). Each
question has a unique id, a 4-d feature vector [a/M, b/M, 1{op=+}, 1{op=-}] and its true answer.
Actions are the 3M+1 candidate answers; ``ans_to_act``/``act_to_ans`` map between them. A response
is one token: the chosen action. The train/val split is fixed by ``data_seed``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from exgrpo.config import ToyTaskConfig


class ToyArithmetic:
    def __init__(self, cfg: ToyTaskConfig) -> None:
        m = cfg.max_operand
        self.max_operand = m
        a, b, op = np.meshgrid(np.arange(m + 1), np.arange(m + 1), np.array([1, -1]), indexing="ij")
        self.a, self.b, self.op = a.ravel(), b.ravel(), op.ravel()
        self.answers = self.a + self.op * self.b  # (Q,)
        self.features = torch.tensor(
            np.stack([self.a / m, self.b / m, (self.op == 1), (self.op == -1)], axis=1), dtype=torch.float32
        )  # (Q, 4)
        ids = np.random.default_rng(cfg.data_seed).permutation(len(self.answers))
        n_val = int(round(cfg.val_fraction * len(ids)))
        self.val_ids = sorted(int(i) for i in ids[:n_val])
        self.train_ids = sorted(int(i) for i in ids[n_val:])
        self.num_actions = 3 * m + 1
        self._answer_actions = torch.as_tensor(self.ans_to_act(self.answers))  # (Q,)

    def ans_to_act(self, ans):
        return ans + self.max_operand

    def act_to_ans(self, act):
        return act - self.max_operand

    def question_text(self, qid: int) -> str:
        return f"{self.a[qid]} {'+' if self.op[qid] == 1 else '-'} {self.b[qid]}"

    def prompts(self, qids: Sequence[int]) -> torch.Tensor:
        """(N, 4) feature rows."""
        return self.features[torch.as_tensor(list(qids), dtype=torch.long)]

    def rewards(self, qids: Sequence[int], tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """1.0 where the (single) response token is the true answer's action, else 0. Shape (N,)."""
        gold = self._answer_actions[torch.as_tensor(list(qids), dtype=torch.long)]
        return ((tokens[:, 0] == gold) & mask[:, 0]).float()
