"""The embedded default always starts its own local Ray."""

import os
import subprocess
import sys
from pathlib import Path

STALE = Path("/tmp/ray/ray_current_cluster")


def test_dead_ray_cluster_file_does_not_break_local_runs():
    """A `ray start --head` cluster that died without `ray stop` leaves ray_current_cluster behind;
    before the fix every sweep/compare then failed ("When connecting to an existing cluster, num_cpus
    and num_gpus must not be provided")."""
    code = (
        "import ray\n"
        "from exgrpo.cluster import ensure_ray\n"
        "ensure_ray()\n"
        "print(ray.get(ray.remote(lambda: 41 + 1).remote()))\n"
        "ray.shutdown()\n"
    )
    saved = STALE.read_text() if STALE.exists() else None
    STALE.parent.mkdir(parents=True, exist_ok=True)
    STALE.write_text("127.0.0.1:9")  # a GCS address nobody listens on: the dead cluster
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    finally:
        if saved is None:
            STALE.unlink(missing_ok=True)
        else:
            STALE.write_text(saved)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["42"]


_DRIVER = (
    "import os, sys, ray\n"
    "from exgrpo.cluster import ensure_ray\n"
    "ensure_ray()\n"
    "print(ray.get_runtime_context().gcs_address, os.environ['RAY_AUTH_TOKEN'], flush=True)\n"
    "sys.stdin.read()\n"  # stay up until the test closes stdin
    "ray.shutdown()\n"
)
_CLIENT = (
    "import sys, ray\n"
    "try:\n"
    "    ray.init(address=sys.argv[1])\n"
    "    print('JOINED', ray.get(ray.remote(lambda: 41 + 1).remote()))\n"
    "except Exception as e:\n"
    "    print('REFUSED', type(e).__name__, str(e)[:200].replace(chr(10), ' '))\n"
)


def _clients(address: str, *envs: dict[str, str]) -> list[str]:
    """The last line each client printed, one client per environment in ``envs``, all at once (a refused
    client waits on its connection for tens of seconds, idle)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    procs = [subprocess.Popen([sys.executable, "-c", _CLIENT, address], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env={**base, **env}) for env in envs]
    lines = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        lines.append((out.strip().splitlines() or [f"no output: {err[-1500:]}"])[-1])
    return lines


def test_local_ray_refuses_clients_without_its_token():
    """Before the fix the local Ray ran with RAY_AUTH_MODE=disabled: anyone who reached its ports could
    join it and run code as the user. Now it uses token authentication with a per-process token."""
    driver = subprocess.Popen([sys.executable, "-c", _DRIVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env={k: v for k, v in os.environ.items()
                                                                      if not k.startswith("RAY_AUTH")})
    try:
        line = driver.stdout.readline().split()
        assert len(line) == 2, driver.stderr.read()[-2000:] if driver.poll() is not None else line
        gcs, token = line
        port = gcs.rsplit(":", 1)[1]
        address = f"127.0.0.1:{port}"
        no_token, wrong_token, right_token = _clients(address, {"RAY_AUTH_MODE": "disabled"},
                                                      {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 64},
                                                      {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token})
        assert no_token.startswith("REFUSED") and wrong_token.startswith("REFUSED"), (no_token, wrong_token)
        # the control: the same client with the driver's token joins (so the refusals above are auth)
        assert right_token == "JOINED 42"
    finally:
        driver.stdin.close()
        try:
            driver.wait(timeout=60)
        except subprocess.TimeoutExpired:
            driver.kill()


def test_disabled_ray_auth_is_refused_with_a_one_line_error(monkeypatch):
    import pytest

    from exgrpo.raylocal import enable_token_auth

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    with pytest.raises(RuntimeError, match="RAY_AUTH_MODE=disabled .* unset it"):
        enable_token_auth()


def _python(code: str) -> str:
    """What ``code`` printed, run in an interpreter of its own (its Ray is the only one it sees); it must succeed."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_the_private_local_ray_exports_no_prometheus_metrics():
    """Ray's metrics agent would serve, on every interface and without a token, the session name,
    driver PIDs, the node address and task names; the private local Ray runs without it (the same Ray
    started without LOCAL_SYSTEM_CONFIG serves /metrics on its metrics export port)."""
    code = (
        "import ray, requests\n"
        "from exgrpo.cluster import ensure_ray\n"
        "ensure_ray()\n"
        "ray.get(ray.remote(lambda: 1).remote())\n"
        "port = ray._private.worker.global_worker.node.metrics_export_port\n"
        "try:\n"
        "    served = requests.get(f'http://127.0.0.1:{port}/metrics', timeout=3).ok if port > 0 else False\n"
        "except requests.RequestException:\n"
        "    served = False\n"
        "print('SERVED' if served else 'NOT SERVED', port)\n"
        "ray.shutdown()\n"
    )
    out = _python(code)
    assert out.split()[:2] == ["NOT", "SERVED"], out


