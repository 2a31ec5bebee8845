"""One typed config: the single source of truth for a run.

Every field carries a one-line docstring. YAML files in ``experiments/`` are parsed into
:class:`ExperimentConfig`; ``--set a.b=c`` overrides are applied before validation, so an invalid
run fails before any work starts, with an error that names the field, the bad value and what is
allowed. Prefect parameters, the Optuna search space and MLflow params are derived from here.
"""

from __future__ import annotations

import copy
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class ConfigError(ValueError):
    """A configuration problem, phrased for the user: which field, which value, what is allowed."""


# --------------------------------------------------------------------------------------------
# Option enums (each value a registry key in exgrpo.core)
# --------------------------------------------------------------------------------------------
class ReplayKind(StrEnum):
    """Which experience-replay algorithm runs beside on-policy GRPO."""

    NONE = "none"  # on-policy GRPO
    BUCKETS = "buckets"  # the paper's ExGRPO: correctness buckets, Gaussian bucket weights
    NOTEBOOK = "notebook"  # the notebook variant: recency/entropy priority + lambda schedule


class BucketWeighting(StrEnum):
    """Weight of a bucket keyed by the latest success count k (exgrpo-spec.md §3)."""

    NORMAL = "normal"
    LINEAR = "linear"
    SQRT = "sqrt"
    LINEAR_CLIP = "linear_clip"
    UNIFORM = "uniform"


class SelectionMetric(StrEnum):
    """How the trajectory to replay is chosen among a question's stored ones."""

    ENTROPY = "entropy"  # mean token entropy under the current policy (the intended behaviour)
    PERPLEXITY = "perplexity"  # exp(-mean token log-prob) under the current policy
    RANDOM = "random"


class SelectionMode(StrEnum):
    """Pick the trajectory with the lowest (argmin) or highest (argmax) metric."""

    ARGMIN = "argmin"
    ARGMAX = "argmax"


class Shaping(StrEnum):
    """f(w) applied to the importance ratio w of replayed tokens."""

    IDENTITY = "identity"  # f(w) = w
    POLICY_SHAPING = "policy_shaping"  # f(w) = w / (w + gamma)   (reference: p_div_p_0.1)
    TRUNCATE = "truncate"  # f(w) = min(w, is_clip)


class LossAggregation(StrEnum):
    """How per-token losses become one scalar (names follow veRL's agg_loss modes)."""

    TOKEN_MEAN = "token-mean"
    SEQ_MEAN_TOKEN_MEAN = "seq-mean-token-mean"
    SEQ_MEAN_TOKEN_SUM = "seq-mean-token-sum"
    TOKEN_SUM_NORM = "token-sum-norm"  # sum over tokens / max_response_length (the reference)


class Tier(StrEnum):
    """Model/task size; all tiers share the config schema, the core and the trainer step."""

    TOY = "toy"
    TINY_LM = "tiny-lm"
    SMOLLM2 = "smollm2"
    PAPER = "paper"


class OptimizerKind(StrEnum):
    """Optimiser of the policy parameters."""

    ADAM = "adam"
    ADAMW = "adamw"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=True)


# --------------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------------
class ToyTaskConfig(_Strict):
    """Integer addition/subtraction from feature vectors (notebook-toy.md)."""

    kind: Literal["toy_arithmetic"] = "toy_arithmetic"
    """Task registry key."""
    max_operand: int = Field(30, ge=1, le=1000)
    """Operands a, b are drawn from 0..max_operand; answers lie in [-max_operand, 2*max_operand]."""
    val_fraction: float = Field(0.2, gt=0.0, lt=1.0)
    """Fraction of all (a, op, b) questions held out for validation."""
    data_seed: int = 1234
    """Seed of the train/validation split (fixed across run seeds so arms see the same data)."""


class MLPPolicyConfig(_Strict):
    """MLP policy: logits over every candidate answer."""

    kind: Literal["mlp"] = "mlp"
    """Policy registry key."""
    hidden: int = Field(256, ge=1)
    """Width of each hidden block."""
    layers: int = Field(5, ge=1)
    """Number of Linear+ReLU blocks."""


