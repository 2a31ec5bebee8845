"""exgrpo.sweep with real Optuna sqlite storage, real local Ray (2 CPUs) and real MLflow sqlite."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile

import pytest

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

optuna = pytest.importorskip("optuna")
pytest.importorskip("ray")
mlflow = pytest.importorskip("mlflow")

if "RAY_TMPDIR" not in os.environ:  # short: Ray's unix socket paths are length-limited
    os.environ["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    atexit.register(shutil.rmtree, os.environ["RAY_TMPDIR"], True)  # runs after Ray's own atexit shutdown

from optuna.trial import TrialState  # noqa: E402

from exgrpo.config import ConfigError  # noqa: E402
from exgrpo.sweep.runner import worker_storage  # noqa: E402
from exgrpo.sweep.space import base_config, check_bounds  # noqa: E402
from exgrpo.sweep import (  # noqa: E402
    SweepError,
    load_sweep,
    open_study,
    paper_defaults,
    run_sweep,
    run_trial,
    safe_tell,
)

TINY_BASE = {
    "base.task.max_operand": 5, "base.train.batch_size": 16, "base.algorithm.group_size": 4,
    "base.policy.hidden": 32, "base.policy.layers": 2, "budget_steps": 8,
}


def sweep_dict(tmp_path, **space):
    return {
        "study": {"name": "s", "n_trials": 4, "parallel": 2, "pruner": "median", "pruner_startup_trials": 2},
        "base": "experiments/toy.yaml",
        "base_overrides": {"name": "tiny-sweep", "algorithm.replay": "buckets", "output_dir": str(tmp_path / "runs")},
        "budget_steps": 8,
        "space": space or {"algorithm.experience_ratio": {"type": "float", "low": 0.1, "high": 0.9}},
    }


# ------------------------------------------------------------------ validation (no Ray)
def test_unknown_field_named_with_close_matches(tmp_path):
    d = sweep_dict(tmp_path, **{"algorithm.experiance_ratio": {"type": "float", "low": 0.1, "high": 0.9},
                                "is_clip": {"type": "float", "low": 1, "high": 4}})
    with pytest.raises(SweepError) as e:
        load_sweep(d)
    msg = str(e.value)
    assert "algorithm.experiance_ratio: unknown config field; did you mean algorithm.experience_ratio" in msg
    assert "is_clip: unknown config field; did you mean algorithm.is_clip" in msg


def test_empty_space_and_bad_ranges(tmp_path):
    d = sweep_dict(tmp_path)
    d["space"] = {}
    with pytest.raises(SweepError, match="search space is empty"):
        load_sweep(d)
    with pytest.raises(SweepError, match="low=0.9 must be < high=0.1"):
        load_sweep(sweep_dict(tmp_path, **{"algorithm.experience_ratio": {"type": "float", "low": 0.9, "high": 0.1}}))
    with pytest.raises(SweepError, match="log scale needs low > 0"):
        load_sweep(sweep_dict(tmp_path, **{"algorithm.is_clip": {"type": "float", "low": 0, "high": 2, "log": True}}))
    with pytest.raises(SweepError, match="categorical needs a non-empty"):
        load_sweep(sweep_dict(tmp_path, **{"algorithm.shaping": {"type": "categorical", "choices": []}}))
    d = sweep_dict(tmp_path)
    d["study"]["sampler"] = "grid"
    with pytest.raises(SweepError, match="grid over a float range needs `step`"):
        load_sweep(d)
    d["study"]["bogus"] = 1
    with pytest.raises(SweepError, match="study.bogus: unknown key"):
        load_sweep(d)
    with pytest.raises(ConfigError, match="group_size"):
        load_sweep(sweep_dict(tmp_path), {"base.algorithm.group_size": 1})


def test_sweep_bounds_outside_the_fields_range_fail_before_any_work(tmp_path):
    with pytest.raises(SweepError, match=r"space.algorithm.experience_ratio: 1.5 is not a valid value of the field"):
        load_sweep(sweep_dict(tmp_path, **{"algorithm.experience_ratio": {"type": "float", "low": 0.1, "high": 1.5}}))
    with pytest.raises(SweepError, match=r"space.algorithm.group_size: 1 is not a valid value"):
        load_sweep(sweep_dict(tmp_path, **{"algorithm.group_size": {"type": "int", "low": 1, "high": 8}}))
    with pytest.raises(SweepError, match=r"space.algorithm.shaping: 'gaussian' is not a valid value"):
        load_sweep(sweep_dict(tmp_path, **{"algorithm.shaping": {"type": "categorical", "choices": ["identity", "gaussian"]}}))


def test_degenerate_sweeps_are_flagged_in_the_summary():
    from exgrpo.sweep.runner import SweepResult

    same = SweepResult("s", "sqlite://", "p", "1", "sqlite://", outcomes=[
        {"number": i, "state": "COMPLETE", "value": 0.25, "params": {"algorithm.experience_ratio": r}}
        for i, r in enumerate([0.1, 0.5, 0.9])])
    assert "degenerate: all 3 completed trials scored 0.2500" in same.table()
    varied = SweepResult("s", "sqlite://", "p", "1", "sqlite://", outcomes=[
        {"number": 0, "state": "COMPLETE", "value": 0.25, "params": {}},
        {"number": 1, "state": "COMPLETE", "value": 0.30, "params": {}}])
    assert varied.degenerate() is None and "degenerate" not in varied.table()


def test_repo_sweep_file_is_valid():
    sc = load_sweep("experiments/toy-sweep.yaml")
    assert sc.study.sampler == "tpe" and sc.budget_steps == 200
    d = paper_defaults(sc)
    assert d["algorithm.experience_ratio"] == 0.5 and d["algorithm.bucket_rbound"] == 15
    assert d["algorithm.shaping"] == "policy_shaping" and d["algorithm.shaping_gamma"] == 0.1


def test_repo_lm_sweep_file_is_valid_and_uses_the_wilcoxon_pruner():
    sc = load_sweep("experiments/tiny-lm-sweep.yaml")
    assert sc.study.pruner == "wilcoxon" and str(sc.base).endswith("tiny-lm.yaml")


def test_chain_sweep_covers_the_design_cards_knobs_and_trial_zero_is_the_paper():
    sc = load_sweep("experiments/tiny-lm-chain-sweep.yaml")
    check_bounds(sc)
    knobs = {"experience_ratio", "bucket_lbound", "bucket_rbound", "bucket_center", "bucket_sigma", "shaping",
             "shaping_gamma", "is_clip", "replay_start_pass_rate", "pool_max_per_question"}
    assert {n.removeprefix("algorithm.") for n in sc.space} == knobs
    assert base_config(sc).seed >= 100  # tuning seeds are never reported seeds
    d = paper_defaults(sc)
    assert d["algorithm.bucket_center"] == 4.0 and d["algorithm.bucket_rbound"] == 7
    assert set(d) == set(sc.space)  # every knob of trial 0 is the paper's value, none drawn at random


def test_existing_study_with_other_space_is_an_error(tmp_path):
    storage = f"sqlite:///{tmp_path}/optuna.db"
    sc = load_sweep(sweep_dict(tmp_path))
    study, url, created = open_study(sc, storage)
    assert created
    (first,) = study.get_trials(states=(TrialState.WAITING,))
    assert first.system_attrs["fixed_params"] == {"algorithm.experience_ratio": 0.5}, "paper defaults go first"
    _, _, created = open_study(sc, storage)  # same space: resumes
    assert not created
    other = load_sweep(sweep_dict(tmp_path, **{"algorithm.experience_ratio": {"type": "float", "low": 0.2, "high": 0.9}}))
    with pytest.raises(SweepError, match=r"'s' .* different search space \(differs in: algorithm.experience_ratio\)"):
        open_study(other, storage)


def test_grid_sampler_enumerates_the_space(tmp_path):
    d = sweep_dict(tmp_path, **{"algorithm.shaping": {"type": "categorical", "choices": ["identity", "truncate"]},
                                "algorithm.bucket_lbound": {"type": "int", "low": 0, "high": 1}})
    d["study"]["sampler"] = "grid"
    d["study"]["enqueue_defaults"] = False
    sc = load_sweep(d)
    study, _, _ = open_study(sc, f"sqlite:///{tmp_path}/g.db")
    dists = {k: v.distribution() for k, v in sc.space.items()}
    seen = set()
    for _ in range(4):
        t = study.ask(dists)
        seen.add((t.params["algorithm.shaping"], t.params["algorithm.bucket_lbound"]))
        safe_tell(study, t, 0.0)
    assert len(seen) == 4


# ------------------------------------------------------------------ pruning path (in process)
def _run_next_trial(study, dists, sc, storage_url, tracking_uri):
    """Ask the study for a trial and run it as a sweep worker would -> (trial, run_trial's result)."""
    trial = study.ask(dists)
    return trial, run_trial({"sweep": sc.model_dump(mode="json"), "number": trial.number, "trial_id": trial._trial_id,
                             "params": trial.params, "storage": storage_url, "tracking_uri": tracking_uri,
                             "experiment": "tiny-sweep", "parent_run_id": None})


def test_trial_is_pruned_from_the_worker_side(tmp_path):
    """run_trial loads the study by name, reports val/accuracy at eval steps and prunes itself."""
    storage = f"sqlite:///{tmp_path}/optuna.db"
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    d = sweep_dict(tmp_path)
    d["study"].update(pruner_startup_trials=1, enqueue_defaults=False)
    sc = load_sweep(d, TINY_BASE)
    study, url, _ = open_study(sc, storage)
    dists = {k: v.distribution() for k, v in sc.space.items()}
    strong = study.ask(dists)  # a finished trial that was perfect at every eval step
    for step in (4, 8):
        strong.report(1.0, step)
    study.tell(strong, 1.0)
    trial, out = _run_next_trial(study, dists, sc, url, uri)
    assert out["state"] == "PRUNED", out
    assert "pruned at step 4" in out["error"]
    ft = study.get_trials()[trial.number]
    assert list(ft.intermediate_values) == [4]
    run = mlflow.MlflowClient(uri).get_run(out["run_id"])
    assert run.info.status == "KILLED" and run.data.tags["pruned"] == "true"


def test_a_worker_builds_the_studys_storage_once_for_all_its_trials(tmp_path):
    """Ray runs many trials in one worker process: the storage (engine, schema check) is built once,
    and each trial's reports still land in the study the driver reads."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    sc = load_sweep(sweep_dict(tmp_path), TINY_BASE)
    study, url, _ = open_study(sc, f"sqlite:///{tmp_path}/optuna.db")
    dists = {k: v.distribution() for k, v in sc.space.items()}
    worker_storage.cache_clear()
    outs = [_run_next_trial(study, dists, sc, url, uri) for _ in range(2)]
    assert worker_storage.cache_info().misses == 1 and worker_storage.cache_info().hits == 1
    for trial, out in outs:
        assert out["state"] == "COMPLETE", out
        assert study.get_trials()[trial.number].intermediate_values  # written through the worker's storage


def test_wilcoxon_pruner_compares_per_question_results_with_the_best_trial(tmp_path):
    """pruner: wilcoxon: the trial reports each evaluation's held-out result per question and is
    pruned when it is significantly worse, question by question, than the best trial."""
    from exgrpo.policies.build import build_task_and_policy
    from exgrpo.sweep.runner import INSTANCE_STRIDE
    from exgrpo.sweep.space import base_config

    storage = f"sqlite:///{tmp_path}/optuna.db"
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    d = sweep_dict(tmp_path)
    d["study"].update(pruner="wilcoxon", enqueue_defaults=False)
    sc = load_sweep(d, TINY_BASE)
    n_val = len(build_task_and_policy(base_config(sc))[0].val_ids)
    study, url, _ = open_study(sc, storage)
    assert type(study.pruner).__name__ == "WilcoxonPruner"
    dists = {k: v.distribution() for k, v in sc.space.items()}
    strong = study.ask(dists)  # a finished trial that solved every held-out question at every evaluation
    for step in (4, 8):
        for i in range(n_val):
            strong.report(1.0, step * INSTANCE_STRIDE + i)
    study.tell(strong, 1.0)
    trial, out = _run_next_trial(study, dists, sc, url, uri)
    assert out["state"] == "PRUNED", out
    assert "pruned at step 4" in out["error"] and "Wilcoxon" in out["error"]
    reported = study.get_trials()[trial.number].intermediate_values
    assert sorted(reported) == [4 * INSTANCE_STRIDE + i for i in range(n_val)]
    assert set(reported.values()) <= {0.0, 1.0} and 0.0 in reported.values()
    # a veRL sweep cannot use it (the veRL backend reports aggregates only): an error before any work
    d = sweep_dict(tmp_path)
    d["base"] = "experiments/verl-tiny-exgrpo.yaml"
    d["study"].update(pruner="wilcoxon")
    with pytest.raises(SweepError, match="study.pruner: wilcoxon needs per-question"):
        load_sweep(d)


# ------------------------------------------------------------------ the whole loop on Ray
def test_a_verl_sweep_over_the_jobs_size_is_refused_before_any_trial(tmp_path):
    """A sweep's veRL trials get their room on the cluster from the base config's size, so a space over
    that size would plan trials that do not fit (and wait for ever): refused in one line."""
    d = sweep_dict(tmp_path)
    d["base"] = "experiments/verl-tiny-exgrpo.yaml"
    d["study"].update(pruner="median")
    load_sweep(d)  # the replay knobs alone are fine
    d["space"]["backend.verl.workers_per_node"] = {"type": "int", "low": 1, "high": 2}
    with pytest.raises(SweepError, match=r"space.backend.verl.workers_per_node: a sweep plans its veRL trials' room"):
        load_sweep(d)


def _lines_after_finished(out: str) -> list[str]:
    """Progress lines of a trial printed after that trial's "finished" line."""
    import re

    done: set[str] = set()
    late = []
    for line in out.splitlines():
        if m := re.match(r"progress: (trial \d+) \(\w+\) finished", line):
            done.add(m.group(1))
        elif (m := re.match(r"progress: (trial \d+): step ", line)) and m.group(1) in done:
            late.append(line)
    return late


def test_no_progress_line_of_a_trial_follows_its_finished_line(capsys):
    """The driver prints a run's progress at most every few seconds: the last step of a trial that
    ended within that time used to be printed at the next poll, after the trial's "finished" line."""
    import time

    import ray

    from exgrpo.cluster import ensure_ray
    from exgrpo.live_progress import ProgressBoard, ProgressPrinter

    ensure_ray(None)
    board = ray.remote(num_cpus=0)(ProgressBoard).remote()
    printer = ProgressPrinter(board, 2, every=0.5)
    ray.get(board.report.remote("trial 0", {"step": 1, "total": 4}))
    printer.poll()
    ray.get(board.report.remote("trial 0", {"step": 4, "total": 4}))  # its last step, then its result
    printer.finished("trial 0 (COMPLETE)")
    time.sleep(0.6)  # the next poll is past the run's throttle
    printer.poll()
    out = capsys.readouterr().out
    assert "progress: trial 0 (COMPLETE) finished | runs done 1/2" in out
    assert _lines_after_finished(out) == [], out


def test_sweep_on_ray_with_a_crashing_trial_then_resume(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("EXGRPO_PROGRESS_SECONDS", "0")  # every trial's progress printed
    storage = f"sqlite:///{tmp_path}/optuna.db"
    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    d = sweep_dict(tmp_path, **{"algorithm.experience_ratio": {"type": "float", "low": 0.1, "high": 0.9},
                                "algorithm.bucket_lbound": {"type": "categorical", "choices": [0, 2]},
                                "algorithm.bucket_rbound": {"type": "categorical", "choices": [3, 2]}})
    # every bound is valid on its own (checked up front); lbound 2 with rbound 2 is not: that trial crashes.
    # trial 0: the paper defaults (lbound 0, rbound = K-1 = 3); trial 1: lbound = rbound = 2
    d["study"].update(enqueue=[{"algorithm.bucket_lbound": 2, "algorithm.bucket_rbound": 2,
                                "algorithm.experience_ratio": 0.3}],
                      pruner="none", n_startup_trials=10)
    sc = load_sweep(d, TINY_BASE)
    seen = []
    res = run_sweep(sc, storage=storage, tracking_uri=uri, on_trial=seen.append)

    assert len(res.outcomes) == 4 == len(seen)
    by_number = {o["number"]: o for o in res.outcomes}
    assert by_number[0]["params"] == {"algorithm.experience_ratio": 0.5, "algorithm.bucket_lbound": 0,
                                      "algorithm.bucket_rbound": 3}
    assert by_number[0]["state"] == "COMPLETE"
    assert by_number[1]["state"] == "FAIL" and "bucket_lbound=2 must be < bucket_rbound=2" in by_number[1]["error"]
    for o in res.outcomes:
        bad = o["params"]["algorithm.bucket_lbound"] == 2 and o["params"]["algorithm.bucket_rbound"] == 2
        assert o["state"] == ("FAIL" if bad else "COMPLETE"), o
    study = optuna.load_study(study_name="s", storage=storage)
    states = [t.state for t in study.trials]
    assert states.count(TrialState.FAIL) >= 1 and states.count(TrialState.COMPLETE) >= 2
    assert "bucket_lbound=2" in study.trials[1].user_attrs["error"]
    assert res.counts["FAIL"] + res.counts["COMPLETE"] == 4
    assert "| 1 | FAIL |" in res.table()
    out = capsys.readouterr().out
    assert ": step " in out and " finished | runs done 4/4" in out, out
    assert _lines_after_finished(out) == [], out

    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name("tiny-sweep")
    runs = client.search_runs([exp.experiment_id])
    parent = [r for r in runs if r.data.tags.get("kind") == "sweep"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == res.parent_run_id]
    assert len(parent) == 1 and parent[0].info.run_id == res.parent_run_id
    assert len(children) == 4
    assert {r.info.status for r in children if "error" in r.data.tags} == {"FAILED"}
    assert all(r.data.tags["study"] == "s" for r in children)
    ok = [r for r in children if r.info.status == "FINISHED"]
    assert all("algorithm.experience_ratio" in r.data.params for r in ok)
    assert all(len(client.get_metric_history(r.info.run_id, "val/accuracy")) == 2 for r in ok)
    assert parent[0].data.metrics["trials_complete"] == res.counts["COMPLETE"]
    assert {t.user_attrs["mlflow_run_id"] for t in study.trials} == {r.info.run_id for r in children}

    # the best trial's checkpoint is the registered model's champion; it evaluates by name
    best_run = study.best_trial.user_attrs["mlflow_run_id"]
    champion = client.get_model_version_by_alias("exgrpo-s", "champion")
    assert champion.run_id == best_run and res.champion == "models:/exgrpo-s@champion"
    assert client.get_run(res.parent_run_id).data.tags["champion_model"].startswith("models:/exgrpo-s@champion")
    from exgrpo import cli

    scores = tmp_path / "scores.json"
    assert cli.main(["eval", "--checkpoint", "models:/exgrpo-s@champion", "--tracking-uri", uri,
                     "--benchmarks", "val", "--json", str(scores)]) == 0
    (val,) = [x for x in json.loads(scores.read_text()) if x["metric"] == "avg_at_1"]
    assert val["value"] == pytest.approx(study.best_value)  # greedy val accuracy of the best trial's policy

    # resume by study name: the study grows to 5 trials, under the same parent run
    res2 = run_sweep(sc, storage=storage, tracking_uri=uri, n_trials=5)
    assert len(res2.outcomes) == 1 and res2.outcomes[0]["number"] == 4
    assert res2.parent_run_id == res.parent_run_id
    assert len(optuna.load_study(study_name="s", storage=storage).trials) == 5
    res3 = run_sweep(sc, storage=storage, tracking_uri=uri, n_trials=5)
    assert res3.outcomes == []
    best_run = optuna.load_study(study_name="s", storage=storage).best_trial.user_attrs["mlflow_run_id"]
    assert client.get_model_version_by_alias("exgrpo-s", "champion").run_id == best_run  # moved if it changed
    versions = client.search_model_versions("name='exgrpo-s'")
    assert len({v.run_id for v in versions}) == len(versions)  # no version registered twice for one run


def test_a_sweep_asks_for_no_trial_the_disk_cannot_hold(tmp_path, small_disk):
    """A sweep measures its finished trials as a comparison does (exgrpo.disk): without room it asks the
    study for no more trials and says so in one line; run again with room, it asks for them."""
    sc = load_sweep({
        "study": {"name": "s", "n_trials": 3, "parallel": 1, "pruner": "none"},
        "base": "experiments/toy.yaml",
        "base_overrides": {"name": "disk-sweep", "algorithm.replay": "buckets", "output_dir": str(tmp_path / "runs")},
        "budget_steps": 4,
        "space": {"algorithm.experience_ratio": {"type": "float", "low": 0.1, "high": 0.9}},
    })
    small_disk(tmp_path / "runs" / "sweeps" / "s", runs_it_holds=1.5)
    storage, uri = f"sqlite:///{tmp_path}/optuna.db", f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    res = run_sweep(sc, storage=storage, tracking_uri=uri)
    assert [o["state"] for o in res.outcomes] == ["COMPLETE"]
    assert res.not_launched.startswith("2 trial(s) not launched: no room on disk: ")
    assert res.not_launched.endswith("then run the sweep again: its study asks for the trials still to run")
    assert [t.state.name for t in optuna.load_study(study_name="s", storage=storage).trials] == ["COMPLETE"]
    assert not (tmp_path / "runs" / "sweeps" / "s" / "trial0001").exists()  # never started

    small_disk(tmp_path / "runs" / "sweeps" / "s", runs_it_holds=100)  # space freed
    res = run_sweep(sc, storage=storage, tracking_uri=uri)
    assert sorted(o["number"] for o in res.outcomes) == [1, 2] and res.not_launched is None


def test_trials_of_two_threads_each_do_not_share_two_cores(tmp_path):
    """A trial's Ray task asks for its torch threads: on the 2-CPU local Ray, two 2-thread trials with
    parallel 2 run one after the other (their MLflow runs do not overlap), not both at once."""
    d = sweep_dict(tmp_path)
    d["study"].update(n_trials=2, pruner="none")
    sc = load_sweep(d, {**TINY_BASE, "base.train.threads": 2})
    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    res = run_sweep(sc, storage=f"sqlite:///{tmp_path}/optuna.db", tracking_uri=uri)
    assert res.counts["COMPLETE"] == 2
    client = mlflow.MlflowClient(uri)
    # when each trial trained: its first and last step as its task logged them (a run's end_time is
    # set by the driver after the task has returned and freed its CPUs, so it may follow the next start)
    steps = [[m.timestamp for m in client.get_metric_history(r.info.run_id, "batch/solved")]
             for r in client.search_runs([client.get_experiment_by_name("tiny-sweep").experiment_id],
                                         "tags.mlflow.parentRunId != ''") if r.info.run_id != res.parent_run_id]
    runs = sorted((min(t), max(t)) for t in steps)
    assert len(runs) == 2 and runs[0][1] <= runs[1][0], runs
    # one worker process ran both trials; a later test that expects two trials to overlap would find
    # one warm worker and one cold (seconds of imports) and see them run one after the other
    import ray

    ray.shutdown()
