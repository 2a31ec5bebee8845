"""Stopping a veRL `exgrpo train` while it trains: SIGTERM (a scheduler, `kill`) and Ctrl-C (SIGINT to
the terminal's process group) end it alike: the job and the private Ray it started stop, the MLflow run
ends KILLED, and the command ends in one line."""

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from cliutil import WITH_CTRL_C
from verlutil import GRPO, _env


def _ray_dir(run_dir):
    """The temp dir of the run's private Ray (every Ray process it starts names it on its command line)."""
    spec = json.loads((run_dir / "verl_run.json").read_text())
    return next(o.split("=", 1)[1] for o in spec["overrides"] if "ray_init._temp_dir=" in o)


def _of_the_run(ray_dir):
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(ray_dir in part for part in p.info["cmdline"] or []) and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


@pytest.mark.parametrize("how", ["sigterm", "ctrl-c"])
def test_a_stopped_verl_run_ends_killed_and_leaves_no_process(how, tmp_path, exgrpo_cache):
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cmd = [sys.executable, "-c", WITH_CTRL_C, "train", GRPO, "--no-progress", "--output-dir", str(tmp_path / "runs"),
           "--tracking-uri", uri, "--set=train.max_steps=40"]  # far more steps than the test waits for
    proc = subprocess.Popen(cmd, env=_env(exgrpo_cache), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    run_dir = tmp_path / "runs" / "verl-tiny-grpo" / "seed0"
    steps = run_dir / "verl_metrics" / "attempt_000.jsonl"
    try:
        deadline = time.monotonic() + 900  # a hang guard
        while proc.poll() is None and time.monotonic() < deadline and not (steps.is_file() and steps.read_text()):
            time.sleep(0.5)
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert steps.is_file() and steps.read_text(), "no step within the hang guard"
        started = psutil.Process(proc.pid).children(recursive=True)
        ray_dir = _ray_dir(run_dir)
        started += [p for p in _of_the_run(ray_dir) if p not in started]
        assert len(started) >= 3  # the job and its Ray's GCS and raylet at least
        if how == "sigterm":
            proc.send_signal(signal.SIGTERM)  # to the command alone, as `kill` or a scheduler sends it
        else:
            os.killpg(proc.pid, signal.SIGINT)  # to the whole foreground group, as a terminal's Ctrl-C
        out, err = proc.communicate(timeout=180)  # a hang guard
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == (143 if how == "sigterm" else 130), err[-3000:]
    assert err.strip().splitlines()[-1] == ("terminated" if how == "sigterm" else "interrupted"), err[-3000:]
    assert "Traceback" not in err and "Exception in thread" not in err, err[-3000:]

    _, alive = psutil.wait_procs(started, timeout=60)  # gone, with whatever Ray started since (the ray_dir's)
    alive += [p for p in _of_the_run(ray_dir) if p not in alive]
    for p in alive:  # not left to the next test
        p.kill()
    assert not alive, [" ".join(p.cmdline()) for p in alive if p.is_running()]

    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("verl-tiny-grpo").experiment_id])
    assert run.info.status == "KILLED"
    assert "error" not in run.data.tags



_DEAD_ACTOR_DRIVER = (
    "import time, ray\n"
    "from exgrpo.raylocal import init_local_ray\n"
    "init_local_ray(1)\n"
    "@ray.remote\n"
    "class Server:\n"
    "    def serve(self):\n"
    "        time.sleep(3600)\n"
    "server = Server.remote()\n"
    "server.serve.remote()\n"
    "print('serving', flush=True)\n"
    "while True:\n"  # as veRL's agent loop awaits its rollout servers' replies: it never learns they died
    "    time.sleep(1)\n"
)


def test_a_job_whose_workers_ray_kills_for_memory_is_stopped_on_the_raylets_report(tmp_path, monkeypatch):
    """Ray's memory monitor kills the workers of a job's actors, which veRL never restarts, while its
    driver waits on them (seen: a vLLM rollout's workers killed after a checkpoint, the run ended by
    the stall bound 30 minutes later). The runner stops the job on the raylet's report and fails it,
    naming the kill. A real private Ray whose memory monitor's threshold is under what any machine
    uses, so that it kills the actor's worker; a driver that, like veRL's, waits without asking."""
    from exgrpo.backends.verl.prepared import PreparedRun, VerlRunError
    from exgrpo.backends.verl.runner import run_local

    monkeypatch.setenv("RAY_memory_usage_threshold", "0.01")  # read by the raylet the driver's private Ray starts
    prepared = PreparedRun(run_dir=tmp_path, command=[sys.executable, "-c", _DEAD_ACTOR_DRIVER], env={})
    with pytest.raises(VerlRunError) as failed:
        run_local(prepared, progress=False, stall_seconds=300)  # the hang guard: the stall bound
    reason = str(failed.value).splitlines()[0]
    assert reason.startswith("veRL run out of memory: Ray's memory monitor killed 1 of its workers"), reason
    assert "RAY_memory_usage_threshold" in reason
