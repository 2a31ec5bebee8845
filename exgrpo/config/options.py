"""Option enums (each value a registry key in exgrpo.core), the config error type and the strict base model."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from exgrpo.errors import UserError


class ConfigError(UserError, ValueError):
    """A configuration problem, phrased for the user: which field, which value, what is allowed."""


class ReplayKind(StrEnum):
    """Which experience-replay algorithm runs beside on-policy GRPO."""

    NONE = "none"  # on-policy GRPO
    BUCKETS = "buckets"  # the paper's ExGRPO: correctness buckets, Gaussian bucket weights
    NOTEBOOK = "notebook"  # the notebook variant: recency/entropy priority + lambda schedule
    UNIFORM = "uniform"  # ablation: ExGRPO's pool and switch, questions drawn uniformly (no buckets)


class HeldOut(StrEnum):
    """Which held-out questions a run's ``val/*`` metrics read."""

    TUNING = "tuning"  # choose regimes, learning rates and sweep trials on these
    TEST = "test"  # report on these: never seen by any choice made on the tuning split


class Gold(StrEnum):
    """What an arithmetic question's graded answer is (text arithmetic, reasoning-gym)."""

    RESULT = "result"  # the arithmetic's value: learnable by computing it, on any question
    SECRET = "secret"  # the value plus a fixed offset per question: learnable only by memorising a rewarded answer


class NotebookSampling(StrEnum):
    """How the notebook variant draws its ``per`` replayed trajectories from the buffer."""

    PROPORTIONAL = "proportional"  # in proportion to priority, without replacement (the notebook)
    TOP = "top"  # the ``per`` highest priorities, deterministic


class BucketWeighting(StrEnum):
    """Weight of a bucket keyed by the latest success count k."""

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


class PoolRetention(StrEnum):
    """Which trajectories of a question stay when ``pool_max_per_question`` caps it."""

    NEWEST = "newest"  # the most recently collected (the oldest dropped first)
    LOWEST_ENTROPY = "lowest_entropy"  # the lowest mean behaviour entropy at collection (what selection favours)


class Decoder(StrEnum):
    """How the native LM engine runs its decode loop (both give the same distribution; rounding differs)."""

    STATIC_KV = "static-kv"  # own loop: preallocated KV cache, finished rows drop out, inverse-CDF sampling
    FUSED = "fused"  # static-kv with a decode step of fewer kernels (weights rewritten once per rollout)
    HF = "hf"  # the model's own forward with transformers' growing cache (any causal LM; the slowest, kept as a reference)


class Precision(StrEnum):
    """Compute precision of an LM policy's training forward and backward (the weights and AdamW's state stay fp32)."""

    FP32 = "fp32"  # everything in float32
    BF16 = "bf16"  # bfloat16 autocast over fp32 master weights (CPUs with avx512_bf16 or amx_bf16)


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


class AnswerFormat(StrEnum):
    """Where a response must put its final answer to be graded (exgrpo.rewards.extraction)."""

    BOXED = "boxed"  # strict (default): one distinct boxed answer, ASCII digits, bounded length
    BOXED_OR_LAST_NUMBER = "boxed_or_last_number"  # lenient: else the last number (gameable; warns)


#: Longest graded answer (box content) by default; a longer one scores 0, it is never truncated.
DEFAULT_MAX_ANSWER_CHARS = 512


class Tier(StrEnum):
    """Model/task size; all tiers share the config schema, the core and the trainer step."""

    TOY = "toy"
    TINY_LM = "tiny-lm"
    SMOLLM2 = "smollm2"
    HF = "hf"  # your own local HF model (Llama, Qwen2) and your own data file, on the native trainer
    PAPER = "paper"


class MiniBatchSplit(StrEnum):
    """How a step's rows are split into its ``train.mini_batches`` optimiser steps."""

    ROWS = "rows"  # a random partition of the rows: a group's rollouts spread over the mini-batches
    GROUPS = "groups"  # whole groups in a random order (veRL's actor: contiguous slices of its group-major batch)


class OptimizerKind(StrEnum):
    """Optimiser of the policy parameters."""

    ADAM = "adam"
    ADAMW = "adamw"


RESUME_SAFE: dict[str, bool] = {"resume_safe": True}
"""Field marker (``Field(..., json_schema_extra=RESUME_SAFE)``): a resumed run may change the field
(exgrpo.runs): the cadence of checkpoints and logging, where things are written and run. Such a
field decides none of a run's numbers, so it is not an MLflow param; every field without the marker
is one (``mlflow_param_keys``), and a backend's settings are params of the runs that backend trains
only (``BackendConfig.idle_sections``). The full config is always an artifact."""

RESUME_SAFE_PARAM: dict[str, bool] = {**RESUME_SAFE, "mlflow_param": True}
"""Field marker (``json_schema_extra=RESUME_SAFE_PARAM``): a resumed run may change the field, yet it
is an MLflow param, since two runs that differ in it differ in their numbers: the budget and the
evaluation cadence, and settings that change how fast the same computation runs but round floats
differently (thread count, decoder, fused optimiser)."""


class _Strict(BaseModel):
    # allow_inf_nan=False: a float field given inf or nan (lr=inf) is an error, not a silent NaN run
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=True,
                              allow_inf_nan=False)
