"""Prefect flows on Prefect's real ephemeral API, with real Ray (2 CPUs) and real MLflow sqlite."""

from __future__ import annotations

import asyncio
import atexit
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

# Prefect reads its settings at import: point it at a throw-away home first (stack-notes §10).
_HOME = tempfile.mkdtemp(prefix="prefect-home-")
atexit.register(shutil.rmtree, _HOME, True)
for k, v in {
    "PREFECT_HOME": _HOME, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_CLI_PROMPT": "false",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",
}.items():  # nothing that changes what other modules' commands show: xdist imports this module in every worker
    os.environ.setdefault(k, v)
os.environ.pop("PREFECT_API_URL", None)
if "RAY_TMPDIR" not in os.environ:  # short: Ray's unix socket paths are length-limited
    os.environ["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    atexit.register(shutil.rmtree, os.environ["RAY_TMPDIR"], True)

prefect = pytest.importorskip("prefect")
mlflow = pytest.importorskip("mlflow")
pytest.importorskip("ray")
yaml = pytest.importorskip("yaml")

from flows.compare import compare_flow  # noqa: E402
from flows.evaluate import evaluate_flow  # noqa: E402
from flows.sweep import sweep_flow  # noqa: E402


def test_prefect_yaml_declares_the_deployments():
    from prefect.flows import load_flow_from_entrypoint

    d = yaml.safe_load(open("prefect.yaml"))
    deps = {x["name"]: x for x in d["deployments"]}
    assert set(deps) == {"train", "train-verl", "compare", "sweep", "evaluate"}
    for dep in deps.values():
        assert dep["work_pool"]["name"] == "local-pool"
        flow = load_flow_from_entrypoint(dep["entrypoint"])
        assert set(dep.get("parameters") or {}) <= set(flow.parameters.properties), dep["name"]
    scheds = deps["sweep"]["schedules"]
    assert len(scheds) == 2 and scheds[0]["parameters"] != scheds[1]["parameters"]
    assert {s["slug"] for s in scheds} == {"nightly-small", "weekly-full"}
    # every schedule ships paused: `prefect deploy --all` and a running worker start no study by themselves
    every = [(dep["name"], s) for dep in deps.values() for s in dep.get("schedules") or []]
    assert every and all(s["active"] is False for _, s in every), every


def test_compare_flow_parent_and_children_in_mlflow(tmp_path):
    cfg = tmp_path / "cmp.yaml"
    cfg.write_text(yaml.safe_dump({
        "base": {"name": "flowcmp", "output_dir": str(tmp_path / "runs"),
                 "task": {"max_operand": 5}, "policy": {"hidden": 32, "layers": 2},
                 "algorithm": {"group_size": 4, "replay_start_pass_rate": 0.0},
                 "train": {"batch_size": 16, "max_steps": 8}},
        "arms": {"grpo": {"algorithm.replay": "none"}, "exgrpo": {"algorithm.replay": "buckets"}},
        "baseline": "grpo", "seeds": [0, 1],
    }))
    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    state = compare_flow(config=str(cfg), tracking_uri=uri, executor="ray", return_state=True)
    assert state.is_completed(), state
    out = state.result()
    assert "| exgrpo | 2 |" in out["table"] and "| grpo | 2 |" in out["table"]

    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name("flowcmp")
    runs = client.search_runs([exp.experiment_id])
    (parent,) = [r for r in runs if r.data.tags.get("kind") == "compare"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert parent.info.run_id == out["parent_run_id"] and parent.info.status == "FINISHED"
    assert len(runs) == 5 and len(children) == 4
    # each (arm, seed) is a task run spanning its own training, not a dot at its end
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as prefect_client:
        spans = prefect_client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[state.state_details.flow_run_id])))
    assert sorted(t.name for t in spans) == ["exgrpo seed 0", "exgrpo seed 1", "grpo seed 0", "grpo seed 1"]
    for t in spans:  # each opened as its run started and closed as it ended (these runs take a second)
        assert t.state_type.value == "COMPLETED" and t.state.message.startswith("final val/accuracy = "), t
    from prefect.states import Completed

    from flows.compare import end_span, start_span

    @prefect.flow
    def a_run_of_a_while() -> str:
        span = start_span("arm", 0)
        time.sleep(1.5)
        assert end_span(span, Completed(message="done"))
        return span

    with get_client(sync_client=True) as prefect_client:
        timed = prefect_client.read_task_run(a_run_of_a_while())
    assert timed.name == "arm seed 0" and timed.total_run_time.total_seconds() >= 1.4  # not a dot at its end
    # the parent records what the arms share, and which fields each arm sets its own way
    assert "seed" not in parent.data.params and "algorithm.replay" not in parent.data.params
    assert parent.data.params["train.max_steps"] == "8" and parent.data.params["compare.seeds"] == "0,1"
    assert "algorithm.replay" in parent.data.params["compare.differs_by_arm"].split(", ")
    assert "algorithm.replay=none" in parent.data.tags["arm.grpo"] and "algorithm.replay=buckets" in parent.data.tags["arm.exgrpo"]
    assert sorted((r.data.tags["algo"], r.data.tags["seed"]) for r in children) == [
        ("exgrpo", "0"), ("exgrpo", "1"), ("grpo", "0"), ("grpo", "1")]
    assert all(r.info.status == "FINISHED" for r in children)
    for arm in ("grpo", "exgrpo"):
        assert f"{arm}/final_mean" in parent.data.metrics
    assert "exgrpo/diff_vs_grpo" in parent.data.metrics
    assert "comparison.md" in {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert set(out["runs"].values()) == {r.info.run_id for r in children}

    # the flow published the table and links as Prefect artifacts
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with get_client(sync_client=True) as c:
        arts = c.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[state.state_details.flow_run_id])))
    by_key = {a.key: a for a in arts}
    assert {"flowcmp-comparison", "flowcmp-comparison-table", "flowcmp-mlflow", "flowcmp-progress"} <= set(by_key)
    assert by_key["flowcmp-progress"].type == "progress" and by_key["flowcmp-progress"].data == 100.0
    md = by_key["flowcmp-comparison"].data
    assert "| exgrpo | 2 |" in md and parent.info.run_id in md
    assert by_key["flowcmp-comparison-table"].type == "table"
    assert f"/runs/{parent.info.run_id}" in by_key["flowcmp-mlflow"].data  # a link artifact (markdown link)

    # evaluate deployment's flow on one child's checkpoint, logged into that child run
    child = children[0]
    ev = asyncio.run(evaluate_flow(checkpoint=child.data.tags["checkpoint"], run_id=child.info.run_id, tracking_uri=uri))
    assert ev["step"] == 8
    assert ev["scores"]["val/avg_at_1"] == pytest.approx(child.data.metrics["val/accuracy"])
    # the training's own final evaluation is that value at that step already, under the same name: one point, not
    # two, and nothing logged again
    assert [m.step for m in client.get_metric_history(child.info.run_id, "eval/val/avg_at_1")] == [8]
    assert ev["logged"] == {}
    from exgrpo.tracking.eval_record import one_series_per_meaning

    value = ev["scores"]["val/avg_at_1"]
    assert one_series_per_meaning(client, child.info.run_id, {"eval/val/avg_at_1": value + 0.5, "eval/x": 1.0}, 8) \
        == {"evaluate/val/avg_at_1": value + 0.5, "eval/x": 1.0}  # another reading keeps a key of its own

    # resumed with a third seed: the four finished runs are reused (not trained again), only seed 2 trains
    ckpts = sorted((tmp_path / "runs").glob("flowcmp-*/seed*/checkpoints/*.pt"))
    stamps = {p: p.stat().st_mtime_ns for p in ckpts}
    again = compare_flow(config=str(cfg), tracking_uri=uri, executor="ray", seeds=3, resume=True)
    assert "| exgrpo | 3 |" in again["table"] and "| grpo | 3 |" in again["table"]
    assert {p: p.stat().st_mtime_ns for p in ckpts} == stamps
    finals = {(o["arm"], o["seed"]): o["final"] for o in again["outcomes"]}
    assert {k: v for k, v in finals.items() if k[1] < 2} == {(o["arm"], o["seed"]): o["final"] for o in out["outcomes"]}
    resumed = client.get_run(again["parent_run_id"])
    assert resumed.data.tags["resumed"] == "true" and resumed.info.status == "FINISHED"
    # one (config, seed) is one MLflow run: a reused run is the same run, now a child of the new parent
    assert again["runs"]["grpo/seed0"] == out["runs"]["grpo/seed0"]
    reused = client.get_run(again["runs"]["grpo/seed0"])
    assert reused.data.tags["mlflow.parentRunId"] == again["parent_run_id"] and reused.info.status == "FINISHED"
    assert sorted(m.step for m in client.get_metric_history(reused.info.run_id, "batch/solved")) == list(range(1, 9))
    trained = [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("arm")]
    assert len(trained) == 6  # the four first runs and the two of seed 2, none copied


