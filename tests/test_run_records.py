"""What a training run's MLflow record holds, whichever backend trained it: the settings that decide
its numbers as params, shared quantities under one name, the run directory's records as artifacts,
and the logged model linked to every metric of the last step (against a real sqlite store)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from exgrpo.backends.native.trainer import PHASES
from exgrpo.backends.verl.live import SHARED_NAMES, verl_row
from exgrpo.config import load_compare, load_experiment, mlflow_param_keys
from exgrpo.config.backend import VerlSettings
from exgrpo.tracking import Tracker, curated_params
from exgrpo.tracking.finished_run import log_final_model, log_finished_run

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def test_a_verl_run_has_every_verl_setting_that_decides_its_numbers_as_a_param():
    cc = load_compare("experiments/verl-tiny-vllm.yaml")
    params = curated_params(cc.arm_config("grpo", 0))
    assert params["backend.name"] == "verl" and params["backend.verl.rollout"] == "vllm"
    assert params["backend.verl.micro_batch_size_per_worker"] == "32"
    # derived from the config: every veRL setting but those a resumed run may change (where and how it runs)
    deciding = {f"backend.verl.{n}" for n, f in VerlSettings.model_fields.items()
                if not (f.json_schema_extra or {}).get("resume_safe")}
    assert deciding <= set(mlflow_param_keys(cc.arm_config("grpo", 0)))
    assert {"backend.verl.rollout", "backend.verl.reproducible", "backend.verl.actor_dtype"} <= deciding
    assert "backend.verl.ray_address" not in params and "backend.verl.python" not in params
    # an hf run and a vLLM run differ in their params, not only in config/resolved_config.json
    hf = curated_params(load_compare("experiments/verl-tiny-vllm.yaml", {"backend.verl.rollout": "hf"})
                        .arm_config("grpo", 0))
    assert {k for k in params if params[k] != hf.get(k)} == {"backend.verl.rollout"}
    # a native run's params hold no veRL setting: they decide nothing about it
    native = curated_params(load_experiment("experiments/tiny-lm.yaml"))
    assert native["backend.name"] == "native" and not [k for k in native if k.startswith("backend.verl.")]


MUST_BE_PARAMS = frozenset({
    "seed", "backend.name", "train.lr", "train.batch_size", "train.mini_batches", "train.skip_grad_above",
    "train.max_steps", "train.max_sampled_tokens", "algorithm.replay", "algorithm.group_size",
    "algorithm.experience_ratio", "algorithm.bucket_lbound", "algorithm.bucket_rbound", "algorithm.shaping",
    "algorithm.shaping_gamma", "algorithm.is_clip", "algorithm.replay_start_pass_rate",
    "task.n_train", "task.n_val", "task.held_out", "task.problems.min_operands", "policy.decoder", "train.threads",
    "backend.verl.rollout", "backend.verl.reproducible", "backend.verl.micro_batch_size_per_worker",
})
"""Settings that decide a run's numbers (or its budget): two runs that differ in one must differ in
their MLflow params. Named one by one, not derived from the config's markers, so a wrong rule in
``mlflow_param_keys`` shows here."""

MUST_NOT_BE_PARAMS = frozenset({
    "output_dir", "train.checkpoint_every", "train.keep_last", "train.keep_freed_memory", "train.log_every_steps",
    "backend.verl.ray_address", "backend.verl.python", "backend.verl.num_cpus", "backend.verl.launch",
    "backend.verl.job_address", "backend.verl.stall_timeout_s",
})
"""Where and how a run is kept and launched: they change no number, so they are not params."""

PARAM_FILES = {
    "experiments/tiny-lm.yaml": "exgrpo", "experiments/tiny-lm-chain.yaml": "exgrpo",
    "experiments/tiny-lm-budget.yaml": "exgrpo", "experiments/toy-exgrpo.yaml": None,
    "experiments/smollm2-arith.yaml": None, "experiments/verl-tiny-chain.yaml": "exgrpo",
    "experiments/verl-tiny-vllm.yaml": "exgrpo",
}
"""Experiment files (and the arm read of a comparison file) the param lists are checked on."""


def test_the_settings_that_decide_a_runs_numbers_are_its_params_and_no_others():
    from exgrpo.config import flatten

    checked: set[str] = set()
    for path, arm in PARAM_FILES.items():
        cfg = load_compare(path).arm_config(arm, 0) if arm else load_experiment(path)
        params = curated_params(cfg)
        # a field applies if this config has it: its task, policy and algorithm, and its own backend's settings
        applies = {k for k in flatten(cfg) if not k.startswith("backend.verl.") or cfg.backend.name == "verl"}
        missing = sorted((MUST_BE_PARAMS & applies) - set(params))
        extra = sorted((MUST_NOT_BE_PARAMS & applies) & set(params))
        assert not missing and not extra, f"{path}: not params {missing}; params that must not be {extra}"
        checked |= applies
    assert MUST_BE_PARAMS | MUST_NOT_BE_PARAMS <= checked, sorted((MUST_BE_PARAMS | MUST_NOT_BE_PARAMS) - checked)


def test_a_chain_regimes_questions_and_warm_start_are_params():
    for path in ("experiments/tiny-lm-chain.yaml", "experiments/verl-tiny-chain.yaml"):
        params = curated_params(load_compare(path).arm_config("exgrpo", 0))
        assert params["task.problems.min_operands"] == "3" and params["task.n_train"] == "20000"
        assert params["policy.model.sft_direct_fraction"] == "0.6" and params["policy.model.sft_steps"] == "600"


def test_step_timings_have_the_native_trainers_names_on_the_verl_backend():
    step, row = verl_row({"step": 3, "data": {"timing_s/step": 1.5, "timing_s/gen": 0.5, "timing_s/reward": 0.25,
                                              "timing_s/update_actor": 0.5, "val-core/arith/acc/mean@1": 0.25}})
    assert step == 3
    assert row == {"step": 3.0, "time/step_seconds": 1.5, "time/rollout_seconds": 0.5, "time/reward_seconds": 0.25,
                   "timing_s/update_actor": 0.5, "val-core/arith/acc/mean_at_1": 0.25, "val/accuracy": 0.25}
    native_names = {"time/step_seconds", *(f"time/{phase}_seconds" for phase in PHASES)}
    assert set(SHARED_NAMES.values()) <= native_names


@pytest.fixture
def store(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    tracker = Tracker(uri)
    return tracker, tracker.start_run("records", "grpo-seed0", {"algo": "grpo"})


def test_a_finished_run_logs_its_run_directorys_records_as_artifacts(store, tmp_path):
    tracker, run_id = store
    run_dir = tmp_path / "seed0"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 1, "batch/solved": 0.5}) + "\n")
    (run_dir / "verl_run.json").write_text(json.dumps({"overrides": ["trainer.nnodes=1"]}))
    (run_dir / "verl.log").write_text("step:1 - timing_s/step:1.5\n")
    (run_dir / "verl_run.json.tmp").write_text("")  # not a record
    log_finished_run(tracker, run_id, load_experiment("experiments/verl-tiny-grpo.yaml"),
                     SimpleNamespace(run_dir=run_dir, checkpoint=None), step=1,
                     load_policy=lambda file: pytest.fail("no checkpoint: nothing to load"),
                     evaluate=lambda loaded: pytest.fail("no checkpoint: nothing to evaluate"))
    client = tracker.client
    logged = {a.path for folder in ("config", "logs", "metrics") for a in client.list_artifacts(run_id, folder)}
    assert logged == {"config/verl_run.json", "logs/verl.log", "metrics/metrics.jsonl"}


def test_the_logged_model_carries_every_metric_of_the_last_step_whoever_logged_it(store):
    """A veRL job logs its steps to the run from its own process: the model still carries them all."""
    import mlflow
    import torch

    tracker, run_id = store
    job = mlflow.MlflowClient(tracker.uri)  # the training job's own client
    for step in (1, 2):
        for key in ("batch/solved", "actor/pg_loss", "time/step_seconds"):
            job.log_metric(run_id, key, 0.25 * step, step=step)
    job.log_metric(run_id, "val/accuracy", 0.5, step=1)  # not evaluated at the last step
    tracker.log_metrics(run_id, {"final/batch/solved": 0.5, "eval/val/avg_at_1": 0.75}, step=2)
    log_final_model(tracker.uri, run_id, torch.nn.Linear(2, 2), step=2)

    (output,) = job.get_run(run_id).outputs.model_outputs
    model = job.get_logged_model(output.model_id)
    assert output.step == 2 and {m.step for m in model.metrics} == {2}
    assert {m.key: m.value for m in model.metrics} == {
        "batch/solved": 0.5, "actor/pg_loss": 0.5, "time/step_seconds": 0.5, "final/batch/solved": 0.5,
        "eval/val/avg_at_1": 0.75}
    assert [m.step for m in job.get_metric_history(run_id, "batch/solved")] == [1, 2]  # no row added
