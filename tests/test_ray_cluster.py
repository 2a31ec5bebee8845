"""Runs on a real multi-node Ray cluster, through the CLI as a user runs them.

The cluster is started on loopback with ``ray start`` (a head and a worker, each with its own temp
dir and ports, token authentication on) and torn down by PID. Records go to an `mlflow server` the
test starts on 127.0.0.1; the sweep's study to PostgreSQL (team mode's server).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import mlflow
import pytest
import yaml

from exgrpo.backends.verl.resources import check, needs
from exgrpo.cluster import (
    EXCLUDES,
    ClusterError,
    NodeResources,
    cluster_address,
    on_cluster,
    require_shared_stores,
    runtime_env,
    without_job_env,
)
from exgrpo.config import ConfigError, load_experiment
from cliutil import WITH_CTRL_C
from mlflowserver import Server
from raycluster import start_cluster

TOY = {"task": {"max_operand": 4}, "policy": {"hidden": 16, "layers": 2}, "algorithm": {"group_size": 4},
       "train": {"batch_size": 8, "max_steps": 4, "threads": 1, "checkpoint_every": 4}}


@pytest.fixture(scope="module")
def cluster():
    """A head (1 CPU) and a worker node (1 CPU) on 127.0.0.1, token auth on."""
    root = Path(tempfile.mkdtemp(prefix="exgrpo-rc-"))  # short: Ray's socket paths must fit 107 characters
    c = start_cluster(root, head_cpus=1)
    try:
        c.add_node(num_cpus=1)
        yield c
    finally:
        c.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def tracking(tmp_path_factory):
    server = Server(tmp_path_factory.mktemp("mlflow"))
    server.start()
    yield server.url
    server.kill()


def _cli(args, env, timeout=600):
    return subprocess.run([sys.executable, "-m", "exgrpo.cli", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def _node_of_tasks(cluster, name):
    """The nodes finished tasks of function ``name`` ran on, from Ray's state API (as the cluster's client)."""
    script = ("import sys, json\nfrom ray.util.state import list_tasks\n"
              "ts = list_tasks(address=sys.argv[1], filters=[('func_or_class_name', '=', sys.argv[2])], detail=True)\n"
              "print(json.dumps(sorted({t.node_id for t in ts if t.state == 'FINISHED'})))\n")
    out = subprocess.run([sys.executable, "-c", script, cluster.dashboard, name], env=cluster.env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_native_compare_and_sweep_run_tasks_on_both_nodes(cluster, tracking, tmp_path):
    cfg = tmp_path / "cmp.yaml"
    cfg.write_text(yaml.safe_dump({"base": {"name": "cluster-cmp", **TOY},
                                   "arms": {"grpo": {"algorithm.replay": "none"}, "exgrpo": {"algorithm.replay": "buckets"}},
                                   "baseline": "grpo", "seeds": [0]}))
    env = {**cluster.env, "RAY_ADDRESS": cluster.address}  # named the way every Ray tool reads it
    out = _cli(["compare", str(cfg), "--tracking-uri", tracking, "--output-dir", str(tmp_path / "runs"),
                "--no-progress"], env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert len(_node_of_tasks(cluster, "tracked_run_one")) == 2, "the two runs should use both nodes"

    client = mlflow.MlflowClient(tracking)
    exp = client.get_experiment_by_name("cluster-cmp")
    runs = client.search_runs([exp.experiment_id])
    (parent,) = [r for r in runs if r.data.tags.get("kind") == "compare"]
    assert parent.data.tags["ray"].startswith(f"Ray cluster at {cluster.address}: 2 nodes")  # where it ran
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(children) == 2 and {r.info.status for r in children} == {"FINISHED"}
    for r in children:  # steps from the workers, the checkpoint as an artifact and on the shared path
        assert [m.step for m in client.get_metric_history(r.info.run_id, "batch/solved")] == [1, 2, 3, 4]
        assert [a.path for a in client.list_artifacts(r.info.run_id, "checkpoints")]
        assert os.path.isfile(r.data.tags["checkpoint"]) and r.data.tags["checkpoint"].startswith(str(tmp_path))

    from test_team_mode import PG_OPTUNA  # skips (or fails, in CI) without PostgreSQL

    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({
        "study": {"name": f"cluster-{os.getpid()}-{time.time_ns()}", "n_trials": 2, "parallel": 2, "pruner": "none"},
        "base": str(cfg.with_name("base.yaml")), "budget_steps": 4,
        "space": {"algorithm.experience_ratio": {"type": "float", "low": 0.1, "high": 0.9}}}))
    cfg.with_name("base.yaml").write_text(yaml.safe_dump({"name": "cluster-sweep", "output_dir": str(tmp_path / "runs"),
                                                          "algorithm": {"replay": "buckets", **TOY["algorithm"]},
                                                          **{k: v for k, v in TOY.items() if k != "algorithm"}}))
    out = _cli(["sweep", str(sweep), "--ray-address", cluster.address, "--tracking-uri", tracking,
                "--storage", PG_OPTUNA, "--no-prefect"], cluster.env)
    assert out.returncode == 0, out.stderr[-3000:]
    summary, _ = json.JSONDecoder().raw_decode(out.stdout[out.stdout.index('{\n  "study"'):])
    assert summary["counts"] == {"COMPLETE": 2, "PRUNED": 0, "FAIL": 0}
    assert len(_node_of_tasks(cluster, "run_trial")) == 2, "the two trials should use both nodes"


def _one_error_line(out) -> str:
    """The command failed with exit code 2 and one ``error:`` line, without a traceback."""
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-3000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    return errors[0]


@pytest.mark.parametrize("command", [["compare", "NAME.yaml"], ["train", "experiments/toy-exgrpo.yaml"],
                                     ["train", "experiments/verl-tiny-grpo.yaml"]])
def test_token_mode_without_the_token_is_one_line_before_any_work(cluster, tracking, tmp_path, command):
    """RAY_AUTH_MODE=token exported and RAY_AUTH_TOKEN unset, as the docs' exports leave a new shell."""
    name = f"cluster-no-token-{command[0]}-{len(str(tmp_path))}-{os.getpid()}"
    if command[0] == "compare":
        command = ["compare", str(tmp_path / "cmp.yaml")]
        Path(command[1]).write_text(yaml.safe_dump({"base": {"name": name, **TOY}, "arms": {"grpo": {"algorithm.replay": "none"}},
                                                    "baseline": "grpo", "seeds": [0]}))
    else:
        command = [*command, "--set", f"name={name}"]
    env = {k: v for k, v in cluster.env.items() if k != "RAY_AUTH_TOKEN"}
    out = _cli([*command, "--ray-address", cluster.address, "--tracking-uri", tracking,
                "--output-dir", str(tmp_path / "runs")], env, timeout=120)  # a hang guard
    error = _one_error_line(out)
    assert cluster.address in error and "RAY_AUTH_TOKEN is not set" in error and "export" in error
    assert mlflow.MlflowClient(tracking).get_experiment_by_name(name) is None, "no run starts without the token"
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("command", [["compare", "experiments/toy.yaml", "--seeds", "1"],
                                     ["train", "experiments/toy-exgrpo.yaml"],
                                     ["train", "experiments/verl-tiny-grpo.yaml"],
                                     ["sweep", "experiments/toy-sweep.yaml", "--storage", "postgresql://u@127.0.0.1:1/x"]])