class ArithmeticProblemsConfig(_Strict):
    """The distribution of arithmetic questions (shared by the SFT warm start and the RL task)."""

    min_operands: int = Field(2, ge=2, le=6)
    """Fewest operands in an expression."""
    max_operands: int = Field(3, ge=2, le=6)
    """Most operands in an expression."""
    max_operand: int = Field(20, ge=1, le=999)
    """Operands of + and - are drawn from 0..max_operand."""
    max_factor: int = Field(9, ge=1, le=999)
    """Operands next to a * are drawn from 0..max_factor (keeps products short)."""
    ops: str = "+-*"
    """Operators to draw from (a subset of "+-*")."""

    @model_validator(mode="after")
    def _check(self) -> ArithmeticProblemsConfig:
        if self.min_operands > self.max_operands:
            raise ValueError(f"min_operands={self.min_operands} must be <= max_operands={self.max_operands}")
        if not self.ops or set(self.ops) - set("+-*"):
            raise ValueError(f"ops={self.ops!r} must be a non-empty subset of '+-*'")
        return self


class TextArithmeticTaskConfig(_Strict):
    """Text arithmetic questions with worked answers (tiny-lm tier)."""

    kind: Literal["text_arithmetic"] = "text_arithmetic"
    """Task registry key."""
    problems: ArithmeticProblemsConfig = ArithmeticProblemsConfig()
    """Question distribution (keep equal to the tiny LM's SFT distribution)."""
    n_train: int = Field(2000, ge=1)
    """Training questions."""
    n_val: int = Field(500, ge=1)
    """Held-out validation questions."""
    data_seed: int = 1234
    """Seed of the question set and of the train/validation split."""




class TinyLMConfig(_Strict):
    """Architecture, SFT data and SFT schedule of the tiny LM (all of it enters the cache key)."""

    arch: Literal["llama", "qwen2"] = "llama"
    """transformers model family the model is built from (config only, no hub)."""
    hidden_size: int = Field(128, ge=8)
    """Model width."""
    num_layers: int = Field(2, ge=1)
    """Decoder layers."""
    num_heads: int = Field(4, ge=1)
    """Attention heads."""
    num_kv_heads: int = Field(2, ge=1)
    """Key/value heads (grouped-query attention)."""
    intermediate_size: int = Field(256, ge=8)
    """MLP width."""
    max_position_embeddings: int = Field(128, ge=16)
    """Longest prompt + response."""
    problems: ArithmeticProblemsConfig = ArithmeticProblemsConfig()
    """SFT question distribution (the RL task should use the same)."""
    sft_steps: int = Field(400, ge=0)
    """Optimiser steps of the warm start (the knob that sets the warm-start accuracy)."""
    sft_batch_size: int = Field(64, ge=1)
    """Sequences per SFT step."""
    sft_lr: float = Field(3e-3, gt=0)
    """Peak learning rate (linear warm-up, cosine decay to 10%)."""
    sft_warmup: int = Field(30, ge=0)
    """Warm-up steps."""
    sft_weight_decay: float = Field(0.0, ge=0)
    """AdamW weight decay."""
    seed: int = 0
    """Seed of the initial weights and of the SFT data."""
    eval_questions: int = Field(500, ge=0)
    """Validation questions of the default RL task used to record the warm-start accuracy (0: skip)."""
    eval_max_new_tokens: int = Field(40, ge=1)
    """Response budget of that evaluation."""




class LMPolicyConfig(_Strict):
    """Sampling settings of an LM policy (the model itself comes from the tier, e.g. TinyLMConfig)."""

    kind: Literal["lm"] = "lm"
    """Policy registry key."""
    max_new_tokens: int = Field(40, ge=1)
    """Longest response, EOS included (also the L of token-sum-norm aggregation)."""
    temperature: float = Field(1.0, gt=0.0)
    """Sampling temperature; log-probs/entropies (behaviour and current) are of softmax(logits / T)."""
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    """Nucleus sampling mass (1: plain sampling; <1 makes behaviour log-probs approximate, see engine)."""
    model: TinyLMConfig = TinyLMConfig()
    """The tiny LM (architecture + SFT warm start; cached by a hash of this section)."""


TaskConfig = Annotated[ToyTaskConfig | TextArithmeticTaskConfig, Field(discriminator="kind")]
"""Task section, chosen by ``kind`` (filled in from ``tier`` when absent)."""
PolicyConfig = Annotated[MLPPolicyConfig | LMPolicyConfig, Field(discriminator="kind")]
"""Policy section, chosen by ``kind`` (filled in from ``tier`` when absent)."""

_TIER_KINDS = {"toy": ("toy_arithmetic", "mlp"), "tiny-lm": ("text_arithmetic", "lm")}


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


