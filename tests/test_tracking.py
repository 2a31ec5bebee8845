"""exgrpo.tracking against a real MLflow sqlite store in tmp_path (no mocks)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

mlflow = pytest.importorskip("mlflow")

import exgrpo  # noqa: E402
from exgrpo.config import load_experiment, mlflow_param_keys  # noqa: E402
from exgrpo.tracking import (  # noqa: E402
    Tracker,
    TrackingError,
    check_reachable,
    curated_params,
    resolve_tracking_uri,
    sanitize_metric_name,
)
from exgrpo.launch import tracked_train  # noqa: E402

TINY = {
    "task.max_operand": 5, "train.batch_size": 16, "algorithm.group_size": 4, "train.max_steps": 8,
    "policy.hidden": 32, "policy.layers": 2,
}


def tiny_cfg(tmp_path, **extra):
    return load_experiment("experiments/toy.yaml", {**TINY, "output_dir": str(tmp_path / "runs"), **extra})


def test_sanitize_metric_name():
    assert sanitize_metric_name("val/pass@k(16)") == "val/pass_at_k_16"
    assert sanitize_metric_name("val/avg@4") == "val/avg_at_4"
    assert sanitize_metric_name("pool/bucket_3") == "pool/bucket_3"
    assert sanitize_metric_name("a (b), c") == "a _b_ c"
    from mlflow.utils.validation import validate_param_and_metric_name

    for name in ["x@y", "f(w)", "a[b]", "p,q", "val/acc@1 (greedy)"]:
        assert validate_param_and_metric_name(sanitize_metric_name(name))


def test_uri_resolution(monkeypatch, tmp_path):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert resolve_tracking_uri().endswith("/mlruns/mlflow.db")
    assert resolve_tracking_uri().startswith("sqlite:///")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/env.db")
    assert resolve_tracking_uri() == f"sqlite:///{tmp_path}/env.db"
    assert resolve_tracking_uri("http://127.0.0.1:1") == "http://127.0.0.1:1"


def test_unreachable_server_fails_fast_before_training(tmp_path):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens here
    uri = f"http://127.0.0.1:{port}"
    t0 = time.perf_counter()
    with pytest.raises(TrackingError, match="not reachable"):
        check_reachable(uri, timeout=2)
    with pytest.raises(TrackingError, match=f"127.0.0.1:{port}"):
        tracked_train(tiny_cfg(tmp_path), tracking_uri=uri)
    assert time.perf_counter() - t0 < 10
    assert not (tmp_path / "runs").exists(), "training must not start when the store is unreachable"
    with pytest.raises(TrackingError, match="file store"):
        check_reachable(f"file://{tmp_path}/mlruns")


def test_curated_params_truncated_and_complete(tmp_path):
    cfg = tiny_cfg(tmp_path, name="x" * 7000, **{"algorithm.replay": "buckets"})
    params = curated_params(cfg, extra_keys=["train.log_every_steps", "algorithm.notebook.kl_beta", "no.such.key"])
    from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

    # every param key and the extra one present in the config, each once
    assert sorted(params) == sorted({*mlflow_param_keys(cfg), "train.log_every_steps"})
    assert len(params["name"]) == MAX_PARAM_VAL_LENGTH
    assert params["algorithm.experience_ratio"] == "0.5"
    assert "train.log_every_steps" in params  # an extra key (a sweep's space) is logged even when not a param
    assert "algorithm.notebook.kl_beta" not in params and "no.such.key" not in params  # not in this config


def test_tracked_toy_run_reads_back(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    tracker = Tracker(uri)
    parent = tracker.start_run("toy", "parent", {"kind": "compare"})
    cfg = tiny_cfg(tmp_path, **{"algorithm.replay": "buckets", "algorithm.replay_start_pass_rate": 0.0})
    run = tracked_train(cfg, tracking_uri=uri, experiment="toy", parent_run_id=parent, arm="exgrpo-early",
                        study="s1", system_metrics=True)
    tracker.end_run(parent)

    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name("toy")
    assert exp.artifact_location.startswith(f"file://{tmp_path}/mlruns/artifacts")
    mlflow.set_tracking_uri(uri)
    df = mlflow.search_runs([exp.experiment_id], filter_string="tags.algo = 'exgrpo'")
    assert list(df["run_id"]) == [run.run_id]
    r = client.get_run(run.run_id)
    assert r.info.status == "FINISHED"
    tags = r.data.tags
    assert tags["mlflow.parentRunId"] == parent
    assert {tags[k] for k in ("algo", "arm", "tier", "task", "seed", "study")} == {
        "exgrpo", "exgrpo-early", "toy", "toy_arithmetic", "0", "s1"}
    assert tags["model"].startswith("mlp-")
    # traceable to the code: the package version, and the commit of this checkout
    assert tags["exgrpo_version"] == exgrpo.__version__
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    assert tags["git_commit"].removesuffix("-dirty") == head
    assert client.get_run(parent).data.tags["exgrpo_version"] == exgrpo.__version__
    assert r.data.params["train.max_steps"] == "8" and r.data.params["algorithm.replay"] == "buckets"

    hist = client.get_metric_history(run.run_id, "batch/solved")
    assert [m.step for m in hist] == list(range(1, 9))
    val = client.get_metric_history(run.run_id, "val/accuracy")
    assert [m.step for m in val] == [4, 8]  # 58 training questions / 16 per step -> eval every 4 steps
    assert val[-1].value == pytest.approx(run.result.final_metrics["val/accuracy"])
    assert len(client.get_metric_history(run.run_id, "pool/bucket_2")) == 8

    arts = {a.path for a in client.list_artifacts(run.run_id)}
    assert {"config", "checkpoints", "metrics"} <= arts
    ckpts = [a.path for a in client.list_artifacts(run.run_id, "checkpoints")]
    assert ckpts == [f"checkpoints/{run.result.checkpoint.name}"]
    # MLflow's copy is the policy alone; the optimiser, pool and RNG states stay in the run directory
    import torch

    copy = torch.load(mlflow.artifacts.download_artifacts(run_id=run.run_id, artifact_path=ckpts[0], tracking_uri=uri,
                                                          dst_path=str(tmp_path / "dl-ckpt")), weights_only=True)
    full = torch.load(run.result.checkpoint, weights_only=True)
    assert set(copy) == {"config", "model", "step"} and {"optimizer", "replay", "rng"} <= set(full)
    assert copy["step"] == full["step"] == 8 and copy["config"] == full["config"]
    assert all(torch.equal(copy["model"][k], v) for k, v in full["model"].items()) and copy["model"].keys() == full["model"].keys()
    local = mlflow.artifacts.download_artifacts(run_id=run.run_id, artifact_path="config/resolved_config.json",
                                                tracking_uri=uri, dst_path=str(tmp_path / "dl"))
    resolved = json.loads(open(local).read())
    assert resolved["algorithm"]["replay"] == "buckets" and resolved["train"]["max_steps"] == 8
    import torch
    from mlflow import pytorch as mlflow_pytorch

    mlflow.set_tracking_uri(uri)
    model = mlflow_pytorch.load_model(r.data.tags["model_uri"])  # the final model as an MLflow model
    feats = torch.zeros(3, 4)
    assert model.log_probs(feats).shape[0] == 3
    (output,) = r.outputs.model_outputs  # the LoggedModel is the run's output at its last step
    assert output.step == 8
    logged = client.get_logged_model(output.model_id)
    assert logged.source_run_id == run.run_id and logged.params["train.max_steps"] == "8"
    model_metrics = {m.key: m for m in logged.metrics}
    assert model_metrics["final/val/accuracy"].value == pytest.approx(run.result.final_metrics["val/accuracy"])
    assert model_metrics["batch/solved"].value == pytest.approx(run.result.history[-1]["batch/solved"])
    assert {m.step for m in logged.metrics} == {8}
    inputs = {d.dataset.name: d for d in r.inputs.dataset_inputs}
    assert set(inputs) == {"toy_arithmetic-train", "toy_arithmetic-val"}
    assert [t.value for t in inputs["toy_arithmetic-train"].tags] == ["training"]
    assert [t.value for t in inputs["toy_arithmetic-val"].tags] == ["eval"]


def test_failed_run_is_marked_failed(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"

    def boom(step, metrics):
        if step == 2:
            raise RuntimeError("disk on fire")

    cfg = tiny_cfg(tmp_path)
    with pytest.raises(RuntimeError, match="disk on fire"):
        tracked_train(cfg, tracking_uri=uri, callbacks=[boom])
    client = mlflow.MlflowClient(uri)
    (r,) = client.search_runs([client.get_experiment_by_name(cfg.name).experiment_id])
    assert r.info.status == "FAILED"
    assert "disk on fire" in r.data.tags["error"]
    assert r.data.tags["algo"] == "grpo"


@pytest.mark.slow
def test_tracked_compare_on_a_process_pool(tmp_path):
    """The compare runner hook: spawned processes, each (arm, seed) an MLflow child of one parent."""
    from exgrpo.config import load_compare
    from exgrpo.compare.tracked import run_tracked_compare

    cc = load_compare("experiments/toy.yaml", {**{k: v for k, v in TINY.items()}, "output_dir": str(tmp_path / "runs"),
                                               "name": "pp"})
    cc = cc.model_copy(update={"arms": {"grpo": cc.arms["grpo"], "exgrpo": cc.arms["exgrpo"]}, "seeds": [0]})
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    res = run_tracked_compare(cc, tracking_uri=uri, executor="process", workers=2)
    assert sorted(o.arm for o in res.outcomes) == ["exgrpo", "grpo"] and all(o.run_id for o in res.outcomes)
    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([res.experiment_id])
    assert len(runs) == 3
    parent = client.get_run(res.parent_run_id)
    assert parent.info.status == "FINISHED" and parent.data.tags["kind"] == "compare"
    assert {r.data.tags.get("mlflow.parentRunId") for r in runs if r.info.run_id != res.parent_run_id} == {res.parent_run_id}
    assert parent.data.metrics["grpo/final_mean"] == pytest.approx([o.final for o in res.outcomes if o.arm == "grpo"][0])
    assert "| grpo | 1 |" in res.table


@pytest.mark.slow  # kills and resumes a comparison's runs
def test_a_killed_comparison_resumes_its_runs_and_mlflow_gets_their_whole_history(tmp_path):
    """compare --resume: a finished run is reused as it is, a killed one continues from its checkpoint
    and ends as an uninterrupted run would; each new child run holds every step."""
    from exgrpo.backends.native.trainer import Trainer
    from exgrpo.config import load_compare
    from exgrpo.compare.tracked import run_tracked_compare

    def compare(root):
        cc = load_compare("experiments/toy.yaml", {**TINY, "train.checkpoint_every": 2, "output_dir": str(root),
                                                   "name": "rs"})
        return cc.model_copy(update={"arms": {"grpo": cc.arms["grpo"], "exgrpo": cc.arms["exgrpo"]}, "seeds": [0]})

    cc = compare(tmp_path / "runs")
    Trainer(cc.arm_config("grpo", 0)).fit(progress=False)  # finished before the "kill"
    Trainer(cc.arm_config("exgrpo", 0)).fit(progress=False, stop_after_step=4)  # killed after step 4
    uninterrupted = Trainer(compare(tmp_path / "ref").arm_config("exgrpo", 0)).fit(progress=False)
    grpo_ckpt = cc.arm_config("grpo", 0).run_dir() / "checkpoints" / "step_0000008.pt"
    stamp = grpo_ckpt.stat().st_mtime_ns

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    res = run_tracked_compare(cc, tracking_uri=uri, executor="process", workers=1, resume=True)
    by_arm = {o.arm: o for o in res.outcomes}
    assert grpo_ckpt.stat().st_mtime_ns == stamp  # reused, not trained again
    assert by_arm["exgrpo"].final == uninterrupted.final_metrics["val/accuracy"]
    rows = [json.loads(x) for x in (cc.arm_config("exgrpo", 0).run_dir() / "metrics.jsonl").read_text().splitlines()]
    drop_time = lambda rs: [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rs]  # noqa: E731
    assert drop_time(rows) == drop_time(uninterrupted.history)
    client = mlflow.MlflowClient(uri)
    assert client.get_run(res.parent_run_id).data.tags["resumed"] == "true"
    for o in res.outcomes:  # steps 1-4 (or all 8) from metrics.jsonl, the rest as they were trained
        assert sorted(m.step for m in client.get_metric_history(o.run_id, "batch/solved")) == list(range(1, 9))
        assert client.get_run(o.run_id).data.tags.get("checkpoint", "").endswith("step_0000008.pt")
    # without --resume the same call starts afresh and moves the earlier runs aside
    res = run_tracked_compare(cc, tracking_uri=uri, executor="process", workers=1)
    assert len(list((tmp_path / "runs").glob("rs/rs-grpo/seed0.old-*"))) == 1


def test_log_every_steps_thins_mlflow_not_metrics_jsonl(tmp_path):
    """train.log_every_steps=3: MLflow gets steps 3, 6, ... and every evaluation step; metrics.jsonl
    keeps every step."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = tiny_cfg(tmp_path, **{"train.max_steps": 10, "train.log_every_steps": 3, "train.eval_every_steps": 5,
                                "train.eval_before_train": False})
    run = tracked_train(cfg, tracking_uri=uri, log_model=False)
    client = mlflow.MlflowClient(uri)
    logged = sorted(m.step for m in client.get_metric_history(run.run_id, "batch/solved"))
    evaluated = sorted(m.step for m in client.get_metric_history(run.run_id, "val/accuracy"))
    rows = [json.loads(x) for x in (Path(run.result.run_dir) / "metrics.jsonl").read_text().splitlines()]
    assert sorted(int(r["step"]) for r in rows if "batch/solved" in r) == list(range(1, 11))
    assert evaluated == [5, 10]
    assert logged == [3, 5, 6, 9, 10]