def test_the_train_flow_runs_the_named_arm_of_a_comparison_file(tmp_path):
    from flows.train import train_flow

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    small = {"output_dir": str(tmp_path / "runs"), "train.max_steps": 2, "task.max_operand": 5, "policy.hidden": 16,
             "policy.layers": 1, "algorithm.group_size": 4, "train.batch_size": 8}
    out = asyncio.run(train_flow(config="experiments/toy.yaml", arm="exgrpo-early", seed=1, overrides=small,
                                 tracking_uri=uri))
    run = mlflow.MlflowClient(uri).get_run(out["run_id"])
    # the arm's own overrides apply on top of the base, as in `exgrpo compare`
    assert run.data.params["name"] == "toy-exgrpo-early" and run.data.params["algorithm.replay"] == "buckets"
    assert run.data.params["seed"] == "1" and run.data.params["train.max_steps"] == "2"
    state = asyncio.run(train_flow(config="experiments/toy.yaml", arm="ppo", overrides=small, return_state=True))
    assert state.is_failed() and state.message.startswith("arm ppo: experiments/toy.yaml has no such arm; its arms are")
    # a bad field: the flow run's one line names it (the error's second line)
    state = asyncio.run(train_flow(overrides={"train.lr": "fast"}, return_state=True))
    assert state.is_failed() and state.message.startswith(
        "invalid config (experiments/toy-exgrpo.yaml): train.lr: Input should be a valid number"), state.message
    # the flow and `exgrpo train` check the same things in the same order, before a run's record exists:
    # here a veRL job's interpreter that is not there, in one line each
    bad = {"backend.verl.python": str(tmp_path / "no-python"), "output_dir": str(tmp_path / "runs")}
    why = f"backend.verl.python={tmp_path / 'no-python'}: no interpreter at {tmp_path / 'no-python'}"
    state = asyncio.run(train_flow(config="experiments/verl-tiny-exgrpo.yaml", overrides=bad, tracking_uri=uri,
                                   return_state=True))
    assert state.is_failed() and state.message == why, state.message
    out = subprocess.run([sys.executable, "-m", "exgrpo.cli", "train", "experiments/verl-tiny-exgrpo.yaml",
                          *[f"--set={k}={v}" for k, v in bad.items()], "--tracking-uri", uri],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [f"error: {why}"], out.stderr
    assert mlflow.MlflowClient(uri).get_experiment_by_name("verl-tiny-exgrpo") is None  # no record was started


def test_sweep_flow_runs_a_small_study(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    out = sweep_flow(config="experiments/toy-sweep.yaml", n_trials=2, tracking_uri=uri,
                     storage=f"sqlite:///{tmp_path}/optuna.db",
                     overrides={"study.name": "flow-study", "budget_steps": 4, "base.task.max_operand": 5,
                                "base.train.batch_size": 16, "base.algorithm.group_size": 4,
                                "base.policy.hidden": 16, "base.policy.layers": 1,
                                "base.output_dir": str(tmp_path / "runs"),
                                "space.algorithm.bucket_rbound.low": 2, "space.algorithm.bucket_rbound.high": 3,
                                "space.algorithm.bucket_lbound.high": 1})
    assert out["counts"]["COMPLETE"] + out["counts"]["FAIL"] == 2
    assert out["trials"][0]["state"] in ("COMPLETE", "FAIL")
    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("toy-sweep").experiment_id])
    assert len([r for r in runs if r.data.tags.get("mlflow.parentRunId") == out["parent_run_id"]]) == 2


