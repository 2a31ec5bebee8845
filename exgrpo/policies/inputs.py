"""The local files a run reads, checked before it does any work: the native trainer's model directory
(``policy.path``) and a file task's question files, every row. Reads files only (no torch, no
weights), so ``exgrpo train`` refuses bad input at once and ``exgrpo doctor`` reports it."""

from __future__ import annotations

from exgrpo.config import ExperimentConfig, FileTaskConfig, HFPolicyConfig
from exgrpo.policies.lm.hf_model import check_any_family_dir, check_model_dir
from exgrpo.tasks.rlhf_file import check_task_files


def check_inputs(cfg: ExperimentConfig) -> None:
    """ConfigError, one line naming the field, for the first local input of ``cfg`` that cannot be used.
    veRL trains ``policy.path`` whatever its family, so only the native trainer's model is held to the
    engine's families here."""
    if isinstance(cfg.policy, HFPolicyConfig):
        (check_model_dir if cfg.backend.name == "native" else check_any_family_dir)(cfg.policy.path)
    if isinstance(cfg.task, FileTaskConfig):
        check_task_files(cfg.task)