def test_a_champion_checkpoint_that_is_missing_or_a_foreign_directory_is_refused_with_its_path(tmp_path):
    """A directory is registered only when it is a veRL step (global_step_N/ with actor/fsdp_config.json;
    the real one: test_verl_grpo_run.py); anything else is named in the error, nothing is logged."""
    from exgrpo.tracking.registry import register_champion

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    run_id = client.create_run(client.create_experiment("reg")).info.run_id
    ckpt = tmp_path / "checkpoints" / "global_step_6"
    (ckpt / "actor").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="global_step_6 is a directory but not a veRL checkpoint"):
        register_champion(client, "study", run_id, ckpt)
    with pytest.raises(FileNotFoundError, match="is missing"):
        register_champion(client, "study", run_id, tmp_path / "step_9.pt")
    assert not client.list_artifacts(run_id)


def test_a_registered_checkpoint_is_downloaded_for_its_evaluation_only(tmp_path, monkeypatch):
    """`exgrpo eval --checkpoint models:/...@champion` (and the evaluate flow) leave no `exgrpo-model-*`
    download in the temp dir, even when the evaluation fails; a path is used where it is."""
    import tempfile

    from exgrpo.tracking.registry import checkpoint_at, register_champion

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = mlflow.MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("reg")).info.run_id
    (tmp_path / "step_9.pt").write_bytes(b"weights")
    register_champion(client, "study", run_id, tmp_path / "step_9.pt")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    with checkpoint_at("models:/exgrpo-study@champion", uri) as path:
        assert path.name == "step_9.pt" and path.read_bytes() == b"weights"
        assert [d.name[:13] for d in tmp.iterdir()] == ["exgrpo-model-"]
    assert not list(tmp.iterdir())
    with pytest.raises(RuntimeError, match="evaluation failed"), checkpoint_at("models:/exgrpo-study/1", uri):
        raise RuntimeError("evaluation failed")
    assert not list(tmp.iterdir())
    with checkpoint_at(str(tmp_path / "step_9.pt"), uri) as path:
        assert path == tmp_path / "step_9.pt"
    assert path.is_file()


