"""The algorithm section: GRPO, the paper's ExGRPO and the notebook variant."""

from __future__ import annotations

from pydantic import Field, model_validator

from exgrpo.config.options import BucketWeighting, LossAggregation, ReplayKind, SelectionMetric, SelectionMode, Shaping, _Strict


class NotebookReplayConfig(_Strict):
    """The notebook variant's buffer and lambda schedule (notebook-toy.md)."""

    per: int = Field(256, ge=1)
    """Replayed trajectories per step (distinct question ids)."""
    tau: float = Field(300.0, gt=0.0)
    """Recency temperature of the priority exp(-age/tau) * reward / (1 + entropy), age in steps."""
    max_len: int = Field(3000, ge=1)
    """Buffer capacity; the oldest entries are evicted first."""
    uid_cap: int = Field(3, ge=1)
    """At most this many trajectories per question."""
    kl_beta: float = Field(1e-3, ge=0.0)
    """Weight of the light KL(current || new) term of the off-policy loss."""
    is_clip: float = Field(2.0, gt=0.0)
    """Upper clamp of the detached importance weight w."""
    warm: int = Field(5, ge=0)
    """Epochs with lambda = 0."""
    peak: int = Field(25, ge=0)
    """Epoch where lambda stops rising and starts to decay."""
    lambda_max: float = Field(0.5, ge=0.0, le=1.0)
    """Upper bound of lambda."""
    lambda_min: float = Field(0.2, ge=0.0, le=1.0)
    """Lower bound of lambda after the peak."""
    alpha: float = Field(0.03, ge=0.0)
    """Rise of lambda per epoch after warm."""
    beta: float = Field(0.01, ge=0.0)
    """Decay of lambda per epoch after peak."""

    @model_validator(mode="after")
    def _order(self) -> NotebookReplayConfig:
        if self.peak < self.warm:
            raise ValueError(f"peak={self.peak} must be >= warm={self.warm}")
        if self.lambda_min > self.lambda_max:
            raise ValueError(f"lambda_min={self.lambda_min} must be <= lambda_max={self.lambda_max}")
        return self


class AlgorithmConfig(_Strict):
    """GRPO, ExGRPO and the notebook variant: every algorithmic knob (defaults: the reference run)."""

    replay: ReplayKind = ReplayKind.BUCKETS
    """Experience replay: none (GRPO), buckets (paper ExGRPO) or notebook."""
    group_size: int = Field(8, ge=2)
    """K: rollouts per question (a replayed question gets K-1 fresh ones plus the replayed one, which
    counts toward its k, as in the reference: spec §11.7)."""
    advantage_std_norm: bool = False
    """Divide group-centred rewards by the group std (reference: off, Dr.GRPO style)."""
    clip_eps: float = Field(0.2, gt=0.0, lt=1.0)
    """PPO clip range epsilon of the on-policy surrogate."""
    drop_clip_after_replay_start: bool = True
    """Drop on-policy clipping once replay has started (reference: loss_remove_clip=True)."""
    entropy_coeff: float = Field(0.001, ge=0.0)
    """Weight of the entropy bonus (token mean over all response tokens)."""
    kl_coeff: float = Field(0.0, ge=0.0)
    """Weight of a low-variance KL penalty toward the behaviour policy (reference: 0)."""
    loss_agg: LossAggregation = LossAggregation.TOKEN_SUM_NORM
    """Aggregation of per-token losses."""

    experience_ratio: float = Field(0.5, ge=0.0, le=1.0)
    """Fraction of the batch's questions drawn from the experience pool once replay has started."""
    replay_start_pass_rate: float = Field(0.35, ge=0.0, le=1.0)
    """Replay switches on (one way) once a batch's pass@1 exceeds this."""
    bucket_lbound: int = Field(0, ge=0)
    """Collect/bucket a question iff lbound < k <= rbound (k = correct rollouts of K)."""
    bucket_rbound: int | None = None
    """Upper collection bound on k; None means K-1 (the reference's 7 for K=8)."""
    bucket_weighting: BucketWeighting = BucketWeighting.NORMAL
    """Bucket weighting over the latest success count k."""
    bucket_sigma: float = Field(1.0, gt=0.0)
    """Std (in count units) of the normal weighting, centred on K/2."""
    selection_metric: SelectionMetric = SelectionMetric.ENTROPY
    """Metric that chooses which stored trajectory of a question is replayed."""
    selection_mode: SelectionMode = SelectionMode.ARGMIN
    """Replay the trajectory with the lowest or highest metric."""
    shaping: Shaping = Shaping.POLICY_SHAPING
    """f(w) on replayed tokens."""
    shaping_gamma: float = Field(0.1, gt=0.0)
    """gamma of policy shaping f(w) = w / (w + gamma)."""
    is_clip: float = Field(2.0, gt=0.0)
    """c of truncation f(w) = min(w, c)."""
    is_correction: bool = True
    """Use the stored behaviour log-probs for replayed tokens (else w = 1 at the current policy)."""
    pool_max_per_question: int | None = Field(None, ge=1)
    """Keep at most this many trajectories per question (oldest dropped); None: unbounded."""
    pool_max_questions: int | None = Field(None, ge=1)
    """Keep at most this many questions in the pool (least recently updated evicted); None: unbounded."""

    notebook: NotebookReplayConfig = NotebookReplayConfig()
    """Settings of the notebook replay variant (used when replay = notebook)."""

    @property
    def rbound(self) -> int:
        """The effective upper bound on k."""
        return self.group_size - 1 if self.bucket_rbound is None else self.bucket_rbound

    @model_validator(mode="after")
    def _bounds(self) -> AlgorithmConfig:
        k = self.group_size
        if self.bucket_rbound is not None and self.bucket_rbound > k:
            raise ValueError(
                f"bucket_rbound={self.bucket_rbound} exceeds group_size K={k}; use a value in "
                f"[bucket_lbound+1, {k}] or null for K-1"
            )
        if self.bucket_lbound >= self.rbound:
            raise ValueError(
                f"bucket_lbound={self.bucket_lbound} must be < bucket_rbound={self.rbound} "
                "(questions are collected iff lbound < k <= rbound)"
            )
        return self
