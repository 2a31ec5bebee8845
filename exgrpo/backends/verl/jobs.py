"""Launch a prepared veRL run as a Ray Job (``JobSubmissionClient.submit_job``), stream its logs,
and turn its final status into a result or a one-line error with the job id and the last lines.

Without a configured job address, a private local Ray with its job server is started for the
submission (dashboard on 127.0.0.1); the job itself runs veRL's driver, which starts its own
private Ray for the workers (``backend.verl.ray_address`` unset) or joins the configured cluster.
Both private Rays use token authentication (:mod:`exgrpo.raylocal`): the job inherits the token.
"""

from __future__ import annotations

import contextlib
import shlex
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from exgrpo.backends.verl.live import StepFeed
from exgrpo.backends.verl.prepared import (DIAGNOSIS_LINES, PreparedRun, VerlRunError, diagnosed, fatal_line, last_error,
                                           stalled)
from exgrpo.cluster import runtime_env
from exgrpo.raylocal import init_local_ray

TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}


_LOCAL_JOB_SERVER: str | None = None


def local_job_server(num_cpus: int = 4) -> str:
    """A private local Ray with its job server (dashboard) on 127.0.0.1, started once per process;
    returns the job-server address."""
    global _LOCAL_JOB_SERVER
    if _LOCAL_JOB_SERVER is None:
        import ray

        if ray.is_initialized():  # e.g. an earlier comparison's Ray in this process, started without a job server
            ray.shutdown()
        ctx = init_local_ray(num_cpus, include_dashboard=True, dashboard_host="127.0.0.1")
        _LOCAL_JOB_SERVER = "http://" + ctx.dashboard_url
    return _LOCAL_JOB_SERVER


def run_ray_job(prepared: PreparedRun, address: str, on_line: Callable[[str], None] = print,
                poll_seconds: float = 1.0, log_tail: int = 40,
                on_submit: Callable[[str], None] = lambda job_id: None, feed: StepFeed | None = None,
                stall_seconds: float | None = None) -> str:
    """Submit the run, stream its log to ``on_line`` (and ``verl.log``), wait; returns the job id.
    ``on_submit(job_id)`` runs once the job is accepted. ``feed`` is polled every ``poll_seconds``;
    when one of its callbacks raises, the job is stopped and this raises VerlRunError (STOPPED). A job
    whose log stays the same for ``stall_seconds``, or says it cannot finish
    (:func:`~exgrpo.backends.verl.prepared.fatal_line`), is stopped and this raises VerlRunError."""
    from ray.job_submission import JobStatus, JobSubmissionClient

    client = JobSubmissionClient(address)
    # a cluster's job server gets the code (its nodes may not hold this checkout); our own local one shares it
    job_env = {"env_vars": prepared.env} if address == _LOCAL_JOB_SERVER else runtime_env(prepared.env)
    deadline = time.monotonic() + 120
    while True:  # a just-started job server has no job agent for a few seconds
        try:
            job_id = client.submit_job(entrypoint=shlex.join(prepared.command), runtime_env=job_env)
            break
        except RuntimeError as e:
            if "No available agent" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(2)
    on_submit(job_id)
    tail: deque[str] = deque(maxlen=log_tail)
    log_path = Path(prepared.run_dir) / "verl.log"
    try:
        status, stopped, text = _follow(client, job_id, log_path, tail, on_line, poll_seconds, feed, stall_seconds)
    except BaseException:  # Ctrl-C, SIGTERM, an error here: the job must not run on without its driver
        _stop(address, job_id)
        raise
    final = str(status.value if isinstance(status, JobStatus) else status)
    if final != "SUCCEEDED":
        info = client.get_job_info(job_id)
        last = "\n".join(tail)
        why = stopped or (info.message or "no message").strip().splitlines()[0][:300]  # the job's log follows
        raise VerlRunError(diagnosed(tail) or f"Ray Job {job_id} {final}: {why}; {last_error(text.splitlines()[-DIAGNOSIS_LINES:])}see {log_path}. "
                                              f"Last lines:\n{last}")
    return job_id


def _stop(address: str, job_id: str, seconds: float = 15.0) -> None:
    """Ask the job server at ``address`` to stop ``job_id``, with a client of its own (the interrupted
    one may hold a half-read response), for at most ``seconds``: the caller is on its way out."""
    from ray.job_submission import JobSubmissionClient

    def stop() -> None:
        with contextlib.suppress(Exception):
            JobSubmissionClient(address).stop_job(job_id)

    thread = threading.Thread(target=stop, daemon=True, name="ray-job-stop")
    thread.start()
    thread.join(seconds)


def _follow(client, job_id: str, log_path: Path, tail: deque[str], on_line: Callable[[str], None],
            poll_seconds: float, feed: StepFeed | None, stall_seconds: float | None) -> tuple[Any, str | None, str]:
    """Stream the job's log to ``on_line``, ``tail`` and ``log_path`` until it ends; (its final status,
    why it was stopped for stalling or for a fatal line of its log, else None; its whole log)."""
    from ray.job_submission import JobStatus

    seen = 0
    status = None
    stopping = False
    stopped: str | None = None
    last_output = time.monotonic()
    text = ""
    with log_path.open("a") as log:
        while True:
            if feed is not None and not feed.poll() and not stopping:
                client.stop_job(job_id)
                stopping = True
            status = client.get_job_status(job_id)
            text = client.get_job_logs(job_id)
            for line in text[seen:].splitlines():
                log.write(line + "\n")
                tail.append(line)
                on_line(line)
                if not stopping and (fatal := fatal_line(line)):
                    client.stop_job(job_id)
                    stopping, stopped = True, fatal
            if len(text) != seen:
                last_output = time.monotonic()
            seen = len(text)
            if stall_seconds is not None and not stopping and time.monotonic() - last_output > stall_seconds:
                client.stop_job(job_id)
                stopping = True
                stopped = stalled(stall_seconds)
            if str(status.value if isinstance(status, JobStatus) else status) in TERMINAL:
                break
            time.sleep(poll_seconds)
    return status, stopped, text