class TrainConfig(_Strict):
    """Optimisation, schedule and checkpointing of the native trainer."""

    batch_size: int = Field(128, ge=1)
    """Questions per training step (B)."""
    epochs: int = Field(50, ge=1)
    """Passes over the training questions (fresh draws; steps = epochs * ceil(N_train / B))."""
    max_steps: int | None = Field(None, ge=1)
    """Stop after this many steps (a fixed compute budget); None: epochs decide."""
    optimizer: OptimizerKind = OptimizerKind.ADAM
    """Optimiser."""
    lr: float = Field(3e-4, gt=0.0)
    """Learning rate (constant)."""
    weight_decay: float = Field(0.0, ge=0.0)
    """Weight decay (AdamW only)."""
    mini_batches: int = Field(1, ge=1)
    """Optimiser steps per training step (the batch is split into this many mini-batches)."""
    grad_clip: float = Field(1.0, gt=0.0)
    """Max global grad norm."""
    skip_grad_above: float | None = Field(500.0, gt=0.0)
    """Skip the optimiser step if the grad norm is non-finite or above this (reference: 500)."""
    eval_every_epochs: int = Field(1, ge=1)
    """Validate every this many epochs (and at the end)."""
    eval_before_train: bool = False
    """Also validate the initial (warm-start) policy, logged at step 0."""
    eval_every_steps: int | None = Field(None, ge=1)
    """Validate every this many steps instead (overrides eval_every_epochs); None: use epochs."""
    checkpoint_every: int = Field(0, ge=0)
    """Write a checkpoint every this many steps (0: only at the end)."""
    threads: int = Field(1, ge=1)
    """torch intra-op threads of one training process."""


class ExperimentConfig(_Strict):
    """A run: tier, task, policy, algorithm and training settings."""

    name: str = "toy-exgrpo"
    """Experiment name (the MLflow experiment and the run directory)."""
    tier: Tier = Tier.TOY
    """Model/task tier."""
    seed: int = 0
    """Seed of model init, sampling and replay."""
    output_dir: Path = Path("runs")
    """Where run directories (checkpoints, metrics) are written."""
    task: TaskConfig = ToyTaskConfig()
    """The task (training questions, validation split, reward)."""
    policy: PolicyConfig = MLPPolicyConfig()
    """The policy model."""
    algorithm: AlgorithmConfig = AlgorithmConfig()
    """The RL algorithm."""
    train: TrainConfig = TrainConfig()
    """Optimisation and schedule."""

    @model_validator(mode="before")
    @classmethod
    def _kinds_from_tier(cls, data: Any) -> Any:
        """Fill in ``task.kind``/``policy.kind`` from ``tier`` so YAML files need not repeat them."""
        if not isinstance(data, dict):
            return data
        tier = str(data.get("tier", Tier.TOY.value))
        if tier not in _TIER_KINDS:
            return data  # tiers without a native task/policy are rejected by the check below
        data = dict(data)
        for section, kind in zip(("task", "policy"), _TIER_KINDS[tier], strict=True):
            value = data.get(section)
            if value is None:
                data[section] = {"kind": kind}
            elif isinstance(value, dict) and "kind" not in value:
                data[section] = {"kind": kind, **value}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> ExperimentConfig:
        if self.tier.value not in _TIER_KINDS:
            raise ValueError(
                f"tier={self.tier.value!r} has no native backend yet; use one of {sorted(_TIER_KINDS)}"
            )
        if isinstance(self.policy, LMPolicyConfig) and isinstance(self.task, TextArithmeticTaskConfig):
            if self.task.problems != self.policy.model.problems:
                raise ValueError(
                    "task.problems must equal policy.model.problems (the RL questions must come from the "
                    "tiny LM's SFT distribution); set both, or neither"
                )
        return self

    def run_dir(self) -> Path:
        """Directory of this (experiment, seed) run."""
        return self.output_dir / self.name / f"seed{self.seed}"