def test_a_verl_jobs_private_ray_starts_no_idle_workers():
    """Ray starts a worker per CPU ahead of work; veRL's actors each carry a runtime environment of their
    own and never run in them, so the job's private Ray (JOB_RAY_SYSTEM_CONFIG) starts none: on 4 CPUs
    no ``ray::IDLE`` process is up seconds after it started (Ray's default started 4)."""
    code = (
        "import time, psutil, ray\n"
        "from exgrpo.backends.verl.main import JOB_RAY_SYSTEM_CONFIG\n"
        "ray.init(num_cpus=4, include_dashboard=False, _system_config=JOB_RAY_SYSTEM_CONFIG)\n"
        "time.sleep(8)\n"
        "(raylet,) = ray._private.worker.global_worker.node.all_processes['raylet']\n"
        "workers = [' '.join(p.cmdline()) for p in psutil.Process(raylet.process.pid).children(recursive=True)]\n"
        "print('IDLE', sum(w.startswith('ray::IDLE') for w in workers))\n"
        "ray.shutdown()\n"
    )
    out = _python(code)
    assert "IDLE 0" in out.splitlines(), out


def test_a_job_server_beside_another_private_ray_accepts_jobs():
    """Two private Rays on one host (a sweep's, and a Prefect worker's job server for a veRL Ray Job):
    both agents asked for port 52365, the second's HTTP server failed, and every job submitted to it
    was refused with "No available agent to submit job" (seen with agent_port_any removed)."""
    other = subprocess.Popen([sys.executable, "-c", "import sys\nfrom exgrpo.cluster import ensure_ray\n"
                              "ensure_ray()\nprint('UP', flush=True)\nsys.stdin.read()\n"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline().strip() == "UP"
        code = ("import time\nfrom ray.job_submission import JobSubmissionClient\n"
                "from exgrpo.backends.verl.jobs import local_job_server\n"
                "client = JobSubmissionClient(local_job_server())\n"
                "deadline = time.monotonic() + 40\n"
                "while True:\n"
                "    try:\n"
                "        print('SUBMITTED', client.submit_job(entrypoint='echo hi'))\n"
                "        break\n"
                "    except RuntimeError as e:\n"
                "        if time.monotonic() > deadline:\n"
                "            print('REFUSED', str(e)[:120])\n"
                "            break\n"
                "        time.sleep(2)\n")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
        assert out.stdout.split()[:1] == ["SUBMITTED"], out.stdout + out.stderr[-2000:]
    finally:
        other.stdin.close()
        other.wait(timeout=60)


def test_the_scheduling_loop_keeps_its_limit_and_its_slots_and_outlives_a_failed_job():
    """exgrpo.slots.run_as_slots_free, the loop of comparisons and sweeps, on a real local Ray: jobs
    read lazily, at most ``limit`` at once, each slot's options given to its job, a failed job
    reported and the others run."""
    import time

    import ray

    from exgrpo.cluster import ensure_ray
    from exgrpo.slots import run_as_slots_free

    ensure_ray()

    @ray.remote(num_cpus=0)
    def work(job: int, slot: str) -> tuple[int, str, float, float]:
        t0 = time.time()
        time.sleep(0.3)
        if job == 2:
            raise ValueError("job 2 fails")
        return job, slot, t0, time.time()

    asked, ended = [], []

    def jobs():
        for j in range(5):
            asked.append(j)
            yield j

    def launch(job, options):
        assert len(asked) - len(ended) <= 2  # the next job is read only when a slot is free
        return work.remote(job, options["slot"])

    run_as_slots_free(jobs(), launch, lambda job, out, err: ended.append((job, out, err)),
                      slots=[{"slot": "a"}, {"slot": "b"}], limit=2)
    assert sorted(j for j, *_ in ended) == [0, 1, 2, 3, 4]
    (failed,) = [(j, e) for j, _, e in ended if e is not None]
    assert failed[0] == 2 and "job 2 fails" in str(failed[1])
    spans = sorted((out[2], out[3]) for _, out, err in ended if err is None)
    for t, (start, _) in enumerate(spans):  # never three at once
        assert sum(s <= start < e for s, e in spans[:t]) <= 1
    assert {out[1] for _, out, err in ended if err is None} == {"a", "b"}
    ray.shutdown()


def test_a_stop_in_the_scheduling_loop_ends_the_jobs_it_started(tmp_path, monkeypatch):
    """A stop (KeyboardInterrupt, as the CLI's SIGTERM handler raises) while jobs run: the loop ends them
    before the stop reaches its caller, which then marks their runs KILLED; on a cluster that outlives the
    caller, a job left running would train on and record its end into a run already ended. A job is
    interrupted first, so that its own handlers can run (a Ray Job it submitted is stopped there), and
    killed once the grace has passed."""
    import time

    import pytest
    import ray

    from exgrpo import slots
    from exgrpo.cluster import ensure_ray
    from exgrpo.slots import run_as_slots_free

    monkeypatch.setattr(slots, "CANCEL_GRACE_SECONDS", 3.0)
    ensure_ray()
    try:
        @ray.remote(num_cpus=0)
        def work(job: int, out: str) -> int:
            open(f"{out}/started-{job}", "w").close()
            time.sleep(20)
            open(f"{out}/done-{job}", "w").close()
            return job

        def poll():  # the stop, once both jobs run
            if len(list(tmp_path.glob("started-*"))) == 2:
                raise KeyboardInterrupt

        refs = []

        def launch(job, options):
            refs.append(work.remote(job, str(tmp_path)))
            return refs[-1]

        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            run_as_slots_free(range(2), launch, lambda *a: None, limit=2, poll=poll)
        assert time.monotonic() - started < 18  # ended, not waited for
        for ref in refs:
            with pytest.raises((ray.exceptions.TaskCancelledError, ray.exceptions.WorkerCrashedError)):
                ray.get(ref, timeout=30)
        time.sleep(max(0.0, 22 - (time.monotonic() - started)))  # past the jobs' end, had they run on
        assert not list(tmp_path.glob("done-*"))
    finally:
        ray.shutdown()


def test_verl_runs_start_by_their_own_size_from_what_ray_reports_free(capsys):
    """The veRL slot plan on a real local Ray of 12 CPUs and 2 (logical) GPUs, one node. Each tiny
    veRL run takes 6 CPUs and 1 GPU (3 + 1 for its worker, 2 for its launcher and TaskRunner, 1 for
    the reward and agent-loop workers); with 2 workers it takes 9 CPUs and 2 GPUs.
    - An arm that no state of the cluster holds (3 workers: 3 GPUs) is refused in one line, before
      any run starts, whichever arm comes first.
    - Other work holding 7 CPUs: no run starts until it ends (planned from the nodes' totals, a run
      started into 5 free CPUs and waited there holding its launcher's).
    - Arms of different sizes: the 2-worker arm waits for the 1-worker run to end (planned from the
      first arm's size, both started at once, 15 CPUs and 3 GPUs on a node of 12 and 2)."""
    import time

    import pytest
    import ray

    from exgrpo.cluster import ClusterError
    from exgrpo.config import load_experiment
    from exgrpo.slots import launch_slots, run_as_slots_free
    from exgrpo.raylocal import init_local_ray

    init_local_ray(12, num_gpus=2, include_dashboard=False)
    try:
        address = ray.get_runtime_context().gcs_address

        def cfg(workers: int, seed: int = 0):
            return load_experiment("experiments/verl-tiny-grpo.yaml", {
                "backend.verl.ray_address": address, "backend.verl.workers_per_node": workers, "seed": seed,
                "backend.verl.micro_batch_size_per_worker": 1})  # divides any worker's share of a mini-batch

        with pytest.raises(ClusterError, match=r"can never run this veRL job: .*workers_per_node=3") as e:
            launch_slots([cfg(1), cfg(3)], address)
        assert "\n" not in str(e.value)

        events: list[str] = []

        @ray.remote(num_cpus=0)
        def run(name: str) -> str:
            time.sleep(0.5)
            return name

        def launch(job, options):
            events.append(f"start {job[1]}")
            assert options["scheduling_strategy"].node_id == ray.get_runtime_context().get_node_id()
            return run.options(**options).remote(job[1])

        def ended(job, out, err):
            assert err is None and out == job[1]
            events.append(f"end {job[1]}")

        # a cluster shared with other work: 7 of its 12 CPUs held until the third poll
        @ray.remote(num_cpus=7)
        class Other:
            def ready(self) -> bool:
                return True

        other = Other.remote()
        ray.get(other.ready.remote())
        polls = []

        def poll():
            polls.append(1)
            if len(polls) == 3:
                events.append("other work ends")
                ray.kill(other)

        jobs = [(cfg(1), "a"), (cfg(1, seed=1), "b")]
        slots = launch_slots([c for c, _ in jobs], address, config_of=lambda job: job[0])
        run_as_slots_free(jobs, launch, ended, slots=slots, poll=poll)
        assert events[0] == "other work ends" and sorted(events[1:]) == ["end a", "end b", "start a", "start b"]
        said = capsys.readouterr().out
        assert said.count("note: ") == 1 and "run verl-tiny-grpo seed 0 waits until other work on the cluster" in said

        # arms of different sizes: the larger one waits for the smaller one's end
        events.clear()
        jobs = [(cfg(1), "small"), (cfg(2), "large")]
        run_as_slots_free(jobs, launch, ended, slots=launch_slots([c for c, _ in jobs], address,
                                                                  config_of=lambda job: job[0]))
        assert events == ["start small", "end small", "start large", "end large"]
        said = capsys.readouterr().out
        assert said.count("note: ") == 1 and "waits until a running veRL run of this batch ends" in said
        assert "it needs 1 node(s) with 6 CPUs and 2 GPUs" in said and "free now: 6 CPU/1 GPU" in said
    finally:
        ray.shutdown()


SIGTERM_IN_INIT = (
    "import os, signal, sys, time\n"
    "import ray, ray._private.worker as worker\n"
    "from exgrpo.raylocal import init_local_ray\n"
    "class Stop(Exception): pass\n"
    "def ours(signum, frame): raise Stop()\n"
    "signal.signal(signal.SIGTERM, ours)\n"
    "connect = worker.connect\n"
    "def signalled_connect(*args, **kwargs):\n"  # inside ray.init for sure: its node is up, its driver not yet
    "    os.kill(os.getpid(), signal.SIGTERM)\n"
    "    time.sleep(1)\n"  # a handler in place runs within this
    "    if sys.argv[1:] == ['fail']:\n"
    "        raise ConnectionError('the driver cannot connect')\n"
    "    return connect(*args, **kwargs)\n"
    "worker.connect = signalled_connect\n"
    "try:\n"
    "    init_local_ray(1)\n"
    "    print('NOT DELIVERED', flush=True)\n"
    "except Stop:\n"
    "    if sys.argv[1:] == ['fail']:\n"
    "        print('OURS AFTER A FAILED INIT', flush=True)\n"
    "        sys.exit(0)\n"
    "    print('OURS AFTER INIT', ray.is_initialized(), ray.get(ray.remote(lambda: 42).remote()), flush=True)\n"
    "os.kill(os.getpid(), signal.SIGTERM)\n"  # and still ours after it
    "time.sleep(1)\n"
)


def test_a_sigterm_during_ray_init_reaches_the_processs_own_handler_once_ray_is_up():
    """Ray's ``ray.init`` puts in a handler of its own (``sys.exit``) first thing: a SIGTERM in its start
    ended the process from the middle of it, past the command's handler that stops what it started."""
    out = subprocess.run([sys.executable, "-c", SIGTERM_IN_INIT], capture_output=True, text=True, timeout=300)
    assert out.stdout.splitlines()[:1] == ["OURS AFTER INIT True 42"], (out.returncode, out.stdout, out.stderr[-2000:])
    assert out.returncode == 1 and "Stop" in out.stderr.splitlines()[-1], out.stderr[-2000:]


def test_a_sigterm_during_a_ray_init_that_fails_still_reaches_the_processs_own_handler():
    """The stop asked for wins over Ray's failure to start (which a caller may report and go on from)."""
    out = subprocess.run([sys.executable, "-c", SIGTERM_IN_INIT, "fail"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.splitlines() == ["OURS AFTER A FAILED INIT"], (out.stdout, out.stderr[-2000:])


_JOB_SERVER = (
    "import os, sys\n"
    "from exgrpo.backends.verl.jobs import local_job_server\n"
    "print(local_job_server(num_cpus=1), os.environ['RAY_AUTH_TOKEN'], flush=True)\n"
    "sys.stdin.read()\n"  # stay up until the test closes stdin
)
_FOLLOW = (
    "import signal, sys\n"
    "signal.signal(signal.SIGINT, signal.default_int_handler)\n"  # Ctrl-C acting, as in a terminal
    "from pathlib import Path\n"
    "from exgrpo.backends.verl.jobs import run_ray_job\n"
    "from exgrpo.backends.verl.prepared import PreparedRun\n"
    "job = PreparedRun(Path(sys.argv[2]), [sys.executable, '-c', \"import time; print('up', flush=True); "
    "time.sleep(600)\"], {})\n"
    "run_ray_job(job, sys.argv[1], on_submit=lambda job_id: print('JOB', job_id, flush=True), poll_seconds=0.2)\n"
)

_STATUS = (
    "import sys, time\n"
    "from ray.job_submission import JobSubmissionClient\n"
    "client = JobSubmissionClient(sys.argv[1])\n"
    "deadline = time.monotonic() + 60\n"
    "while str(client.get_job_status(sys.argv[2])).rsplit('.', 1)[-1] != 'STOPPED' and time.monotonic() < deadline:\n"
    "    time.sleep(1)\n"
    "print(str(client.get_job_status(sys.argv[2])).rsplit('.', 1)[-1])\n"
)


def test_a_ray_job_whose_driver_is_interrupted_is_stopped_on_the_cluster(tmp_path):
    """`launch: ray_job` on a cluster's job server: Ctrl-C (or SIGTERM) of the command that follows the
    job stops the job there too, not only the command (the job ran on, holding the cluster's CPUs)."""
    import signal

    server = subprocess.Popen([sys.executable, "-c", _JOB_SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        address, token = server.stdout.readline().split()
        env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
        follower = subprocess.Popen([sys.executable, "-c", _FOLLOW, address, str(tmp_path)], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, env=env)
        lines = []
        for line in follower.stdout:  # the job id, then the job's own first line
            lines.append(line.strip())
            if line.strip() == "up":
                break
        job_id = next(line.split()[1] for line in lines if line.startswith("JOB "))
        follower.send_signal(signal.SIGINT)
        out, err = follower.communicate(timeout=120)  # a hang guard
        assert follower.returncode != 0 and "KeyboardInterrupt" in err, out + err[-2000:]
        status = subprocess.run([sys.executable, "-c", _STATUS, address, job_id], capture_output=True, text=True,
                                env=env, timeout=120)
        assert status.stdout.split() == ["STOPPED"], status.stdout + status.stderr[-2000:]
    finally:
        server.stdin.close()
        server.wait(timeout=60)


def test_the_workers_of_a_private_local_ray_load_transformers_without_scikit_learn():
    """Ray's worker_process_setup_hook runs exgrpo/lean_imports.py's install in each worker before its
    task is loaded (a task's own module, like a veRL actor's, may load transformers before exgrpo)."""
    code = (
        "import ray\n"
        "from exgrpo.cluster import ensure_ray\n"
        "ensure_ray()\n"
        "def load():\n"
        "    import sys\n"
        "    from transformers import LlamaForCausalLM\n"
        "    return 'exgrpo' in sys.modules, 'sklearn' in sys.modules\n"
        "print(*ray.get(ray.remote(load).remote()))\n"
        "ray.shutdown()\n"
    )
    assert _python(code).split() == ["True", "False"]