def test_an_address_that_answers_nothing_fails_in_seconds_with_one_line(tracking, tmp_path, command):
    """With an MLflow server as the store (so no store check refuses first): one line naming the
    address, what was tried and the fix; ray.init alone retried such an address for minutes."""
    from netutil import free_port

    dead = f"127.0.0.1:{free_port()}"
    out = _cli([*command, "--ray-address", dead, "--tracking-uri", tracking,
                *(["--output-dir", str(tmp_path / "runs")] if command[0] != "sweep" else [])],
               {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, timeout=120)  # a hang guard
    error = _one_error_line(out)
    assert f"cannot join the Ray cluster at {dead}: nothing accepts a connection there (TCP connect" in error
    assert "check the address" in error and "ray start --head --port" in error


def test_an_address_of_another_service_fails_with_one_line(tracking, tmp_path):
    """The MLflow server's port: it accepts connections, but no Ray GCS answers there."""
    wrong = tracking.removeprefix("http://")
    out = _cli(["compare", "experiments/toy.yaml", "--seeds", "1", "--ray-address", wrong, "--tracking-uri",
                tracking, "--output-dir", str(tmp_path / "runs")],
               {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, timeout=120)  # a hang guard
    error = _one_error_line(out)
    assert f"cannot join the Ray cluster at {wrong}: it accepts connections but no Ray GCS" in error
    assert "not its dashboard, client or another service's port" in error


def test_doctor_with_a_dead_cluster_address_answers(tmp_path):
    from netutil import free_port

    dead = f"127.0.0.1:{free_port()}"
    out = _cli(["doctor", "experiments/verl-tiny-grpo.yaml", "--set", f"backend.verl.ray_address={dead}",
                "--tracking-uri", f"sqlite:///{tmp_path}/m.db"], dict(os.environ), timeout=120)  # a hang guard
    assert out.returncode == 1, out.stdout + out.stderr[-2000:]
    assert f"PROBLEM cannot join the Ray cluster at {dead}: nothing accepts a connection" in out.stdout
    assert "MLflow:" in out.stdout  # the checks after it still ran


def test_doctor_stops_on_ctrl_c_while_a_cluster_keeps_it_waiting(tmp_path):
    """A port that accepts connections and never answers: Ctrl-C ends the doctor at once."""
    import signal
    import socket

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        # the GCS wait outlasts the test: with its 5 s default, a loaded machine sent the signal after the
        # doctor had given up on the port and ended on its own (exit 1, nothing on stderr)
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("RAY_")}, "EXGRPO_RAY_GCS_SECONDS": "600"}
        proc = subprocess.Popen([sys.executable, "-c", WITH_CTRL_C, "doctor", "experiments/verl-tiny-grpo.yaml",
                                 "--set", f"backend.verl.ray_address={address}", "--set",
                                 f"backend.verl.python={tmp_path}/no-python"], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        held = []
        try:
            lines = [proc.stdout.readline() for _ in range(2)]  # the version, the job environment's problem
            assert "no interpreter" in lines[1], lines
            # into the cluster check: its TCP probe connects, then it waits for Ray's GCS to answer
            silent.settimeout(120)  # a hang guard
            held.append(silent.accept()[0])
            assert proc.poll() is None, "the doctor should still be waiting on the silent port"
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=30)  # a hang guard
        finally:
            proc.kill()
            proc.wait()
            for conn in held:
                conn.close()
        assert proc.returncode == 130, proc.stderr.read()[-2000:]