def test_compare_flow_shows_each_run_as_a_task_run_and_a_failed_one_as_failed(tmp_path):
    """One arm cannot write its run directory: its Ray task fails, the other arm finishes, the flow
    run ends failed, and each (arm, seed) is a Prefect task run, the broken one FAILED with its error."""
    cfg = tmp_path / "cmp.yaml"
    cfg.write_text(yaml.safe_dump({
        "base": {"name": "flowfail", "output_dir": str(tmp_path / "runs"), "task": {"max_operand": 5},
                 "policy": {"hidden": 16, "layers": 2}, "algorithm": {"group_size": 4},
                 "train": {"batch_size": 16, "max_steps": 4}},
        "arms": {"grpo": {"algorithm.replay": "none"},
                 "broken": {"algorithm.replay": "none", "output_dir": "/proc/exgrpo-cannot-write-here"}},
        "baseline": "grpo", "seeds": [0],
    }))
    state = compare_flow(config=str(cfg), tracking_uri=f"sqlite:///{tmp_path}/mlflow.db", return_state=True)
    assert state.is_failed()
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as c:
        runs = c.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[state.state_details.flow_run_id])))
    by_name = {r.name: r for r in runs}
    assert by_name["grpo seed 0"].state.is_completed()
    broken = by_name["broken seed 0"]
    assert broken.state.is_failed() and "/proc/exgrpo-cannot-write-here" in (broken.state.message or ""), broken.state


