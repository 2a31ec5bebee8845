"""The algorithm section: one config class per algorithm, chosen by ``replay``.

``AlgorithmConfig`` is a discriminated union: ``replay: none`` is :class:`GRPOConfig`, ``buckets``
:class:`ExGRPOConfig`, ``uniform`` :class:`UniformReplayConfig` and ``notebook``
:class:`NotebookConfig`. Each holds only the fields its algorithm reads. A field of another
algorithm is an error that names it (a resolved config written before the split, which lists every
field, still loads: fields of another algorithm at their default value are dropped).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BeforeValidator, Discriminator, Field, Tag, TypeAdapter, ValidationError, model_validator

from exgrpo.config.options import (
    BucketWeighting,
    NotebookSampling,
    LossAggregation,
    PoolRetention,
    ReplayKind,
    SelectionMetric,
    SelectionMode,
    Shaping,
    _Strict,
)


class NotebookReplayConfig(_Strict):
    """The notebook variant's buffer and lambda schedule."""

    per: int = Field(256, ge=1)
    """Replayed trajectories per step (distinct question ids)."""
    sampling: NotebookSampling = NotebookSampling.PROPORTIONAL
    """proportional: draw in proportion to priority without replacement (the notebook); top: the
    highest priorities (labelled notebook-top)."""
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


class OnPolicyConfig(_Strict):
    """What every algorithm has: GRPO's group, advantages and on-policy loss."""

    replay: ReplayKind = ReplayKind.BUCKETS
    """Experience replay: none (GRPO), buckets (paper ExGRPO), uniform (pool sampled uniformly) or notebook."""
    group_size: int = Field(8, ge=2)
    """K: rollouts per question (a replayed question gets K-1 fresh ones plus the replayed one, which
    counts toward its k, as in the reference: spec §11.7)."""
    advantage_std_norm: bool = False
    """Divide group-centred rewards by the group std (reference: off, Dr.GRPO style)."""
    clip_eps: float = Field(0.2, gt=0.0, lt=1.0)
    """PPO clip range epsilon of the on-policy surrogate."""
    entropy_coeff: float = Field(0.001, ge=0.0)
    """Weight of the entropy bonus (token mean over all response tokens)."""
    kl_coeff: float = Field(0.0, ge=0.0)
    """Weight of a low-variance (k3) KL penalty toward the behaviour policy, both backends (reference: 0)."""
    loss_agg: LossAggregation = LossAggregation.TOKEN_SUM_NORM
    """Aggregation of per-token losses."""


class GRPOConfig(OnPolicyConfig):
    """On-policy GRPO: no experience, no replay."""

    replay: Literal[ReplayKind.NONE] = ReplayKind.NONE
    """none: on-policy GRPO."""


class PoolReplayConfig(OnPolicyConfig):
    """The algorithms that keep ExGRPO's experience pool (buckets, uniform): the pool, replay start switch, trajectory selection and off-policy correction."""

    drop_clip_after_replay_start: bool = True
    """Drop on-policy clipping once replay has started (reference: loss_remove_clip=True)."""
    experience_ratio: float = Field(0.5, ge=0.0, le=1.0)
    """Fraction of the batch's questions drawn from the experience pool once replay has started."""
    replay_adds_to_batch: bool = False
    """Replayed questions come on top of batch_size fresh ones (GRPO's fresh budget) instead of taking fresh slots (the paper)."""
    replay_start_pass_rate: float = Field(0.35, ge=0.0, le=1.0)
    """Replay switches on (one way) once a batch's pass@1 exceeds this."""
    bucket_lbound: int = Field(0, ge=0)
    """Collect/bucket a question iff lbound < k <= rbound (k = correct rollouts of K)."""
    bucket_rbound: int | None = None
    """Upper collection bound on k; None means K-1 (the reference's 7 for K=8)."""
    retire_solved: bool = True
    """A group that solves its question K/K retires it for good (the paper): its pool entry is deleted
    and it is never drawn again, fresh or replayed. False: it stays in the fresh pass, and a K/K group
    is an outcome like any other outside the bounds (nothing changes; with bucket_rbound = K it is
    collected into bucket K)."""
    store_single_successes: bool = True
    """Store the success of a group with exactly one correct rollout of K (found once in K samples,
    perhaps by luck; the paper). False: such a group stores nothing, so a question it would bring
    into the pool stays out, and a pooled question still moves to bucket 1 (its latest k) keeping
    the trajectories it has. Unlike bucket_lbound: 1, k = 1 still counts as the question's bucket."""
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
    """Keep at most this many trajectories per question (which ones: pool_retention); None: all (the paper)."""
    pool_retention: PoolRetention = PoolRetention.NEWEST
    """Under pool_max_per_question: keep the newest trajectories, or the lowest-entropy ones."""
    pool_spill_dir: str | None = None
    """Keep the pool's token arrays as memory-mapped files under this directory (pools bigger than RAM); None: in RAM."""
    pool_max_questions: int | None = Field(None, ge=1)
    """Keep at most this many questions in the pool (least recently updated evicted); None: unbounded."""

    @property
    def rbound(self) -> int:
        """The effective upper bound on k."""
        return self.group_size - 1 if self.bucket_rbound is None else self.bucket_rbound

    @model_validator(mode="after")
    def _bounds(self) -> PoolReplayConfig:
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