DOCTOR_SIGTERM_IN_INIT = (
    "import os, signal, sys, time\n"
    "import ray._private.worker as worker\n"
    "import exgrpo.cli\n"
    "connect = worker.connect\n"
    "def signalled_connect(*args, **kwargs):\n"  # inside the doctor's ray.init for sure
    "    os.kill(os.getpid(), signal.SIGTERM)\n"
    "    time.sleep(1)\n"  # a handler in place runs within this
    "    return connect(*args, **kwargs)\n"
    "worker.connect = signalled_connect\n"
    "sys.exit(exgrpo.cli.main(sys.argv[1:]))\n"
)


def test_doctor_ends_as_terminated_on_a_sigterm_while_it_joins_the_cluster(cluster, tmp_path):
    """Its ``ray.init`` put in Ray's handler (``sys.exit``): a SIGTERM while it joined ended it with
    status 15 and no word."""
    out = subprocess.run([sys.executable, "-c", DOCTOR_SIGTERM_IN_INIT, "doctor", "experiments/verl-tiny-grpo.yaml",
                          "--set", f"backend.verl.ray_address={cluster.address}", "--tracking-uri",
                          f"sqlite:///{tmp_path}/m.db"], env=cluster.env, capture_output=True, text=True,
                         timeout=300)  # a hang guard
    # the command's handler ended it, as a SIGTERM ends every command (not as Ctrl-C)
    assert out.returncode == 143, (out.returncode, out.stdout[-2000:], out.stderr[-2000:])
    assert out.stderr.splitlines()[-1:] == ["terminated"], out.stderr[-2000:]


