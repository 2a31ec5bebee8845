"""The local files a run reads and the CPU it computes on, checked before it does any work: the native
trainer's model directory (``policy.path``), a file task's question files, every row, and bf16 matmul
for ``policy.precision: bf16``. Reads files only (no weights), so ``exgrpo train`` refuses bad input at
once and ``exgrpo doctor`` reports it."""

from __future__ import annotations

from exgrpo.config import ExperimentConfig, FileTaskConfig, HFPolicyConfig
from exgrpo.policies.lm.hf_model import check_any_family_dir, check_model_dir
from exgrpo.policies.lm.precision import check_precision
from exgrpo.tasks.rlhf_file import check_task_files


def check_inputs(cfg: ExperimentConfig) -> None:
    """ConfigError, one line naming the field, for the first local input of ``cfg`` that cannot be used
    (or a bf16 precision this CPU cannot compute in).
    veRL trains ``policy.path`` whatever its family, so only the native trainer's model is held to the
    engine's families here."""
    if isinstance(cfg.policy, HFPolicyConfig):
        (check_model_dir if cfg.backend.name == "native" else check_any_family_dir)(cfg.policy.path)
    if isinstance(cfg.task, FileTaskConfig):
        check_task_files(cfg.task)
    if cfg.backend.name == "native":
        check_precision(getattr(cfg.policy, "precision", "fp32"))
