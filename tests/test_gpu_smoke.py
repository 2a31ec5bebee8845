"""The GPU smoke run's config composed for cuda on this CPU, field by field, and how `exgrpo gpu-smoke`
reads the path lines a job prints.

CI has no GPU: what it can check is that the config a GPU node runs asks veRL for every path only CUDA
takes, and that the smoke judges each path's line as it should. The hooks that print those lines run
in the CPU end-to-end run of veRL's vLLM rollout (tests/test_vllm_rollout.py), in their CPU form."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from exgrpo.backends.verl.path_lines import EXPECTED, PATHS, line, parse, verdicts
from exgrpo.config import load_experiment

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "experiments" / "gpu-smoke.yaml"


@pytest.fixture(scope="module")
def composed():
    """The smoke's typed config, veRL's config composed from it as a run composes it, and the job's
    environment variables (nothing runs)."""
    from exgrpo.backends.verl.overrides import RunPaths, compose, hydra_overrides

    cfg = load_experiment(SMOKE)
    paths = RunPaths("/m", "/t.parquet", "/v.parquet", Path("/ckpt"), Path("/reward.py"))
    return cfg, compose(hydra_overrides(cfg, paths))


def test_the_smoke_runs_on_one_gpu_with_vllm_in_the_gpu_environment(composed):
    cfg, c = composed
    v = cfg.backend.verl
    assert (v.device, v.rollout, v.python, v.workers_per_node, v.nnodes) == ("cuda", "vllm", ".venv-gpu/bin/python", 1, 1)
    assert (c.trainer.device, c.trainer.n_gpus_per_node, c.trainer.nnodes) == ("cuda", 1, 1)
    assert c.actor_rollout_ref.rollout.name == "vllm" and c.actor_rollout_ref.rollout.mode == "async"


def test_vllm_sleeps_between_generation_and_training(composed):
    """veRL frees vLLM's weights and KV cache for the actor only with free_cache_engine and sleep mode on:
    the CPU overrides turn both off, a cuda run must not."""
    from verl.workers.config.rollout import RolloutConfig

    _, c = composed
    r = c.actor_rollout_ref.rollout
    assert r.free_cache_engine is True
    assert OmegaConf.select(r, "enable_sleep_mode") is None and RolloutConfig.enable_sleep_mode is True
    assert r.enforce_eager is False  # CUDA graphs, which only the CPU overrides turn off
    assert r.gpu_memory_utilization == 0.3 and r.dtype == "bfloat16"


def test_weights_reach_vllm_through_the_colocated_cuda_ipc_sync(composed):
    """The naive checkpoint engine is the colocated sync: on cuda its buckets go by CUDA IPC handles (veRL
    falls back to shared memory only where the device has no IPC, as on CPU)."""
    _, c = composed
    assert c.actor_rollout_ref.rollout.checkpoint_engine.backend == "naive"
    assert c.actor_rollout_ref.hybrid_engine is True


def test_the_actor_trains_under_fsdp_in_bf16_with_padded_sdpa(composed):
    _, c = composed
    a, m = c.actor_rollout_ref.actor, c.actor_rollout_ref.model
    assert a.strategy == "fsdp" and a.fsdp_config.dtype == "bfloat16"
    assert OmegaConf.to_container(a.fsdp_config.mixed_precision) == {
        "param_dtype": "bf16", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
    assert a.use_torch_compile is True and m.enable_gradient_checkpointing is True
    # the GPU environment has no flash-attn: padded micro-batches under sdpa, not packed sequences
    assert m.override_config.attn_implementation == "sdpa" and m.use_remove_padding is False


def test_a_private_ray_counts_the_real_gpus_and_binds_loopback(composed, tmp_path):
    """No cluster named: a private local Ray of the job's own (token auth), with no logical GPUs (Ray
    counts the node's), its servers on 127.0.0.1; the job's environment carries nothing of the CPU
    platform (NCCL, not gloo; vLLM's CUDA build, no CPU KV-cache settings)."""
    from exgrpo.backends.verl.live import LOOPBACK_ENV
    from exgrpo.backends.verl.runner import job_env

    cfg, c = composed
    init = OmegaConf.to_container(c.ray_kwargs.ray_init)
    assert init["address"] == "local" and init["include_dashboard"] is False and "num_gpus" not in init
    env = job_env(cfg, tmp_path / "attempt_000.jsonl")
    assert env[LOOPBACK_ENV] == "1" and "VERL_PLATFORM" not in env
    assert not any(k.startswith("VLLM_CPU") for k in env)


def test_the_smoke_checkpoints_every_step_and_resumes_from_its_own(composed):
    cfg, c = composed
    assert (cfg.train.max_steps, cfg.train.checkpoint_every) == (3, 1)
    assert (c.trainer.total_training_steps, c.trainer.save_freq, c.trainer.resume_mode) == (3, 1, "auto")
    assert cfg.algorithm.replay.value == "buckets"  # the pool goes into every checkpoint


def test_a_missing_gpu_environment_names_the_command_that_builds_it(tmp_path):
    from exgrpo.backends.verl.runner import job_python
    from exgrpo.config import ConfigError

    with pytest.raises(ConfigError) as err:
        job_python(load_experiment(SMOKE).backend.verl)
    assert str(err.value).endswith("(build it with `make gpu-env`)") or (ROOT / ".venv-gpu").exists()


def test_flash_attention_is_refused_off_cuda_before_any_work():
    from exgrpo.config import ConfigError

    with pytest.raises(ConfigError) as err:
        load_experiment("experiments/verl-tiny-grpo.yaml", {"backend.verl.attention": "flash_attention_2"})
    detail = str(err.value).splitlines()[-1].strip()
    assert detail.startswith("backend.verl.attention=flash_attention_2 needs device=cuda") and "attention=sdpa" in detail


# ------------------------------------------------------------------------------------ the path lines
CUDA_LOG = "\n".join([
    "(vLLMHttpServer pid=812) " + line("sleep-mode", "vLLM released its GPU memory for training (level 2): the GPU's free "
                                                     "memory went from 12.0 to 73.2 GiB"),
    "(WorkerDict pid=700) " + line("weight-sync", "CUDA IPC buckets: 291 tensors, 942.1 MB from the FSDP actor to vLLM"),
    "(WorkerDict pid=700) " + line("actor", "FSDP; the first linear layer computed with inputs torch.bfloat16, "
                                            "weights torch.bfloat16"),
    "(WorkerDict pid=700) " + line("collectives", "cpu:gloo,cuda:nccl (data-parallel all_reduce of the batch's token count over 1 rank(s))"),
    "step:1 - actor/pg_loss:0.01",
])


def test_a_cuda_log_with_every_path_passes_and_each_verdict_quotes_its_line():
    got = verdicts(CUDA_LOG, "cuda")
    assert [(ok, name) for ok, name, _ in got] == [(True, p) for p in PATHS]
    assert got[1][2].startswith("CUDA IPC buckets: 291 tensors")


def test_a_cpu_path_on_cuda_fails_naming_what_was_expected():
    log = CUDA_LOG.replace("CUDA IPC buckets", "shared-memory buckets").replace("nccl (", "gloo (")
    bad = {name: text for ok, name, text in verdicts(log, "cuda") if not ok}
    assert set(bad) == {"weight-sync", "collectives"}
    assert bad["weight-sync"].startswith("expected 'CUDA IPC buckets' on cuda, got: shared-memory buckets")


def test_a_path_never_taken_fails():
    log = "\n".join(x for x in CUDA_LOG.splitlines() if "sleep-mode" not in x)
    (miss,) = [(name, text) for ok, name, text in verdicts(log, "cuda") if not ok]
    assert miss[0] == "sleep-mode" and miss[1].startswith("no line")


def test_lines_are_read_through_ray_prefixes_and_unknown_names_ignored():
    found = parse(CUDA_LOG + "\n" + line("something-else", "x") + "\nexgrpo path actor no colon")
    assert set(found) == set(PATHS) and len(found["actor"]) == 1
    assert set(EXPECTED) == {"cuda", "cpu"} and all(set(e) == set(PATHS) for e in EXPECTED.values())


# ------------------------------------------------------------------------------------ one GPU
def one_gpu_command() -> tuple[str, dict[str, str]]:
    """The single-GPU recipe's command in docs/gpu.md: its config file and its --set flags."""
    import shlex

    text = (ROOT / "docs" / "gpu.md").read_text().split("## One GPU", 1)[1].split("\n## ", 1)[0]
    block = text.split("```bash", 1)[1].split("```", 1)[0].replace("\\\n", " ")
    words = shlex.split(block)
    assert words[:2] == ["exgrpo", "train"], block
    sets = dict(w.split("=", 1) for flag, w in zip(words[3::2], words[4::2], strict=True) if flag == "--set")
    return words[2], sets


def test_the_single_gpu_recipe_composes_for_one_card_with_the_papers_training_settings():
    """The command docs/gpu.md gives for one 80 GB GPU: one worker, one sequence per micro-batch (which
    divides the worker's 512 sequences of a mini-batch), vLLM at half the card, no offload, a private
    Ray; every training setting as in the 8-GPU recipe."""
    from exgrpo.backends.verl.overrides import RunPaths, compose, hydra_overrides

    config, sets = one_gpu_command()
    overrides = {k: (None if v == "null" else v) for k, v in sets.items()}
    one, eight = load_experiment(ROOT / config, overrides), load_experiment(ROOT / config)
    paths = RunPaths("/m", "/t.parquet", "/v.parquet", Path("/ckpt"), Path("/reward.py"))
    c1, c8 = (compose(hydra_overrides(cfg, paths)) for cfg in (one, eight))
    assert (c1.trainer.n_gpus_per_node, c1.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu) == (1, 1)
    assert c1.actor_rollout_ref.rollout.gpu_memory_utilization == 0.5
    fsdp = c1.actor_rollout_ref.actor.fsdp_config
    assert (fsdp.param_offload, fsdp.optimizer_offload) == (False, False)
    assert OmegaConf.to_container(c1.ray_kwargs.ray_init)["address"] == "local"
    assert one.backend.verl.attention == "flash_attention_2" and c1.actor_rollout_ref.model.use_remove_padding
    rows = one.train.batch_size // one.train.mini_batches * one.algorithm.group_size
    assert rows == 512 and rows % one.backend.verl.micro_batch_size_per_worker == 0
    for key in ("data.train_batch_size", "actor_rollout_ref.actor.ppo_mini_batch_size", "actor_rollout_ref.rollout.n",
                "actor_rollout_ref.actor.optim.lr", "data.max_response_length", "trainer.total_training_steps",
                "actor_rollout_ref.actor.loss_agg_mode", "actor_rollout_ref.actor.loss_scale_factor"):
        assert OmegaConf.select(c1, key) == OmegaConf.select(c8, key), key


# ------------------------------------------------------------------------------------ the smoke's verdicts
def _run_dir(tmp_path, attempts: list[list[int]], pool: bool = True) -> Path:
    """A veRL run directory as the smoke leaves it: the job's log, one metrics file per attempt (the
    steps each logged), and step 2's checkpoint."""
    import json

    import torch

    run = tmp_path / "seed0"
    (run / "verl_metrics").mkdir(parents=True)
    (run / "verl.log").write_text(CUDA_LOG)
    for i, steps in enumerate(attempts):
        rows = [json.dumps({"step": s, "data": {"training/global_step": s}}) for s in steps]
        (run / "verl_metrics" / f"attempt_{i:03d}.jsonl").write_text("\n".join(rows) + "\n")
    step2 = run / "checkpoints" / "global_step_2"
    (step2 / "actor").mkdir(parents=True)
    (step2 / "actor" / "model.pt").write_bytes(b"x")
    (step2 / "data.pt").write_bytes(b"x")
    if pool:
        torch.save({"questions": torch.zeros(3)}, step2 / "exgrpo_pool.pt")
    return run


def test_the_smoke_passes_a_run_resumed_from_its_step_2_checkpoint(tmp_path):
    from exgrpo.gpu_smoke import run_checks

    checks = run_checks(_run_dir(tmp_path, [[1, 2], [3]]), "cuda")
    assert [(c.ok, c.path) for c in checks] == [(True, p) for p in (*PATHS, "checkpoint", "resume")]
    assert str(checks[-1]) == "ok     resume: the second run started at step 3, from global_step_2"


def test_the_smoke_fails_a_run_that_started_over_or_lost_its_pool(tmp_path):
    from exgrpo.gpu_smoke import run_checks

    checks = {c.path: c for c in run_checks(_run_dir(tmp_path, [[1, 2], [1, 2, 3]], pool=False), "cuda")}
    assert not checks["resume"].ok and "expected [1, 3]" in checks["resume"].text
    assert not checks["checkpoint"].ok and checks["checkpoint"].text.endswith("no exgrpo_pool.pt")
    assert str(checks["resume"]).startswith("FAILED resume:")


@pytest.mark.slow  # runs the smoke in the job environment
def test_the_smoke_started_outside_the_project_runs_the_projects_config_in_its_job_environment(tmp_path):
    """`exgrpo gpu-smoke` from another directory finds the project's job environment and config (it asked
    for `make gpu-env` there, the environment being in the project). Stopped once its first command is
    written to smoke.log: what runs after is the CPU veRL job, tested end to end elsewhere."""
    import os
    import signal
    import subprocess
    import sys
    import time

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "smoke"
    proc = subprocess.Popen([sys.executable, "-m", "exgrpo.cli", "gpu-smoke", "--device", "cpu", "--output-dir", str(out)],
                            cwd=elsewhere, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        first = proc.stdout.readline()
        deadline = time.monotonic() + 600  # bounds a hang only
        command = None
        while command is None and proc.poll() is None and time.monotonic() < deadline:
            log = out / "smoke.log"
            command = next((x for x in (log.read_text().splitlines() if log.is_file() else []) if x.startswith("$ ")), None)
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    job = ROOT / ".venv-job" / "bin" / "python"
    assert first.startswith(f"gpu-smoke on cpu: the job in {job};"), first
    assert command is not None, (out / "smoke.log").read_text() if (out / "smoke.log").is_file() else first
    args = command.split()
    assert str(ROOT / "experiments" / "gpu-smoke.yaml") in args and f"--set=backend.verl.python={job}" in args, command