def test_an_adaptive_comparison_resumes_at_its_stage_and_records_each_decision(tmp_path):
    """Stage 1's runs exist (a comparison killed after it, or the same seeds run fixed): ``--adaptive
    --resume`` reuses them, tests, and trains stage 2 only for the arms still undecided. "easy" (a
    task of one-digit sums) is far ahead of grpo from stage 1; "same" is grpo's own config, so never
    different."""
    cfg = tmp_path / "cmp.yaml"
    cfg.write_text(yaml.safe_dump({
        "base": {"name": "adaptive", "output_dir": str(tmp_path / "runs"), "task": {"max_operand": 9},
                 "policy": {"hidden": 32, "layers": 2}, "algorithm": {"group_size": 4, "replay": "none"},
                 "train": {"batch_size": 16, "max_steps": 2}},
        "arms": {"grpo": {}, "same": {}, "easy": {"task.max_operand": 1}},
        "baseline": "grpo", "seeds": [0, 1, 2],
        "adaptive": {"seeds_per_stage": 3, "max_stages": 2, "alpha": 0.3},  # 3 seeds decide only at a lax level
    }))
    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    first = compare_flow(config=str(cfg), tracking_uri=uri, executor="ray")
    stamps = {p: p.stat().st_mtime_ns for p in (tmp_path / "runs").glob("adaptive/adaptive-*/seed*/checkpoints/*.pt")}
    assert len(stamps) == 9

    state = compare_flow(config=str(cfg), tracking_uri=uri, executor="ray", adaptive=True, resume=True,
                         return_state=True)
    assert state.is_completed(), state
    out = state.result()
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps  # stage 1 reused, not trained again
    seeds = sorted((o["arm"], o["seed"]) for o in out["outcomes"])
    assert seeds == sorted([("easy", s) for s in range(3)] + [(a, s) for a in ("grpo", "same") for s in range(6)])
    pairs = {(p["arm"], p["other"]): (p["decision"], p["stage"], p["seeds"]) for p in out["adaptive"]["pairs"]}
    assert pairs == {("easy", "grpo"): ("larger", 1, 3), ("same", "grpo"): ("equal", 2, 6)}
    assert "| easy vs grpo | ahead | 1 | 3 |" in out["table"] and "| easy | 3 |" in out["table"]
    assert out["runs"]["grpo/seed0"] == first["runs"]["grpo/seed0"]

    client = mlflow.MlflowClient(uri)
    parent = client.get_run(out["parent_run_id"])
    assert parent.data.tags["adaptive"] == "true" and parent.data.params["compare.adaptive.seeds_per_stage"] == "3"
    assert parent.data.tags["adaptive.easy_vs_grpo"] == "larger at stage 1 (3 seeds each)"
    assert parent.data.tags["adaptive.same_vs_grpo"] == "equal at stage 2 (6 seeds each)"
    assert [(m.step, m.value) for m in client.get_metric_history(parent.info.run_id, "adaptive/undecided_pairs")] \
        == [(1, 1.0), (2, 0.0)]
    assert {"adaptive.json", "adaptive.md", "comparison.md", "comparison.png", "comparison-mechanism.png"} <= {
        a.path for a in client.list_artifacts(parent.info.run_id)}
    # the flow drew the figures (a deployment run of it leaves them too), into the comparison's directory
    assert {k: Path(v).name for k, v in out["figures"].items()} == {
        "comparison": "comparison.png", "mechanism": "comparison-mechanism.png"}
    assert all(Path(v).parent == tmp_path / "runs" / "adaptive" and Path(v).stat().st_size > 10_000
               for v in out["figures"].values())
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as c:
        versions = c.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["adaptive-adaptive"])))
    assert sorted(a.description for a in versions) == [f"AdaStop's decisions after stage {k}" for k in (1, 2)]
    from exgrpo.dashboard import build_comparison_report

    html = build_comparison_report(out["parent_run_id"], tracking_uri=uri).html
    assert "Sequential test: when each pair was decided" in html and "after stage 2</th>" in html
    row = html.split('id="adaptive-table"')[1].split("</tr>")[1]
    assert "easy vs grpo" in row and row.count("ahead") == 2  # decided at stage 1, so ahead after stages 1 and 2

    # a resume that would re-spend the test's error budget fails before any work, naming the field
    changed = compare_flow(config=str(cfg), tracking_uri=uri, executor="ray", adaptive=True, resume=True,
                           overrides={"adaptive.max_stages": 3}, return_state=True)
    assert changed.is_failed() and changed.message.startswith("adaptive.max_stages=3 differs from 2"), changed.message


