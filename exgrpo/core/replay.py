"""The life of the experience pool, one step at a time: one replay strategy per algorithm.

Every backend runs the same step, in this order (``exgrpo.backends.native.trainer`` and
``exgrpo.backends.verl.trainer`` are thin adapters around it):

    n        = strategy.plan(batch_size)              # how many replayed questions this step
    replays  = strategy.select(n, score)              # which questions, which stored trajectories
    fresh    = fresh_sampler.next(strategy.fresh_count(batch_size, len(replays)), strategy.retired)
    ...        the backend rolls out K-1 rows per replayed question, K per fresh one; rewards
    strategy.observe(batch, rewards, step)            # pool insert, retirement, bucket moves
    aux      = strategy.auxiliary(epoch, step)        # an extra off-policy loss term, if any
    ...        loss (``strategy.mixed_phase``: on-policy clipping dropped), optimiser update
    metrics |= strategy.stats()
    strategy.after_step(batch_pass_rate, step)        # the one-way replay start switch
    checkpoint <- strategy.state_dict()

A new strategy is one class here, registered with :func:`register_replay` under a
:class:`~exgrpo.config.ReplayKind`; no backend changes.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from exgrpo.config import (
    AlgorithmConfig,
    NotebookConfig,
    NotebookSampling,
    OnPolicyConfig,
    PoolReplayConfig,
    ReplayKind,
    SelectionMetric,
)
from exgrpo.core.batch import Replays, StepBatch, rewarded_groups
from exgrpo.core.loss import MixedLossConfig, notebook_off_policy_loss
from exgrpo.core.notebook_buffer import NotebookBuffer
from exgrpo.core.pool import ExperiencePool, Trajectory
from exgrpo.core.sampler import sample_questions
from exgrpo.core.schedules import ReplayStartSwitch, notebook_lambda
from exgrpo.core.selection import pad_right, select_per_group, trajectory_metric

StoredScorer = Callable[[list[int], torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
"""(qids (B,), tokens (B, T), mask (B, T)) -> (log_prob (B, T), entropy (B, T)) of the *current*
policy on stored responses, without gradients. The backend provides it."""


@dataclass
class AuxiliaryReplay:
    """An extra off-policy loss term mixed into every mini-batch: (1 - weight) * main + weight * aux."""

    weight: float
    qids: list[int]
    """(B,) question of each replayed response."""
    tokens: torch.Tensor
    """(B, T) long, right-padded stored responses."""
    mask: torch.Tensor
    """(B, T) bool."""
    old_log_prob: torch.Tensor
    """(B, T) float32 stored behaviour log-probs."""
    needs_full_log_prob: bool
    """Whether :meth:`loss` needs the (B, T, V) log-probs over the vocabulary."""
    loss_fn: Callable[..., tuple[torch.Tensor, dict[str, float]]]
    """(log_prob (B, T), full_log_prob (B, T, V) | None) -> (loss, metrics)."""

    def loss(self, log_prob: torch.Tensor, full_log_prob: torch.Tensor | None) -> tuple[torch.Tensor, dict[str, float]]:
        return self.loss_fn(log_prob, full_log_prob)


class ReplayStrategy:
    """On-policy GRPO: the base strategy replays nothing, stores nothing and never mixes."""

    label: ClassVar[str] = "grpo"
    """Short algorithm name (MLflow ``algo`` tag, run names); see :meth:`label_for`."""

    @classmethod
    def label_for(cls, algo: OnPolicyConfig) -> str:
        """The label of this strategy run with ``algo`` (a variant's settings may show in it)."""
        return cls.label

    def __init__(self, algo: OnPolicyConfig, rng: np.random.Generator) -> None:
        self.algo = algo
        self.rng = rng
        """Shared with the backend's other numpy draws (one saved generator state per run)."""
        self._active = False

    # ---------------------------------------------------------------- the step, in order
    def plan(self, batch_size: int) -> int:
        """How many of this step's ``batch_size`` questions are replayed from experience."""
        self._active = False
        return 0

    def select(self, n: int, score: StoredScorer) -> Replays:
        """Pick ``n`` questions and one stored trajectory each."""
        return Replays.empty()

    def fresh_count(self, batch_size: int, n_replayed: int) -> int:
        """Fresh questions this step: the batch's slots the replayed questions left (the paper)."""
        return batch_size - n_replayed

    @property
    def retired(self) -> AbstractSet[int]:
        """Questions the fresh sampler must skip from its next pass on (read-only)."""
        return frozenset()

    def observe(self, batch: StepBatch, rewards: torch.Tensor, step: int) -> None:
        """See the step's rewarded groups ((G, K) binary rewards in ``batch`` order)."""

    def auxiliary(self, epoch: int, step: int) -> AuxiliaryReplay | None:
        """An extra off-policy loss term for this step's update, or None."""
        return None

    @property
    def mixed_phase(self) -> bool:
        """Whether the mixed on/off-policy phase has begun (the loss may drop on-policy clipping)."""
        return False

    def loss_config(self, norm_length: int) -> MixedLossConfig:
        """This step's loss options: the clipped on-policy surrogate (no replayed tokens to shape)."""
        return MixedLossConfig(clip_eps=self.algo.clip_eps, norm_length=norm_length)

    def stats(self) -> dict[str, float]:
        """This step's replay metrics (METRICS.md)."""
        return {"replay/active": float(self._active), "replay/started": float(self.mixed_phase)}

    def after_step(self, batch_pass_rate: float, step: int) -> None:
        """Schedules that depend on the step's outcome."""

    # ---------------------------------------------------------------- persistence
    def state_dict(self) -> dict[str, Any]:
        """Everything that must survive a resume (tensors and plain containers only)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


REPLAY_STRATEGIES: dict[ReplayKind, type[ReplayStrategy]] = {}


def register_replay(kind: ReplayKind) -> Callable[[type[ReplayStrategy]], type[ReplayStrategy]]:
    def deco(cls: type[ReplayStrategy]) -> type[ReplayStrategy]:
        REPLAY_STRATEGIES[kind] = cls
        return cls

    return deco


def make_replay_strategy(algo: AlgorithmConfig, rng: np.random.Generator) -> ReplayStrategy:
    """The strategy ``algo.replay`` names, built from ``algo``."""
    return REPLAY_STRATEGIES[ReplayKind(algo.replay)](algo, rng)


register_replay(ReplayKind.NONE)(ReplayStrategy)


def single_success_counts(trajectories: list[Trajectory]) -> tuple[int, int, float, float]:
    """Of the replayed ``trajectories``: how many, how many were collected from a group with exactly
    one correct rollout of K (``group_correct == 1``), and the sums over those and over the others of
    each trajectory's mean stored behaviour log-prob per token."""
    single = [t for t in trajectories if t.group_correct == 1]
    multi = [t for t in trajectories if t.group_correct != 1]

    def total(ts: list[Trajectory]) -> float:
        return float(sum(sum(t.behaviour_log_prob) / max(len(t.behaviour_log_prob), 1) for t in ts))

    return len(trajectories), len(single), total(single), total(multi)


def single_success_metrics(counts: tuple[int, int, float, float], suffix: str = "") -> dict[str, float]:
    """:func:`single_success_counts` (of one step, or summed over a run) as METRICS.md's
    ``replay/single_success_*`` metrics; a log-prob mean is left out when no trajectory is in its class."""
    n, n_single, lp_single, lp_multi = counts
    if n == 0:
        return {}
    out = {f"replay/single_success_share{suffix}": n_single / n}
    if n_single:
        out[f"replay/single_success_log_prob{suffix}"] = lp_single / n_single
    if n > n_single:
        out[f"replay/multi_success_log_prob{suffix}"] = lp_multi / (n - n_single)
    return out


@register_replay(ReplayKind.BUCKETS)
class BucketReplay(ReplayStrategy):
    """The paper's ExGRPO (exgrpo-spec.md §2-§7): correctness buckets, Gaussian bucket weights,
    lowest-entropy trajectory, replay from the step after batch pass@1 first exceeds the threshold."""

    label = "exgrpo"

    def __init__(self, algo: PoolReplayConfig, rng: np.random.Generator) -> None:
        super().__init__(algo, rng)
        self.pool = ExperiencePool(
            algo.group_size, algo.bucket_lbound, algo.rbound, algo.pool_max_per_question, algo.pool_max_questions,
            algo.pool_retention, algo.pool_spill_dir, algo.retire_solved,
        )
        self.switch = ReplayStartSwitch(algo.replay_start_pass_rate)
        self._step_counts = (0, 0, 0.0, 0.0)
        """:func:`single_success_counts` of this step's replayed trajectories."""
        self._run_counts = (0, 0, 0.0, 0.0)
        """The same summed over the run (checkpointed)."""

    def plan(self, batch_size: int) -> int:
        self._active = self.switch.started
        self._step_counts = (0, 0, 0.0, 0.0)
        return round(self.algo.experience_ratio * batch_size) if self._active else 0

    def stores(self, num_correct: int) -> bool:
        """Whether a group with ``num_correct`` correct rollouts stores its successes (the pool's
        bounds decide the rest): none without a success, none from a single one when
        ``store_single_successes`` is off."""
        return num_correct > 1 or (num_correct == 1 and self.algo.store_single_successes)

    def fresh_count(self, batch_size: int, n_replayed: int) -> int:
        """``replay_adds_to_batch``: always ``batch_size`` fresh questions, replay on top (GRPO's
        fresh budget); else the paper's fixed batch, replay taking fresh slots."""
        return batch_size if self.algo.replay_adds_to_batch else batch_size - n_replayed

    def sample_questions(self, n: int) -> list[int]:
        """Which pooled questions to replay (bucket mass, then uniform within a bucket)."""
        a = self.algo
        return sample_questions(
            self.pool.bucket_views(), n, a.group_size, self.rng, a.bucket_weighting, a.bucket_sigma, a.bucket_center
        )

    def select(self, n: int, score: StoredScorer) -> Replays:
        qids = self.sample_questions(n)
        if not qids:
            return Replays.empty()
        rows: list[int] = []  # every stored trajectory of the sampled questions (store row ids)
        owner: list[int] = []
        for g, q in enumerate(qids):
            for r in self.pool.rows(q):
                rows.append(r)
                owner.append(g)
        a = self.algo
        current: torch.Tensor | None = None
        if a.selection_metric == SelectionMetric.RANDOM:
            picked = select_per_group(None, owner, a.selection_mode, self.rng)
        else:
            tokens, _, mask = self.pool.padded(rows)
            log_prob, entropy = score([qids[g] for g in owner], tokens, mask)
            picked = select_per_group(trajectory_metric(a.selection_metric, log_prob, entropy, mask), owner,
                                      a.selection_mode, self.rng)
            current = log_prob[picked]
        chosen = [rows[i] for i in picked]
        trajs = [self.pool.trajectory(r) for r in chosen]
        self._step_counts = single_success_counts(trajs)
        self._run_counts = tuple(a + b for a, b in zip(self._run_counts, self._step_counts, strict=True))
        if a.is_correction:
            _, old, _ = self.pool.padded(chosen)
        else:  # w = 1 at the current policy: its log-probs play pi_old
            if current is None:
                tokens, _, mask = self.pool.padded(chosen)
                current, _ = score(qids, tokens, mask)
            old = current.float()
        return Replays(qids, trajs, old, [self.pool.bucket_of(q) for q in qids])

    @property
    def retired(self) -> AbstractSet[int]:
        return self.pool.retired

    def observe(self, batch: StepBatch, rewards: torch.Tensor, step: int) -> None:
        for g in rewarded_groups(batch, rewards, step):
            # retirement always; collection once replay has started (reference)
            self.pool.observe_group(g.qid, g.num_correct, g.correct if self.stores(g.num_correct) else [], step,
                                    self.switch.started)

    @property
    def mixed_phase(self) -> bool:
        return self.switch.started

    def loss_config(self, norm_length: int) -> MixedLossConfig:
        """On-policy clipping dropped once mixing (if configured); replayed tokens shaped by f(w)."""
        a = self.algo
        return MixedLossConfig(
            clip_eps=a.clip_eps, clip_on_policy=not (self.mixed_phase and a.drop_clip_after_replay_start),
            shaping=a.shaping, shaping_gamma=a.shaping_gamma, is_clip=a.is_clip, norm_length=norm_length,
        )

    def stats(self) -> dict[str, float]:
        return {**super().stats(), **self.pool.stats(), **single_success_metrics(self._step_counts),
                **single_success_metrics(self._run_counts, "_run")}

    def after_step(self, batch_pass_rate: float, step: int) -> None:
        self.switch.update(batch_pass_rate, step)

    def state_dict(self) -> dict[str, Any]:
        return {"pool": self.pool.state_dict(), "switch": self.switch.state_dict(),
                "single_success_counts": list(self._run_counts)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pool.load_state_dict(state["pool"])
        self.switch.load_state_dict(state["switch"])
        n, n_single, lp_single, lp_multi = state.get("single_success_counts", (0, 0, 0.0, 0.0))  # absent before it
        self._run_counts = (int(n), int(n_single), float(lp_single), float(lp_multi))


@register_replay(ReplayKind.UNIFORM)
class UniformReplay(BucketReplay):
    """An ablation of ExGRPO's question sampling: the same pool, start switch and trajectory
    selection, but replayed questions are drawn uniformly from the pool, ignoring buckets."""

    label = "uniform-replay"

    def sample_questions(self, n: int) -> list[int]:
        qids = [q for qs in self.pool.buckets().values() for q in qs]
        n = min(n, len(qids))
        if n <= 0:
            return []
        return [int(qids[i]) for i in self.rng.choice(len(qids), size=n, replace=False)]


@register_replay(ReplayKind.NOTEBOOK)
class NotebookReplay(ReplayStrategy):
    """The notebook variant (notebook-toy.md): every correct rollout goes into a recency/entropy
    priority buffer; from epoch ``warm`` on, each update mixes in an off-policy term with weight
    lambda(epoch). Fresh batches are never displaced, and there is no mixed phase."""

    label = "notebook"

    @classmethod
    def label_for(cls, algo: NotebookConfig) -> str:
        return cls.label if algo.notebook.sampling == NotebookSampling.PROPORTIONAL else f"{cls.label}-top"

    def __init__(self, algo: NotebookConfig, rng: np.random.Generator) -> None:
        super().__init__(algo, rng)
        nb = algo.notebook
        self.buffer = NotebookBuffer(nb.max_len, nb.uid_cap, nb.tau)
        self._lambda = 0.0

    def observe(self, batch: StepBatch, rewards: torch.Tensor, step: int) -> None:
        for g in rewarded_groups(batch, rewards, step):
            for t in g.correct:
                self.buffer.add(g.qid, t)

    def auxiliary(self, epoch: int, step: int) -> AuxiliaryReplay | None:
        nb = self.algo.notebook
        self._lambda = notebook_lambda(epoch, nb)
        rng = self.rng if nb.sampling == NotebookSampling.PROPORTIONAL else None
        samples = self.buffer.sample(nb.per, step, rng) if self._lambda > 0 else []
        if not samples:
            return None
        tokens, mask = pad_right([t.tokens for _, t in samples])
        old, _ = pad_right([t.behaviour_log_prob for _, t in samples], dtype=torch.float32)

        def loss_fn(log_prob, full_log_prob):
            return notebook_off_policy_loss(log_prob, old, mask, nb.is_clip, nb.kl_beta, full_log_prob)

        return AuxiliaryReplay(self._lambda, [q for q, _ in samples], tokens, mask, old, True, loss_fn)

    def stats(self) -> dict[str, float]:
        return {**super().stats(), **self.buffer.stats(), "notebook/lambda": self._lambda}

    def state_dict(self) -> dict[str, Any]:
        return {"buffer": self.buffer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.buffer.load_state_dict(state["buffer"])