def test_a_cluster_too_small_for_verl_fails_in_seconds_with_one_line(cluster, tracking, tmp_path):
    # two workers per node need a node with 6 CPUs and 2 GPUs: neither node has them
    out = _cli(["train", "experiments/verl-tiny-grpo.yaml", "--ray-address", cluster.address, "--tracking-uri",
                tracking, "--output-dir", str(tmp_path / "runs"), "--set", "backend.verl.workers_per_node=2",
                "--no-progress"], cluster.env, timeout=120)  # a hang guard: it fails in seconds when idle
    assert out.returncode == 1
    (error,) = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert "can never run this veRL job" in error and "6 CPUs and 2 logical GPUs" in error, out.stderr[-2000:]
    assert f"ray start --address={cluster.address} --num-cpus=8 --num-gpus=2" in error
    client = mlflow.MlflowClient(tracking)
    (run,) = client.search_runs([client.get_experiment_by_name("verl-tiny-grpo").experiment_id],
                                filter_string="attributes.status = 'FAILED'")
    assert "can never run" in run.data.tags["error"]
    # the preflight says the same before a run
    out = _cli(["doctor", "experiments/verl-tiny-grpo.yaml", "--set", "backend.verl.workers_per_node=2",
                "--tracking-uri", tracking], {**cluster.env, "RAY_ADDRESS": cluster.address}, timeout=120)
    assert out.returncode == 1 and f"Ray cluster at {cluster.address}: 2 nodes" in out.stdout, out.stdout
    assert "can never run this veRL job" in out.stdout
    # a cluster from `ray start` without RAY_enable_metrics_collection=false serves its metrics to anyone
    assert "WARNING Ray cluster: node " in out.stdout and "serves Prometheus metrics without a token" in out.stdout


@pytest.fixture(scope="module")
def verl_node(cluster):
    """A third node with the CPUs and logical GPU one veRL worker needs (resources.needs)."""
    cluster.add_node(num_cpus=5, num_gpus=1)
    return cluster


