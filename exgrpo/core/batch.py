"""Pure batch building: fresh rollouts + replayed trajectories -> one mixed, group-major batch.

No model and no I/O here: a backend generates the fresh rows and scores what it must, then calls
these functions. Layout (group-major, the layout veRL's ``repeat(interleave=True)`` also uses):
group g owns rows [g*K, (g+1)*K). Replayed groups come first; a replayed group's row 0 is its
stored trajectory (off-policy, with behaviour log-probs), rows 1..K-1 are fresh rollouts of the
same question. Fresh groups hold K fresh rollouts. N = G*K rows, T = longest response.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from exgrpo.config.options import MiniBatchSplit
from exgrpo.core.pool import Trajectory
from exgrpo.core.selection import pad_right


@dataclass
class Replays:
    """What a replay strategy picked this step: one stored trajectory per replayed question."""

    qids: list[int]
    """(G_r,) replayed question ids."""
    trajectories: list[Trajectory]
    """(G_r,) the stored trajectory replayed for each question."""
    old_log_prob: torch.Tensor | None
    """(G_r, T_r) float32 log-probs that play pi_old on the replayed rows (the stored behaviour
    log-probs with IS correction, the current policy's without), right-padded; None if G_r = 0."""
    buckets: list[int]
    """(G_r,) bucket (latest success count) of each replayed question when it was picked."""

    def __len__(self) -> int:
        return len(self.qids)

    @classmethod
    def empty(cls) -> Replays:
        return cls([], [], None, [])


@dataclass
class StepBatch:
    """All rows of one step, shapes (N, T) unless noted, N = G*K."""

    group_qids: list[int]
    """(G,) question id of each group."""
    row_qids: list[int]
    """(N,) question id of each row."""
    tokens: torch.Tensor
    """(N, T) long, right-padded response token ids."""
    mask: torch.Tensor
    """(N, T) bool, True on response tokens."""
    old_log_prob: torch.Tensor
    """(N, T) float, log-probs of the policy that produced each token (behaviour on replayed rows)."""
    behaviour_entropy: torch.Tensor
    """(N, T) float, the producing policy's token entropy (a replayed row: its stored mean, broadcast)."""
    off_policy: torch.Tensor
    """(N,) bool, True on replayed rows."""
    n_replayed: int
    """G_r, the number of replayed groups (the first G_r groups)."""


def generation_qids(replay_qids: Sequence[int], fresh_qids: Sequence[int], group_size: int) -> list[int]:
    """Question id of every row to generate, in batch order: K-1 per replayed question, K per fresh one."""
    k = group_size
    return [q for q in replay_qids for _ in range(k - 1)] + [q for q in fresh_qids for _ in range(k)]


def mini_batch_rows(rng: np.random.Generator, n_rows: int, group_size: int, mini_batches: int,
                    split: MiniBatchSplit | None = None) -> list[np.ndarray]:
    """The row indices of each of a step's ``mini_batches`` (every row in exactly one), drawn from ``rng``.

    ``rows`` (and None): a random permutation of the N rows cut into ``mini_batches`` near-equal parts.
    ``groups``: a random permutation of the G = N / K groups cut the same way, each group's K rows kept
    together (group g owns rows [g*K, (g+1)*K), the batch's layout)."""
    if split is not MiniBatchSplit.GROUPS:
        return np.array_split(rng.permutation(n_rows), mini_batches)
    if n_rows % group_size:
        raise ValueError(f"a batch of {n_rows} rows is not made of groups of {group_size}")
    groups = np.array_split(rng.permutation(n_rows // group_size), mini_batches)
    return [(g[:, None] * group_size + np.arange(group_size)).reshape(-1) for g in groups]


def assemble_batch(
    replays: Replays,
    fresh_qids: Sequence[int],
    tokens: torch.Tensor,
    mask: torch.Tensor,
    log_prob: torch.Tensor,
    entropy: torch.Tensor,
    group_size: int,
) -> StepBatch:
    """Lay out the mixed batch from the generated rows and the replayed trajectories.

    Args:
        replays: the strategy's pick (G_r questions).
        fresh_qids: (G_f,) fresh question ids.
        tokens, mask, log_prob, entropy: (M, T_g) generated rows in :func:`generation_qids` order,
            M = G_r*(K-1) + G_f*K.
        group_size: K.
    """
    k = group_size
    n_rep = len(replays)
    group_qids = list(replays.qids) + list(fresh_qids)
    stored_tok, stored_mask = pad_right([t.tokens for t in replays.trajectories]) if n_rep else (None, None)
    t_max = max(tokens.shape[1], stored_tok.shape[1] if n_rep else 0)
    n = len(group_qids) * k

    out_tokens = torch.zeros((n, t_max), dtype=torch.long)
    out_mask = torch.zeros((n, t_max), dtype=torch.bool)
    old = torch.zeros((n, t_max))
    ent = torch.zeros((n, t_max))
    off = torch.zeros(n, dtype=torch.bool)

    rep_rows = torch.arange(n_rep) * k  # row 0 of each replayed group
    gen_rows = torch.cat(
        [
            (torch.arange(n_rep)[:, None] * k + torch.arange(1, k)[None, :]).reshape(-1),
            n_rep * k + torch.arange(len(fresh_qids) * k),
        ]
    )
    tg = tokens.shape[1]
    out_tokens[gen_rows, :tg] = tokens
    out_mask[gen_rows, :tg] = mask
    old[gen_rows, :tg] = log_prob
    ent[gen_rows, :tg] = entropy
    if n_rep:
        ts = stored_tok.shape[1]
        out_tokens[rep_rows, :ts] = stored_tok
        out_mask[rep_rows, :ts] = stored_mask
        old[rep_rows, :ts] = replays.old_log_prob[:, :ts].float() * stored_mask
        ent[rep_rows, :ts] = torch.tensor([t.entropy for t in replays.trajectories])[:, None] * stored_mask
        off[rep_rows] = True
    row_qids = [q for q in group_qids for _ in range(k)]
    return StepBatch(group_qids, row_qids, out_tokens, out_mask, old, ent, off, n_rep)


@dataclass
class RewardedGroup:
    """One question's outcome this step: what a replay strategy observes."""

    qid: int
    num_correct: int
    """Correct rollouts among the group's K (the replayed row included: spec §11.7)."""
    correct: list[Trajectory]
    """Its distinct correct responses (dedup by token ids, batch order), with behaviour log-probs."""


def rewarded_groups(batch: StepBatch, rewards: torch.Tensor, step: int) -> list[RewardedGroup]:
    """Group the step's binary rewards (G, K) by question and keep the distinct correct responses."""
    k = rewards.shape[1]
    num_correct = rewards.sum(1).long().tolist()  # (G,)
    rows = rewards.reshape(-1).nonzero().squeeze(1)  # (C,) the correct rows, in batch order
    mask = batch.mask.index_select(0, rows)  # (C, T): only correct rows are read (Python lists are slow)
    lengths = mask.sum(1).tolist()
    ent_mean = ((batch.behaviour_entropy.index_select(0, rows) * mask).sum(1) / mask.sum(1).clamp_min(1)).tolist()
    tokens = batch.tokens.index_select(0, rows).tolist()
    behaviour = batch.old_log_prob.index_select(0, rows).tolist()
    trajs: list[list[Trajectory]] = [[] for _ in batch.group_qids]
    seen: list[set[tuple]] = [set() for _ in batch.group_qids]
    for i, r in enumerate(rows.tolist()):
        g, tok = r // k, tuple(tokens[i][: lengths[i]])
        if tok not in seen[g]:
            seen[g].add(tok)
            trajs[g].append(Trajectory(tok, tuple(behaviour[i][: lengths[i]]), ent_mean[i], step, num_correct[g]))
    return [RewardedGroup(q, num_correct[g], trajs[g]) for g, q in enumerate(batch.group_qids)]


def batch_metrics(rewards: torch.Tensor, batch: StepBatch) -> dict[str, float]:
    """Outcome metrics of one step (METRICS.md); ``rewards`` is (G, K)."""
    n_groups, k = rewards.shape
    flat = rewards.reshape(-1)
    solved = rewards.sum(1)
    replayed_group = batch.off_policy.reshape(n_groups, k).any(1)  # (G,) the group holds a replayed row
    on_rows_of_replayed = (~batch.off_policy).reshape(n_groups, k) & replayed_group[:, None]  # (G, K)
    return {
        "batch/solved": float(flat.mean()),
        "batch/solve_all": float((solved == k).sum() / n_groups),
        "batch/solve_none": float((solved == 0).sum() / n_groups),
        "batch/fresh_solved": _mean(rewards[~replayed_group].reshape(-1)),
        "batch/replayed_fresh_solved": _mean(rewards[on_rows_of_replayed]),
        "replay/questions": float(batch.n_replayed),
        # compute: response tokens sampled this step (the stored trajectories were not), and in the loss
        "compute/rollout_tokens": float(batch.mask[~batch.off_policy].sum()),
        "compute/grad_tokens": float(batch.mask.sum()),
        "compute/fresh_questions": float(n_groups - batch.n_replayed),
    }


def _mean(x: torch.Tensor) -> float:
    """Mean of ``x``; 0.0 when empty (a step with no such rows)."""
    return float(x.mean()) if x.numel() else 0.0