def test_importing_exgrpo_turns_mlflow_telemetry_off():
    """Out of CI (no CI variables), MLflow's telemetry client would start and later unset an env var
    from a thread, racing the run's own HTTP logging. Importing exgrpo first turns it off; a user's
    explicit setting wins."""
    import os
    import sys

    ci_vars = {"PYTEST_CURRENT_TEST", "CI", "GITHUB_ACTIONS", "MLFLOW_DISABLE_TELEMETRY", "DO_NOT_TRACK"}
    env = {k: v for k, v in os.environ.items() if k not in ci_vars}
    probe = ("import exgrpo, mlflow; from mlflow.environment_variables import MLFLOW_DISABLE_TELEMETRY; "
             "print(MLFLOW_DISABLE_TELEMETRY.get())")  # what MLflow reads first (the CI checks come after)
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.strip().splitlines()[-1] == "True"
    out = subprocess.run([sys.executable, "-c", probe], env={**env, "MLFLOW_DISABLE_TELEMETRY": "false"},
                         capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_the_open_page_writes_the_choice_where_mlflows_ui_reads_it():
    """MLflow's bundled UI reads the sidebar's "GenAI | Model training" choice through its
    ``useLocalStorage({key: "mlflow.workflowType", version: 1})``, kept as JSON under
    ``<key>_v<version>``; the page of ``--app-name exgrpo`` writes that key (an MLflow whose UI moves it
    fails here, where the browser test would skip without Chromium)."""
    import mlflow.server

    from exgrpo.tracking.mlflow_app import PAGE, TRAINING_VIEW, WORKFLOW_STORAGE_KEY

    bundle = "".join(p.read_text() for p in (Path(mlflow.server.__file__).parent / "js/build/static/js").glob("main.*.js"))
    assert 'key:"mlflow.workflowType",version:1,' in bundle
    assert re.search(r"\((\w),(\w)\)=>`\$\{\1\}_v\$\{\2\}`", bundle), "the hook's key format changed"
    assert re.search(r"JSON\.stringify\(\w\);try\{localStorage\.setItem", bundle), "the hook no longer stores JSON"
    assert WORKFLOW_STORAGE_KEY == "mlflow.workflowType_v1" and TRAINING_VIEW == "machine_learning"
    assert 'localStorage.setItem("mlflow.workflowType_v1", "\\"machine_learning\\"")' in PAGE


def test_mlflow_links_point_at_the_ui_that_serves_the_store(tmp_path, monkeypatch):
    """`exgrpo ui --mlflow-port 30009` (or on another store): the links printed for that store (a
    comparison's parent, the Prefect link artifact, train's mlflow_url: all run_url) point at its UI;
    where nothing serves the store, the line names the command that would."""
    from exgrpo.paths import UI_SERVER_FILE
    from exgrpo.prefect_home import announce_server, withdraw_server
    from exgrpo.tracking.mlflow_tracking import experiment_url, resolve_tracking_uri, run_link, run_url, ui_note

    home = tmp_path / "home"
    monkeypatch.setenv("PREFECT_HOME", str(home))
    monkeypatch.delenv("EXGRPO_MLFLOW_UI", raising=False)
    store = resolve_tracking_uri(f"sqlite:///{tmp_path}/elsewhere.db")
    assert run_url("1", "r", store) == "http://127.0.0.1:5000/exgrpo/open#/experiments/1/runs/r?workflowType=machine_learning"
    assert ui_note(store) == f" (nothing serves this store now: `exgrpo ui --tracking-uri {store}` does)"
    announce_server(home, "http://127.0.0.1:4200/api", "http://127.0.0.1:30009", store)
    assert run_url("1", "r", store).startswith("http://127.0.0.1:30009/exgrpo/open#/experiments/1/runs/r")
    assert ui_note(store) == " (served by the running `exgrpo ui`)"
    other = resolve_tracking_uri(f"sqlite:///{tmp_path}/other.db")
    assert run_url("1", "r", other).startswith("http://127.0.0.1:5000/")  # not the store that UI serves
    # a tracking server is its own UI: the page is there when that server is this `exgrpo ui`'s MLflow
    assert run_url("1", "r", "http://127.0.0.1:30009/") == \
        "http://127.0.0.1:30009/exgrpo/open#/experiments/1/runs/r?workflowType=machine_learning"
    assert experiment_url("1", "http://10.0.0.9:5000") == "http://10.0.0.9:5000/#/experiments/1/runs?workflowType=machine_learning"
    assert run_link("u", store) == {"mlflow_url": "u"}  # train's record: the link, where a UI serves it
    withdraw_server(home)
    assert run_url("1", "r", store).startswith("http://127.0.0.1:5000/")
    # a record whose process is gone, its pid now another process's (it started later), points nowhere
    (home / UI_SERVER_FILE).write_text(json.dumps({"api_url": "x", "pid": os.getpid(), "started": 1.0,
                                                   "mlflow_url": "http://127.0.0.1:30009", "mlflow_store": store}))
    assert run_url("1", "r", store).startswith("http://127.0.0.1:5000/")


def test_train_names_the_command_that_serves_its_run_where_no_ui_does(tmp_path, monkeypatch, capsys):
    """`exgrpo train` with nothing serving its store: its record gives the command that would
    (`exgrpo ui`, with the store), not a link to a port nothing listens on."""
    from exgrpo.cli import main

    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "home"))  # no running `exgrpo ui` recorded there
    monkeypatch.delenv("EXGRPO_MLFLOW_UI", raising=False)
    store = f"sqlite:///{tmp_path}/mlflow.db"
    assert main(["train", "experiments/toy-exgrpo.yaml", "--max-steps", "2", "--no-progress", "--tracking-uri", store,
                 "--output-dir", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    record = json.loads(out[out.rindex('{\n  "run_dir"'):])
    assert "mlflow_url" not in record and ":5000" not in out
    assert f"`exgrpo ui --tracking-uri {store}` does" in record["mlflow_ui"] and record["mlflow_run_id"]


def test_a_stopped_comparisons_children_are_all_ended_past_one_page_of_search(tmp_path, monkeypatch):
    """``end_running_children`` reads every page of MLflow's search: with pages of 2 runs, all 5 RUNNING
    children are ended KILLED, the FINISHED one and another parent's child are left as they are."""
    from mlflow import MlflowClient

    from exgrpo.tracking import mlflow_tracking

    monkeypatch.setattr(mlflow_tracking, "SEARCH_PAGE", 2)
    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db")
    parent, other = tracker.start_run("pages", "parent"), tracker.start_run("pages", "other")
    children = [tracker.start_run("pages", f"child-{i}", parent_run_id=parent) for i in range(6)]
    stranger = tracker.start_run("pages", "stranger", parent_run_id=other)
    tracker.end_run(children[0], "FINISHED")
    ended = tracker.end_running_children(parent, "KILLED")
    client = MlflowClient(tracker.uri)
    assert sorted(ended) == sorted(children[1:])
    assert [client.get_run(c).info.status for c in children] == ["FINISHED"] + ["KILLED"] * 5
    assert client.get_run(stranger).info.status == "RUNNING"