class CompareConfig(_Strict):
    """A side-by-side comparison: one base config, named arms of overrides, several seeds."""

    base: ExperimentConfig
    """Settings shared by every arm."""
    arms: dict[str, dict[str, Any]]
    """Arm name -> dotted overrides of the base (e.g. {"algorithm.replay": "none"})."""
    baseline: str = "grpo"
    """Arm that paired differences are computed against."""
    seeds: list[int] = [0, 1, 2, 3, 4]
    """Seeds run for every arm."""
    metric: str = "val/accuracy"
    """Metric compared at the end of training."""

    @model_validator(mode="after")
    def _arms(self) -> CompareConfig:
        if not self.arms:
            raise ValueError("arms is empty; give at least one arm, e.g. {grpo: {algorithm.replay: none}}")
        if self.baseline not in self.arms:
            raise ValueError(f"baseline={self.baseline!r} is not an arm; arms are {sorted(self.arms)}")
        if not self.seeds:
            raise ValueError("seeds is empty; give at least one seed, e.g. [0, 1, 2]")
        for arm in self.arms:
            try:
                self.arm_config(arm, seed=self.seeds[0])
            except ConfigError as e:
                raise ValueError(f"arm {arm!r}: {e}") from None
        return self

    def arm_config(self, arm: str, seed: int) -> ExperimentConfig:
        """The validated config of one (arm, seed)."""
        data = self.base.model_dump(mode="json")
        data = apply_overrides(data, {**self.arms[arm], "seed": seed, "name": f"{self.base.name}-{arm}"})
        return _validate(ExperimentConfig, data, source=f"arm {arm}")


# --------------------------------------------------------------------------------------------
# Loading, overrides, errors
# --------------------------------------------------------------------------------------------
def parse_set(items: list[str] | None) -> dict[str, Any]:
    """``["a.b=1", "c=x"]`` -> ``{"a.b": 1, "c": "x"}`` (values parsed as YAML scalars)."""
    out: dict[str, Any] = {}
    for item in items or []:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. --set algorithm.experience_ratio=0.25")
        key, value = item.split("=", 1)
        out[key.strip()] = yaml.safe_load(value) if value.strip() else ""
    return out


def apply_overrides(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Return a copy of ``data`` with dotted-key ``overrides`` applied (unknown keys are kept and
    rejected later by validation, which names them)."""
    data = copy.deepcopy(data)
    for dotted, value in overrides.items():
        node = data
        parts = dotted.split(".")
        for p in parts[:-1]:
            child = node.get(p)
            if not isinstance(child, dict):
                child = {}
                node[p] = child
            node = child
        node[parts[-1]] = value
    return data


def _format_validation_error(err: ValidationError, source: str) -> str:
    lines = [f"invalid config ({source}):"]
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "<root>"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown field; check the spelling (see `exgrpo train --help` or exgrpo/config.py)"
        bad = e.get("input")
        shown = "" if isinstance(bad, dict) or e["type"] == "missing" else f" (got {bad!r})"
        lines.append(f"  {loc}: {msg}{shown}")
    return "\n".join(lines)


def _validate(model: type[BaseModel], data: dict[str, Any], source: str):
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_validation_error(err, source)) from None


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping, with an error naming the path when it is missing or malformed."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p} (give a path to a YAML file, e.g. experiments/toy.yaml)")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def load_experiment(path: str | Path | None, overrides: dict[str, Any] | None = None) -> ExperimentConfig:
    """Load and validate an experiment YAML (its ``base`` if it is a comparison file) plus overrides."""
    data: dict[str, Any] = read_yaml(path) if path is not None else {}
    if "base" in data and "arms" in data:
        data = data["base"]
    data = apply_overrides(data, overrides or {})
    return _validate(ExperimentConfig, data, source=str(path or "defaults"))


def load_compare(path: str | Path, overrides: dict[str, Any] | None = None) -> CompareConfig:
    """Load and validate a comparison YAML; ``overrides`` apply to ``base`` (dotted keys)."""
    data = read_yaml(path)
    if "arms" not in data:
        raise ConfigError(f"{path}: a comparison file needs `base:` and `arms:` sections")
    data = dict(data)
    data["base"] = apply_overrides(data.get("base", {}), overrides or {})
    return _validate(CompareConfig, data, source=str(path))


def flatten(cfg: BaseModel, prefix: str = "") -> dict[str, Any]:
    """Dotted key -> scalar value of a config (for MLflow params and search spaces)."""
    out: dict[str, Any] = {}
    for key, value in cfg.model_dump(mode="json").items():
        _flatten_into(out, f"{prefix}{key}", value)
    return out


def _flatten_into(out: dict[str, Any], key: str, value: Any) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten_into(out, f"{key}.{k}", v)
    else:
        out[key] = value