def test_unreachable_tracking_server_fails_the_flow_before_training(tmp_path):
    state = compare_flow(config="experiments/toy.yaml", tracking_uri="http://127.0.0.1:9", return_state=True,
                         overrides={"output_dir": str(tmp_path / "runs")})
    assert state.is_failed()
    with pytest.raises(Exception, match="not reachable"):
        state.result()
    assert not (tmp_path / "runs").exists()
    # so does a bad config field, in one line naming it (the flow returns that Failed state: no traceback)
    state = compare_flow(config="experiments/toy.yaml", overrides={"train.lr": "fast"}, return_state=True)
    assert state.is_failed() and state.message.startswith("invalid config (experiments/toy.yaml): arm 'grpo': "
                                                          "train.lr: Input should be a valid number"), state.message
    state = sweep_flow(overrides={"base.train.lr": "fast"}, return_state=True)
    assert state.is_failed() and " train.lr: Input should be a valid number" in state.message, state.message
    assert "\n" not in state.message and "Traceback" not in state.message



def test_cli_sweep_rejects_a_bad_space_before_any_work(tmp_path):
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "exgrpo.cli", "sweep", "experiments/toy-sweep.yaml",
                        "--set", "space.algorithm.experiance_ratio.low=0.2", "--no-prefect",
                        "--tracking-uri", f"sqlite:///{tmp_path}/m.db", "--storage", f"sqlite:///{tmp_path}/o.db"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert "algorithm.experiance_ratio: unknown config field; did you mean algorithm.experience_ratio" in p.stderr
    assert not (tmp_path / "o.db").exists() and not (tmp_path / "m.db").exists()