class ExGRPOConfig(PoolReplayConfig):
    """The paper's ExGRPO: questions replayed by correctness bucket, with Gaussian bucket weights."""

    replay: Literal[ReplayKind.BUCKETS] = ReplayKind.BUCKETS
    """buckets: the paper's ExGRPO."""
    bucket_weighting: BucketWeighting = BucketWeighting.NORMAL
    """Bucket weighting over the latest success count k."""
    bucket_sigma: float = Field(1.0, gt=0.0)
    """Std (in count units) of the normal weighting."""
    bucket_center: float | None = Field(None, ge=0.0)
    """Centre (in count units, 0..K) of the normal weighting; None means K/2 (the reference)."""

    @model_validator(mode="after")
    def _center(self) -> ExGRPOConfig:
        if self.bucket_center is not None and self.bucket_center > self.group_size:
            raise ValueError(f"bucket_center={self.bucket_center} exceeds group_size K={self.group_size}; "
                             f"use a value in [0, {self.group_size}] or null for K/2")
        return self


class UniformReplayConfig(PoolReplayConfig):
    """An ablation of ExGRPO: the same pool and switch, replayed questions drawn uniformly."""

    replay: Literal[ReplayKind.UNIFORM] = ReplayKind.UNIFORM
    """uniform: ExGRPO's pool, questions drawn uniformly (no buckets)."""


class NotebookConfig(OnPolicyConfig):
    """The notebook variant: a recency/entropy priority buffer and a lambda-weighted replay term."""

    replay: Literal[ReplayKind.NOTEBOOK] = ReplayKind.NOTEBOOK
    """notebook: the notebook variant."""
    notebook: NotebookReplayConfig = NotebookReplayConfig()
    """Its buffer and lambda schedule."""


ALGORITHM_CONFIGS: dict[ReplayKind, type[OnPolicyConfig]] = {
    ReplayKind.NONE: GRPOConfig,
    ReplayKind.BUCKETS: ExGRPOConfig,
    ReplayKind.UNIFORM: UniformReplayConfig,
    ReplayKind.NOTEBOOK: NotebookConfig,
}
"""replay -> its config class (a new replay strategy adds one entry)."""

DEFAULT_REPLAY = ReplayKind.BUCKETS
"""An algorithm section without ``replay`` is the paper's ExGRPO."""


def _replay_of(data: Any) -> str:
    if isinstance(data, dict):
        return str(data.get("replay", DEFAULT_REPLAY.value))
    return str(getattr(data, "replay", DEFAULT_REPLAY.value))


def _is_default(cls: type[OnPolicyConfig], name: str, value: Any) -> bool:
    field = cls.model_fields[name]
    try:
        return TypeAdapter(field.annotation).validate_python(value) == field.default
    except ValidationError:
        return False


def replay_homes(name: str) -> list[str]:
    """The replay kinds whose algorithm config has field ``name`` (empty: no algorithm has it)."""
    return [k.value for k, c in ALGORITHM_CONFIGS.items() if name in c.model_fields]


def is_foreign(name: str, replay: str) -> bool:
    """Whether ``name`` is a field of some algorithm but not of ``replay``'s (an unknown replay
    owns every field: validation names it)."""
    kinds = {k.value for k in ReplayKind}
    return replay in kinds and bool(replay_homes(name)) and name not in ALGORITHM_CONFIGS[ReplayKind(replay)].model_fields


def _own_fields_only(data: Any) -> Any:
    """Check ``replay`` and drop or refuse the fields of other algorithms (before the union picks a class)."""
    if not isinstance(data, dict):
        return data
    replay = _replay_of(data)
    if replay not in {k.value for k in ReplayKind}:
        raise ValueError(f"replay={replay!r} is not a replay kind; use one of {[k.value for k in ReplayKind]}")
    out = {}
    for name, value in data.items():
        homes = replay_homes(name)
        if not is_foreign(name, replay):  # unknown names are left to the extra-field check
            out[name] = value
        elif not _is_default(ALGORITHM_CONFIGS[ReplayKind(homes[0])], name, value):
            raise ValueError(
                f"{name}={value!r} is a setting of replay={'/'.join(homes)}, not of replay={replay}; "
                f"remove it here (set it only where replay is {' or '.join(homes)}, e.g. in that arm)"
            )
    return out


AlgorithmConfig = Annotated[
    Annotated[
        Union[tuple(Annotated[cls, Tag(kind.value)] for kind, cls in ALGORITHM_CONFIGS.items())],  # noqa: UP007
        Discriminator(_replay_of),
    ],
    BeforeValidator(_own_fields_only),
]
"""The algorithm section: one class per algorithm, chosen by ``replay`` (default: buckets)."""
