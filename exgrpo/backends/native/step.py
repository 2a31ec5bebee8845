"""One backend-agnostic training step's batch: plan -> replay sampling and selection -> rollouts.

:func:`build_batch` returns a :class:`StepBatch` laid out group-major: group g owns rows
[g*K, (g+1)*K). A replayed group's row 0 is the stored trajectory (off-policy, with its behaviour
log-probs); every other row is a fresh rollout. Used by :mod:`exgrpo.backends.native.trainer`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from exgrpo.backends.native.interfaces import Policy, Task
from exgrpo.config import AlgorithmConfig, SelectionMetric
from exgrpo.core.pool import ExperiencePool, Trajectory
from exgrpo.core.selection import pad_right, select_per_group, trajectory_metric


@dataclass
class StepBatch:
    """All rows of one step, shapes (N, T) unless noted, N = G*K."""

    group_qids: list[int]
    """(G,) question id of each group."""
    row_qids: list[int]
    """(N,) question id of each row."""
    tokens: torch.Tensor
    mask: torch.Tensor
    old_logp: torch.Tensor
    """Log-probs of the policy that produced each token (behaviour policy on replayed rows)."""
    behaviour_entropy: torch.Tensor
    off_policy: torch.Tensor
    """(N,) bool, True on replayed rows."""
    n_replayed: int


class FreshSampler:
    """Fresh training questions: a reshuffled pass over the train ids, cycling; retired questions
    are dropped at the next reshuffle (reference behaviour: from the next epoch on)."""

    def __init__(self, ids: Sequence[int], rng: np.random.Generator) -> None:
        self.ids = list(ids)
        self.rng = rng
        self.order: list[int] = []
        self.pos = 0
        self.passes = 0

    def next(self, n: int, retired: frozenset[int] = frozenset()) -> list[int]:
        out: list[int] = []
        while len(out) < n:
            if self.pos >= len(self.order):
                live = [q for q in self.ids if q not in retired] or self.ids
                self.order = [live[i] for i in self.rng.permutation(len(live))]
                self.pos = 0
                self.passes += 1
            take = min(n - len(out), len(self.order) - self.pos)
            out += self.order[self.pos : self.pos + take]
            self.pos += take
        return out

    def state_dict(self) -> dict:
        return {"order": list(self.order), "pos": self.pos, "passes": self.passes}

    def load_state_dict(self, state: dict) -> None:
        self.order, self.pos, self.passes = list(state["order"]), int(state["pos"]), int(state["passes"])


def select_replays(
    qids: list[int], pool: ExperiencePool, policy: Policy, task: Task, algo: AlgorithmConfig, rng: np.random.Generator
) -> tuple[list[Trajectory], torch.Tensor | None]:
    """For each replayed question, the stored trajectory to replay and, when the metric needs a
    forward pass, the current policy's log-probs of every picked trajectory (padded, (G_r, T))."""
    candidates: list[Trajectory] = []
    owner: list[int] = []
    for g, q in enumerate(qids):
        for traj in pool.trajectories(q):
            candidates.append(traj)
            owner.append(g)
    if algo.selection_metric == SelectionMetric.RANDOM:
        picked = select_per_group(None, owner, algo.selection_mode, rng)
        return [candidates[i] for i in picked], None
    tokens, mask = pad_right([t.tokens for t in candidates])
    with torch.no_grad():
        scores = policy.score(task.prompts([qids[g] for g in owner]), tokens, mask)
    values = trajectory_metric(algo.selection_metric, scores.logp, scores.entropy, mask)
    picked = select_per_group(values, owner, algo.selection_mode, rng)
    return [candidates[i] for i in picked], scores.logp[picked]


def build_batch(
    replay_qids: list[int],
    replayed: list[Trajectory],
    current_logp: torch.Tensor | None,
    fresh_qids: list[int],
    policy: Policy,
    task: Task,
    group_size: int,
    is_correction: bool,
    generator: torch.Generator,
) -> StepBatch:
    """Roll out K-1 fresh rows per replayed question and K per fresh one, and lay out the batch."""
    k = group_size
    group_qids = list(replay_qids) + list(fresh_qids)
    gen_qids = [q for q in replay_qids for _ in range(k - 1)] + [q for q in fresh_qids for _ in range(k)]
    with torch.no_grad():
        ro = policy.generate(task.prompts(gen_qids), generator)

    n_rep = len(replay_qids)
    stored_tok, stored_mask = pad_right([t.tokens for t in replayed]) if n_rep else (None, None)
    if n_rep and not is_correction and current_logp is None:
        with torch.no_grad():
            current_logp = policy.score(task.prompts(replay_qids), stored_tok, stored_mask).logp
    t_max = max(ro.tokens.shape[1], stored_tok.shape[1] if n_rep else 0)
    n = len(group_qids) * k

    tokens = torch.zeros((n, t_max), dtype=torch.long)
    mask = torch.zeros((n, t_max), dtype=torch.bool)
    old_logp = torch.zeros((n, t_max))
    entropy = torch.zeros((n, t_max))
    off = torch.zeros(n, dtype=torch.bool)

    # row index of every generated row in the group-major layout
    rep_rows = torch.arange(n_rep) * k
    gen_rows = torch.cat(
        [
            (torch.arange(n_rep)[:, None] * k + torch.arange(1, k)[None, :]).reshape(-1),
            n_rep * k + torch.arange(len(fresh_qids) * k),
        ]
    )
    tg = ro.tokens.shape[1]
    tokens[gen_rows, :tg] = ro.tokens
    mask[gen_rows, :tg] = ro.mask
    old_logp[gen_rows, :tg] = ro.logp
    entropy[gen_rows, :tg] = ro.entropy
    if n_rep:
        ts = stored_tok.shape[1]
        tokens[rep_rows, :ts] = stored_tok
        mask[rep_rows, :ts] = stored_mask
        if is_correction:
            behaviour, _ = pad_right([t.behaviour_logp for t in replayed], dtype=torch.float32)
        else:
            behaviour = current_logp.float()
        old_logp[rep_rows, :ts] = behaviour * stored_mask
        entropy[rep_rows, :ts] = torch.tensor([t.entropy for t in replayed])[:, None] * stored_mask
        off[rep_rows] = True
    row_qids = [q for q in group_qids for _ in range(k)]
    return StepBatch(group_qids, row_qids, tokens, mask, old_logp, entropy, off, n_rep)
