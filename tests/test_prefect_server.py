"""End to end on a real Prefect server: the README's deployment commands, a process worker, MLflow.

    prefect server start --host 127.0.0.1 --port <free>      (tmp PREFECT_HOME, sqlite)
    prefect work-pool create local-pool --type process --overwrite
    prefect --no-prompt deploy --all                          (prefect.yaml, EXGRPO_HOME=<repo>)
    <trigger the train deployment with tiny parameters>       (REST: create_flow_run)
    prefect worker start --pool local-pool --run-once         (runs it in a subprocess, exits)

Everything runs in subprocesses with their own environment (this pytest process keeps Prefect's
ephemeral mode for tests/test_flows.py), talks to the server over REST, and every process started
here (server, worker, the flow run the worker spawned) is killed at the end, also on failure.
The triggered run goes to its own work queue of local-pool, so the worker never picks up a run that
the sweep's schedules happen to make due during the test.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from netutil import free_port

from exgrpo.prefect_home import UI_SERVER_FILE, announce_server, use_prefect_home, withdraw_server

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

pytest.importorskip("prefect")
mlflow = pytest.importorskip("mlflow")
psutil = pytest.importorskip("psutil")
requests = pytest.importorskip("requests")
yaml = pytest.importorskip("yaml")

REPO = Path(__file__).resolve().parents[1]
PREFECT = str(Path(sys.executable).with_name("prefect")) if Path(sys.executable).with_name("prefect").exists() \
    else shutil.which("prefect")
TINY = {"task.max_operand": 5, "train.batch_size": 16, "algorithm.group_size": 4, "train.max_steps": 8,
        "policy.hidden": 32, "policy.layers": 2}



def _kill_tree(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM the process and every descendant (by pid), then SIGKILL what is left."""
    try:
        procs = [psutil.Process(proc.pid)]
        procs += procs[0].children(recursive=True)
    except psutil.NoSuchProcess:
        procs = []
    for p in procs:
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def _cli(args: list[str], env: dict[str, str], timeout: float = 120, cwd: Path = REPO) -> str:
    p = subprocess.run([PREFECT, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    out = p.stdout + p.stderr
    assert p.returncode == 0, f"prefect {' '.join(args)} exited {p.returncode}:\n{out[-4000:]}"
    return out


class Server:
    def __init__(self, url: str, env: dict[str, str], tmp: Path) -> None:
        self.url, self.env, self.tmp = url, env, tmp
        self.api = url + "/api"

    def _call(self, method: str, path: str, body: dict | None = None):
        # like Prefect's own client: retry 429/502/503 (the sqlite-backed server answers 503 while
        # its database is locked, e.g. when the scheduler inserts runs right after a deploy)
        for attempt in range(8):
            r = requests.request(method, self.api + path, json=body, timeout=15)
            if r.status_code not in (429, 502, 503):
                break
            time.sleep(min(0.5 * 2 ** attempt, 4.0))
        assert r.status_code < 300, (f"{method} {path}: HTTP {r.status_code} {r.text[:2000]}\nserver log:\n"
                                     f"{(self.tmp / 'server.log').read_text()[-4000:]}")
        return r.json() if r.content else None

    def get(self, path: str):
        return self._call("GET", path)

    def post(self, path: str, body: dict):
        return self._call("POST", path, body)

    def patch(self, path: str, body: dict) -> None:
        self._call("PATCH", path, body)


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    """A Prefect server with local-pool and every deployment of prefect.yaml."""
    tmp = tmp_path_factory.mktemp("prefect-e2e")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    env.update({
        "PREFECT_HOME": str(tmp / "home"), "PREFECT_API_URL": url + "/api",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_CLI_PROMPT": "false",
        "PREFECT_SERVER_UI_ENABLED": "false", "PREFECT_LOGGING_LEVEL": "INFO",
        "EXGRPO_HOME": str(REPO), "WANDB_MODE": "disabled",
        "PYTHONDONTWRITEBYTECODE": "1",
    })
    log = open(tmp / "server.log", "w")
    server = subprocess.Popen([PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                              env=env, cwd=tmp, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while True:
            assert server.poll() is None, f"prefect server exited {server.returncode}:\n{(tmp / 'server.log').read_text()[-4000:]}"
            try:
                if requests.get(f"{url}/api/health", timeout=2).json() is True:
                    break
            except (requests.RequestException, ValueError):
                pass
            assert time.monotonic() < deadline, f"no /api/health in 90 s:\n{(tmp / 'server.log').read_text()[-4000:]}"
            time.sleep(0.5)
        _cli(["work-pool", "create", "local-pool", "--type", "process", "--overwrite"], env)
        out = _cli(["--no-prompt", "deploy", "--all"], env, timeout=180)
        for name in ("train/train", "compare/compare", "sweep/sweep", "evaluate/evaluate"):
            assert name in out, out[-4000:]
        yield Server(url, env, tmp)
    finally:
        _kill_tree(server)
        log.close()


def _work_once(srv: Server, queue: str, run_id: str, log_path: Path, env: dict[str, str] | None = None,
               timeout: float = 150) -> tuple[dict | None, str]:
    """`prefect worker start --run-once` on ``queue`` (``env``: the worker's, which its flow runs
    inherit; default the server's); then the run's final state and the worker's log."""
    log = open(log_path, "w")
    worker = subprocess.Popen([PREFECT, "worker", "start", "--pool", "local-pool", "--work-queue", queue, "--run-once"],
                              env=env or srv.env, cwd=log_path.parent, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    try:
        worker.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    finally:
        _kill_tree(worker)
        log.close()
    state = None
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        state = srv.get(f"/flow_runs/{run_id}")["state"]
        if state["type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
            break
        time.sleep(0.5)
    return state, log_path.read_text()


def _flow_run_log(srv: Server, run_id: str) -> str:
    """What a flow run logged, as the server keeps it (the run's page in the UI)."""
    return "\n".join(r["message"] for r in srv.post("/logs/filter", {"logs": {"flow_run_id": {"any_": [run_id]}}}))


def test_train_deployment_runs_on_a_worker_into_mlflow(deployed, tmp_path):
    srv = deployed
    queue = f"e2e-{uuid.uuid4().hex[:8]}"
    _cli(["work-queue", "create", queue, "--pool", "local-pool"], srv.env)
    dep = srv.get("/deployments/name/train/train")
    assert dep["work_pool_name"] == "local-pool" and dep["entrypoint"] == "flows/train.py:train_flow"
    assert "RAY_AUTH_MODE" not in dep["job_variables"]["env"]  # the flow's Ray uses token auth

    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    params = {"config": "experiments/toy-exgrpo.yaml", "seed": 1, "tracking_uri": uri,
              "overrides": {**TINY, "output_dir": str(tmp_path / "runs")}}
    run = srv.post(f"/deployments/{dep['id']}/create_flow_run", {"parameters": params, "work_queue_name": queue})
    assert run["state"]["type"] == "SCHEDULED"

    t0 = time.monotonic()
    state, worker_log = _work_once(srv, queue, run["id"], tmp_path / "worker.log")
    assert state and state["type"] == "COMPLETED", f"{state}\nworker log:\n{worker_log[-6000:]}"
    print(f"worker: run COMPLETED {time.monotonic() - t0:.1f} s after start")

    fr = srv.get(f"/flow_runs/{run['id']}")
    assert fr["parameters"]["tracking_uri"] == uri and fr["work_queue_name"] == queue

    # the run landed in MLflow (the tmp store given as a deployment parameter)
    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name("toy-exgrpo")
    assert exp is not None, worker_log[-4000:]
    (mrun,) = client.search_runs([exp.experiment_id])
    assert mrun.info.status == "FINISHED"
    assert mrun.data.tags["seed"] == "1" and mrun.data.tags["algo"] == "exgrpo"
    assert mrun.data.params["train.max_steps"] == "8" and mrun.data.params["policy.hidden"] == "32"
    assert len(client.get_metric_history(mrun.info.run_id, "batch/solved")) == 8
    assert "final/val/accuracy" in mrun.data.metrics
    assert [a.path for a in client.list_artifacts(mrun.info.run_id, "checkpoints")]
    assert (tmp_path / "runs").is_dir(), "the run directory follows the output_dir override"

    # and the flow published the MLflow link as a Prefect artifact
    arts = srv.post("/artifacts/filter", {"artifacts": {"flow_run_id": {"any_": [run["id"]]}}})
    assert any(a["type"] == "markdown" and mrun.info.run_id in (a["data"] or "") for a in arts), arts

    # event-driven: the train run's completion made the evaluate deployment run (its prefect.yaml
    # trigger); a worker runs it, and its scores land on the same MLflow run
    ev = srv.get("/deployments/name/evaluate/evaluate")
    triggered, deadline = [], time.monotonic() + 90
    while not triggered and time.monotonic() < deadline:
        triggered = srv.post("/flow_runs/filter", {"flow_runs": {"deployment_id": {"any_": [ev["id"]]}}})
        time.sleep(1)
    assert len(triggered) == 1, f"no evaluate run was triggered; server log:\n{(srv.tmp / 'server.log').read_text()[-4000:]}"
    assert triggered[0]["parameters"]["train_flow_run"] == f"prefect.flow-run.{run['id']}"
    state, eval_log = _work_once(srv, triggered[0]["work_queue_name"], triggered[0]["id"], tmp_path / "worker-eval.log")
    assert state and state["type"] == "COMPLETED", f"{state}\nworker log:\n{eval_log[-6000:]}"
    assert "eval/val/avg_at_1" in client.get_run(mrun.info.run_id).data.metrics
    assert "val/avg_at_1" in _flow_run_log(srv, triggered[0]["id"])  # the flow scored it (the same value is not logged twice)


def test_sweep_deployment_has_two_paused_schedules_with_their_own_parameters(deployed):
    srv = deployed
    spec = {d["name"]: d for d in yaml.safe_load((REPO / "prefect.yaml").read_text())["deployments"]}["sweep"]
    dep = srv.get("/deployments/name/sweep/sweep")
    assert dep["parameters"] == spec["parameters"] == {"config": "experiments/toy-sweep.yaml"}
    assert dep["work_pool_name"] == "local-pool"
    scheds = {s["slug"]: s for s in dep["schedules"]}
    assert set(scheds) == {"nightly-small", "weekly-full"}
    for want in spec["schedules"]:
        got = scheds[want["slug"]]
        assert got["active"] is False  # deployed paused: no study starts by itself
        assert got["schedule"]["cron"] == want["cron"] and got["schedule"]["timezone"] == "UTC"
        assert got["parameters"] == want["parameters"]
    assert scheds["nightly-small"]["parameters"] == {
        "n_trials": 8, "overrides": {"study.name": "toy-sweep-nightly", "budget_steps": 60}}
    assert scheds["weekly-full"]["parameters"] == {"n_trials": 48, "overrides": {"study.name": "toy-sweep-weekly"}}
    scheduled = {"flow_runs": {"deployment_id": {"any_": [dep["id"]]}, "state": {"type": {"any_": ["SCHEDULED"]}}},
                 "limit": 50}
    srv.post(f"/deployments/{dep['id']}/schedule", {})  # what the scheduler does: paused schedules make no runs
    assert srv.post("/flow_runs/filter", scheduled) == []

    # turned on as the UI's toggle does (it sends the schedule's parameters back), each schedule makes
    # runs carrying its own parameters
    for got in scheds.values():
        srv.patch(f"/deployments/{dep['id']}/schedules/{got['id']}",
                  {"active": True, "slug": got["slug"], "parameters": got["parameters"]})
    srv.post(f"/deployments/{dep['id']}/schedule", {})
    want = {8: "toy-sweep-nightly", 48: "toy-sweep-weekly"}
    seen: dict[int, str] = {}
    deadline = time.monotonic() + 45
    while time.monotonic() < deadline and set(seen) != set(want):
        runs = srv.post("/flow_runs/filter", scheduled)
        for r in runs:
            p = r["parameters"]
            assert p["config"] == "experiments/toy-sweep.yaml", p
            seen[p["n_trials"]] = p["overrides"]["study.name"]
        time.sleep(1)
    assert seen == want


def test_a_train_verl_deployment_run_on_a_worker_is_evaluated_by_the_triggered_deployment(deployed, tmp_path,
                                                                                          exgrpo_cache):
    """What a user does in the Prefect UI: run the train-verl deployment. A process worker runs the
    flow, which launches veRL's trainer as a Ray Job that logs its steps live into MLflow; the run's completion triggers the
    evaluate deployment, whose run (on a worker too) scores the veRL checkpoint and logs eval/* on the
    same MLflow run, equal to what veRL's own validation logged at that step (one question of slack,
    as in tests/test_verl_grpo_run.py). Kept last: the train test counts the evaluate runs."""
    srv = deployed
    queue = f"e2e-{uuid.uuid4().hex[:8]}"
    _cli(["work-queue", "create", queue, "--pool", "local-pool"], srv.env)
    env = {**srv.env, "EXGRPO_CACHE": str(exgrpo_cache)}  # the tiny LM's warm start, made once per pytest run
    dep = srv.get("/deployments/name/train/train-verl")
    ev = srv.get("/deployments/name/evaluate/evaluate")
    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    params = {"config": "experiments/verl-tiny-exgrpo.yaml", "tracking_uri": uri,
              "overrides": {"output_dir": str(tmp_path / "runs"), "train.max_steps": 3}}
    run = srv.post(f"/deployments/{dep['id']}/create_flow_run", {"parameters": params, "work_queue_name": queue})
    state, worker_log = _work_once(srv, queue, run["id"], tmp_path / "worker.log", env=env, timeout=600)
    assert state and state["type"] == "COMPLETED", f"{state}\nworker log:\n{worker_log[-6000:]}"

    client = mlflow.MlflowClient(uri)
    (mrun,) = client.search_runs([client.get_experiment_by_name("verl-tiny-exgrpo").experiment_id])
    assert mrun.info.status == "FINISHED" and mrun.data.tags["ray_job_id"]
    assert mrun.data.tags["prefect_flow_run_id"] == run["id"]
    assert mrun.data.tags["checkpoint"].endswith("global_step_3")
    solved = client.get_metric_history(mrun.info.run_id, "batch/solved")
    assert [m.step for m in solved] == [1, 2, 3]
    # live: the job itself logged step 1 before it had saved step 3 (nothing backfilled at the end)
    run_dir = tmp_path / "runs" / "verl-tiny-exgrpo" / "seed0"
    saved = (run_dir / "checkpoints" / "latest_checkpointed_iteration.txt").stat().st_mtime
    assert solved[0].timestamp / 1000 < saved and "live_metrics" not in mrun.data.tags
    assert "Training Progress" in (run_dir / "verl.log").read_text()  # the job's log, streamed to the run directory

    want = f"prefect.flow-run.{run['id']}"
    triggered, deadline = [], time.monotonic() + 90
    while not triggered and time.monotonic() < deadline:
        runs = srv.post("/flow_runs/filter", {"flow_runs": {"deployment_id": {"any_": [ev["id"]]}}, "limit": 50})
        triggered = [r for r in runs if r["parameters"].get("train_flow_run") == want]
        time.sleep(1)
    assert len(triggered) == 1, f"no evaluate run for {want}; server log:\n{(srv.tmp / 'server.log').read_text()[-4000:]}"
    state, eval_log = _work_once(srv, triggered[0]["work_queue_name"], triggered[0]["id"], tmp_path / "worker-eval.log",
                                 env=env, timeout=300)
    assert state and state["type"] == "COMPLETED", f"{state}\nworker log:\n{eval_log[-6000:]}"
    (validated,) = client.get_metric_history(mrun.info.run_id, "val/accuracy")
    assert validated.step == 3
    assert client.get_run(mrun.info.run_id).data.metrics["eval/val/avg_at_1"] == pytest.approx(validated.value,
                                                                                              abs=1 / 64 + 1e-9)
    assert "val/avg_at_1" in _flow_run_log(srv, triggered[0]["id"])


# ------------------------------------------------------------------ the project's Prefect home and a running UI
def test_flows_run_on_the_server_of_a_running_exgrpo_ui(tmp_path, deployed):
    api = deployed.api  # the e2e tier's server, as `exgrpo ui`'s answers
    home = tmp_path / "home"
    announce_server(home, api)
    env = {"PREFECT_HOME": str(home)}
    use_prefect_home(env)
    assert env["PREFECT_API_URL"] == api
    user = {"PREFECT_HOME": str(home), "PREFECT_API_URL": "http://127.0.0.1:1/api"}
    use_prefect_home(user)
    assert user["PREFECT_API_URL"] == "http://127.0.0.1:1/api"  # the user's own server wins
    withdraw_server(home)
    assert not (home / UI_SERVER_FILE).exists()
    env = {"PREFECT_HOME": str(home)}
    use_prefect_home(env)
    assert "PREFECT_API_URL" not in env


def test_a_record_left_by_a_killed_ui_is_ignored(tmp_path, deployed):
    api = deployed.api  # a server that answers: the record is ignored for its dead process alone
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    (tmp_path / UI_SERVER_FILE).write_text(json.dumps({"api_url": api, "pid": proc.pid}))
    env = {"PREFECT_HOME": str(tmp_path)}
    use_prefect_home(env)
    assert "PREFECT_API_URL" not in env

