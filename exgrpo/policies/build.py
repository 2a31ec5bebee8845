"""A run's task and its policy, built from the config: what both backends train and evaluation loads
a checkpoint's weights into (a veRL run's HF actor is the LM policy's model)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from exgrpo.config import (
    ExperimentConfig,
    FileTaskConfig,
    HFPolicyConfig,
    LMPolicyConfig,
    MLPPolicyConfig,
    ReasoningGymTaskConfig,
)
from exgrpo.policies.interfaces import Policy, Task
from exgrpo.policies.lm.hf_model import hf_policy
from exgrpo.policies.lm.policy import LMPolicy
from exgrpo.policies.lm.tiny_lm import load_tiny_lm, warm_start
from exgrpo.policies.mlp_policy import MLPPolicy
from exgrpo.tasks.openr1 import OpenR1Task
from exgrpo.tasks.reasoning_gym_tasks import ReasoningGymTask
from exgrpo.tasks.text_arithmetic import TextArithmetic
from exgrpo.tasks.toy_arithmetic import ToyArithmetic

CHAT_TASKS: dict[type, Callable[[Any, Any], Task]] = {
    ReasoningGymTaskConfig: ReasoningGymTask.with_chat_tokenizer,
    FileTaskConfig: lambda cfg, tokenizer: OpenR1Task(cfg, tokenizer=tokenizer),
}
"""Task config -> its task over an HF tokenizer, prompts in the model's own chat template."""


def build_task_and_policy(cfg: ExperimentConfig, progress: bool = False) -> tuple[Task, Policy]:
    """Instantiate the tier's task and policy (model init seeded by ``cfg.seed``).

    toy: the MLP over the arithmetic features. tiny-lm: the SFT-warm-started tiny LM (trained once
    and cached by a hash of ``policy.model``; every seed starts from the same warm start).
    hf (smollm2 among them): the local Hugging Face model ``policy.path`` names, with its tokenizer and
    chat template, on reasoning-gym questions or a question file.
    """
    if isinstance(cfg.policy, MLPPolicyConfig):
        task = ToyArithmetic(cfg.task)
        torch.manual_seed(cfg.seed)
        policy = MLPPolicy(cfg.policy, in_features=task.features.shape[1], num_actions=task.num_actions)
        return task, policy

    if isinstance(cfg.policy, HFPolicyConfig):
        policy, tokenizer = hf_policy(cfg.policy, progress=progress)
        return CHAT_TASKS[type(cfg.task)](cfg.task, tokenizer), policy

    tiny = load_tiny_lm(cfg.policy.model, progress=progress)
    policy = LMPolicy.from_tiny_lm(tiny, cfg.policy)
    if isinstance(cfg.task, ReasoningGymTaskConfig):
        return ReasoningGymTask.with_char_tokenizer(cfg.task, tiny.tokenizer), policy
    return TextArithmetic(cfg.task, tokenizer=tiny.tokenizer), policy


def _print_now(line: str) -> None:
    print(line, flush=True)


def prepare_warm_starts(configs: Iterable[ExperimentConfig], say: Callable[[str], None] = _print_now,
                        progress: bool = True) -> None:
    """Before a command's runs start on this machine: the tiny LM warm start each distinct model of
    ``configs`` needs, from the cache or trained now (once, not by every run at the same time), and
    one line per model saying which (:func:`exgrpo.policies.lm.tiny_lm.warm_start`); one that must be
    trained is announced before its training starts, with roughly how long it takes."""
    models = {cfg.policy.model.model_dump_json(): cfg.policy.model for cfg in configs
              if isinstance(cfg.policy, LMPolicyConfig)}
    if not models:
        return
    for model in models.values():
        say(warm_start(model, progress=progress, say=say))
