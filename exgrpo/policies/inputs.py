"""The local files a run reads and the CPU it computes on, checked before it does any work: the native
trainer's model directory (``policy.path``), the model a veRL run's vLLM serves on the CPU, a file
task's question files, every row, and the CPU's bf16 support for ``policy.precision: bf16`` and
``policy.dtype: bfloat16``. Reads files only (no weights), so ``exgrpo train`` refuses bad input at
once and ``exgrpo doctor`` reports it."""

from __future__ import annotations

from exgrpo.config import ConfigError, ExperimentConfig, FileTaskConfig, HFPolicyConfig
from exgrpo.config.backend import verl_model, verl_model_field
from exgrpo.evaluation.vllm_engine import VLLM_CPU_HEAD_SIZES, cpu_cannot_run
from exgrpo.policies.lm.hf_model import check_any_family_dir, check_model_dir
from exgrpo.policies.lm.precision import check_precision, check_weights_dtype
from exgrpo.tasks.rlhf_file import check_task_files


def check_inputs(cfg: ExperimentConfig) -> None:
    """ConfigError, one line naming the field, for the first local input of ``cfg`` that cannot be used
    (or a bf16 precision or bf16 weights this CPU cannot compute in).
    veRL trains ``policy.path`` whatever its family, so only the native trainer's model is held to the
    engine's families here."""
    if isinstance(cfg.policy, HFPolicyConfig):
        (check_model_dir if cfg.backend.name == "native" else check_any_family_dir)(cfg.policy.path)
    if cfg.backend.name == "verl" and cfg.backend.verl.rollout == "vllm" and cfg.backend.verl.device == "cpu":
        check_vllm_cpu_head_size(cfg)
    if isinstance(cfg.task, FileTaskConfig):
        check_task_files(cfg.task)
    if cfg.backend.name == "native":
        check_precision(getattr(cfg.policy, "precision", "fp32"))
        check_weights_dtype(getattr(cfg.policy, "dtype", "float32"))
        if getattr(cfg.policy, "rollout_precision", "fp32") == "bf16":  # decoded from bf16 weights, as dtype bfloat16 is
            check_weights_dtype("bfloat16", field="policy.rollout_precision", spelled=("bf16", "fp32"))


def check_vllm_cpu_head_size(cfg: ExperimentConfig) -> None:
    """ConfigError, one line, when the model directory a veRL run serves with vLLM on the CPU has heads of a
    size vllm-cpu has no attention kernel for (a packaged model, or the run's own tiny LM, is known good):
    it would fail at the run's first rollout, after the job has started. (With the hf rollout such a
    model trains, and its checkpoints are evaluated with transformers: :mod:`exgrpo.evaluation.hf_eval`.)"""
    path = verl_model(cfg)
    head = cpu_cannot_run(path) if path else None
    if head is not None:
        raise ConfigError(f"{verl_model_field(cfg)}={path}: its attention heads have {head} dimensions, which vLLM's "
                          f"CPU attention cannot run ({', '.join(map(str, VLLM_CPU_HEAD_SIZES))}); use "
                          "backend.verl.rollout=hf, or a model with heads of a supported size")