def test_a_verl_run_submitted_as_a_ray_job_reports_live_to_mlflow(verl_node, tracking, tmp_path):
    """A run launched as a Ray Job; a run launched as a process of its own is the comparison's, below."""
    cluster = verl_node
    out = _cli(["train", "experiments/verl-tiny-grpo.yaml", "--ray-address", cluster.address, "--tracking-uri",
                tracking, "--output-dir", str(tmp_path / "runs"), "--max-steps", "2", "--no-progress",
                "--set", "backend.verl.launch=ray_job", "--set", f"backend.verl.job_address={cluster.dashboard}"],
               cluster.env, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    record, _ = json.JSONDecoder().raw_decode(out.stdout[out.stdout.rindex('{\n  "run_dir"'):])
    log = Path(record["run_dir"], "verl.log").read_text()  # the job's own output (echoed only with progress)
    assert f"exgrpo: veRL job on Ray cluster at {cluster.address}: 3 nodes" in log
    client = mlflow.MlflowClient(tracking)
    run = client.get_run(record["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "batch/solved")] == [1, 2]
    assert "ray_job_id" in run.data.tags


def test_a_verl_comparison_starts_its_runs_as_the_cluster_hosts_them_whole(verl_node, tracking, tmp_path):
    """Started at once, two veRL runs' launchers and TaskRunners took the CPUs each run's workers and
    reward worker needed, and neither could ever start: here they run one after the other, each
    launched as a process of its own on the cluster and reporting live to MLflow."""
    cluster = verl_node
    out = _cli(["compare", "experiments/verl-tiny.yaml", "--seeds", "1", "--ray-address", cluster.address,
                "--tracking-uri", tracking, "--output-dir", str(tmp_path / "runs"), "--no-progress",
                "--set", "train.max_steps=2", "--set", "name=verl-cluster-cmp"], cluster.env, timeout=1500)  # a hang guard
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    # nodes of 1, 1 and 5 CPUs (1 GPU): one run's workers take the GPU node, so the other run waits, and
    # the comparison says so once (through the flow's log, on stderr)
    said = out.stdout + out.stderr
    assert said.count("waits until a running veRL run of this batch ends") == 1, said[-3000:]
    client = mlflow.MlflowClient(tracking)
    runs = client.search_runs([client.get_experiment_by_name("verl-cluster-cmp").experiment_id])
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert sorted(r.data.tags.get("arm") for r in children) == ["exgrpo", "grpo"]
    assert {r.info.status for r in children} == {"FINISHED"}
    first, second = sorted(children, key=lambda r: r.info.start_time)
    assert first.info.end_time <= second.info.start_time, (first.info, second.info)  # one after the other
    for run in children:
        assert [m.step for m in client.get_metric_history(run.info.run_id, "batch/solved")] == [1, 2]
        assert "ray_job_id" not in run.data.tags  # the default launch: a process, not a Ray Job
    logs = sorted((tmp_path / "runs").rglob("verl.log"))  # each job's own output
    assert len(logs) == 2 and all(f"exgrpo: veRL job on Ray cluster at {cluster.address}: 3 nodes" in p.read_text()
                                  for p in logs)


# ---------------------------------------------------------------------------------------------
# the parts, without a cluster
# ---------------------------------------------------------------------------------------------
def test_token_mode_without_a_token_and_malformed_addresses_are_named(tmp_path, monkeypatch):
    from exgrpo.cluster import split_address, token_problem

    monkeypatch.setattr("exgrpo.cluster.TOKEN_FILE", tmp_path / "auth_token")
    assert token_problem("h:1", {}) is None and token_problem("h:1", {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "t"}) is None
    assert "RAY_AUTH_TOKEN is not set" in token_problem("h:1", {"RAY_AUTH_MODE": "token"})
    assert "is no file" in token_problem("h:1", {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(tmp_path / "x")})
    (tmp_path / "auth_token").write_text("t")
    assert token_problem("h:1", {"RAY_AUTH_MODE": "token"}) is None  # Ray's default token file
    assert split_address("10.0.0.5:6379") == ("10.0.0.5", 6379) and split_address("ray://h:10001") == ("h", 10001)
    assert split_address("[::1]:6379") == ("::1", 6379)
    with pytest.raises(ClusterError, match="--ray-address=h6379: give the head's GCS address as <host>:<port>"):
        split_address("h6379")


def test_a_failed_verl_job_quotes_its_error_line_whole():
    from exgrpo.backends.verl.prepared import last_error

    line = ("ray.exceptions.AuthenticationError: Token authentication is enabled but no authentication token was "
            "found. Ensure that the token for the cluster is available in a local file (e.g., ~/.ray/auth_token or "
            "via RAY_AUTH_TOKEN_PATH) or as the `RAY_AUTH_TOKEN` environment variable. To generate a token for local "
            "development, use `ray get-auth-token --generate`")
    assert last_error(["starting", line, "  done"]) == line + "; "
    long = last_error(["ValueError: " + "word " * 400])
    assert long.startswith("ValueError: word") and long.endswith("word ...; ") and len(long) <= 1002


def test_verl_runs_of_a_comparison_start_only_as_the_cluster_hosts_them_whole():
    from exgrpo.backends.verl.resources import plan_slots, waiting_note

    v = load_experiment("experiments/verl-tiny-grpo.yaml").backend.verl
    # the two-node loopback cluster where two runs started at once took 4 CPUs for their launchers and
    # TaskRunners and neither run's 3-CPU + 1-GPU bundle fitted: one run at a time, its launcher on the worker
    head, worker = NodeResources(4, 1), NodeResources(2, 0)
    assert plan_slots(v, [head, worker]) == [1]
    assert plan_slots(v, [NodeResources(6, 1), NodeResources(6, 1)]) == [0, 1]
    assert plan_slots(v, [NodeResources(5, 1), NodeResources(5, 1)]) == [0]  # 6 CPUs a run: 12 > 10
    assert plan_slots(v, [NodeResources(4, 1), NodeResources(1, 0)]) == []  # no room for a launcher beside
    note = waiting_note(v, [head, worker], 1, 2)
    assert "hosts 1 of these 2 veRL runs at a time" in note and "4 CPU/1 GPU, 2 CPU/0 GPU" in note


def test_the_address_comes_from_the_flag_else_ray_address(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert cluster_address(None) is None and cluster_address("10.0.0.5:6379") == "10.0.0.5:6379"
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.9:6379")
    assert cluster_address(None) == "10.0.0.9:6379" and cluster_address("h:1") == "h:1"
    monkeypatch.setenv("RAY_ADDRESS", "local")
    assert cluster_address(None) is None


def test_a_local_store_with_a_cluster_is_one_line_before_any_work(tmp_path, capsys):
    from exgrpo import cli

    with pytest.raises(ConfigError, match="cannot reach a local MLflow store"):
        require_shared_stores("10.0.0.5:6379", f"sqlite:///{tmp_path}/m.db")
    with pytest.raises(ConfigError, match="cannot reach a local sqlite study"):
        require_shared_stores("10.0.0.5:6379", "http://10.0.0.5:5000", f"sqlite:///{tmp_path}/o.db")
    require_shared_stores(None, f"sqlite:///{tmp_path}/m.db")
    require_shared_stores("10.0.0.5:6379", "http://10.0.0.5:5000", "postgresql://u@h/optuna")
    code = cli.main(["compare", "experiments/toy.yaml", "--ray-address", "10.0.0.5:6379", "--tracking-uri",
                     f"sqlite:///{tmp_path}/m.db", "--output-dir", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--tracking-uri" in err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "m.db").exists()


def test_the_code_travels_without_runs_stores_or_environments():
    env = runtime_env({"A": "1"})
    assert os.path.isfile(os.path.join(env["working_dir"], "exgrpo", "cluster.py"))
    for excluded in ("runs/", "mlruns/", ".venv*/", "studies/"):
        assert excluded in EXCLUDES
    assert env["env_vars"] == {"A": "1"}


def test_inside_a_ray_job_the_driver_repeats_none_of_the_jobs_runtime_env(monkeypatch):
    env = {"working_dir": "/code", "excludes": ["runs/"], "env_vars": {"A": "1", "B": "2"}, "py_executable": None}
    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR", raising=False)
    assert without_job_env(env) == env
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR",
                       json.dumps({"runtime_env": {"working_dir": "gcs://pkg.zip", "env_vars": {"A": "1"}}}))
    assert without_job_env(env) == {"env_vars": {"B": "2"}, "py_executable": None}


def test_verl_needs_and_the_cluster_check():
    cfg = load_experiment("experiments/verl-tiny-grpo.yaml")
    v = cfg.backend.verl
    need = needs(v)
    assert (need.nodes, need.cpus_per_node, need.gpus_per_node, need.total_cpus) == (1, 3, 1, 5)
    check(v, [NodeResources(1, 0), NodeResources(5, 1)], "h:1")  # fits
    with pytest.raises(ClusterError, match=r"its nodes have: 2 CPU/0 GPU, 4 CPU/0 GPU\. .*--num-gpus=1"):
        check(v, [NodeResources(2, 0), NodeResources(4, 0)], "h:1")
    with pytest.raises(ClusterError, match="5 CPUs in all"):  # the bundle fits, the TaskRunner and reward do not
        check(v, [NodeResources(3, 1)], "h:1")
    assert on_cluster(cfg, "h:1").backend.verl.ray_address == "h:1"
    pinned = load_experiment("experiments/verl-tiny-grpo.yaml", {"backend.verl.ray_address": "other:2"})
    assert on_cluster(pinned, "h:1").backend.verl.ray_address == "other:2"
    native = load_experiment("experiments/toy-exgrpo.yaml")
    assert on_cluster(native, "h:1") is native


def test_a_raylets_report_of_workers_killed_for_memory_is_fatal():
    from exgrpo.backends.verl.prepared import fatal_line

    report = ("\x1b[33m(raylet)\x1b[0m [2026-12-06 16:39:16,558 E 20601 20601] (raylet) node_manager.cc:3517: 4 Workers "
              "(tasks / actors) killed due to memory pressure (OOM), 0 Workers crashed due to other reasons at node "
              "(ID: 3fcee515, IP: 127.0.0.1) over the last time period.")
    assert fatal_line(report).startswith("out of memory: Ray's memory monitor killed 4 of its workers")
    assert fatal_line(report.replace(" 4 Workers", " 0 Workers")) is None  # only crashes for other reasons
    assert fatal_line("(WorkerDict pid=1) step 3: saved the checkpoint") is None
