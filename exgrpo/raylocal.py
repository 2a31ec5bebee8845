"""Starting the embedded default's private local Ray, safely.

Ray 2.60's GCS, raylet and workers listen on every interface whatever ``node_ip_address`` says
(measured with ``ss -ltnp``; README "Security and failure behaviour"), so the private Ray is
protected by Ray's **token authentication**: a random token per process, in ``RAY_AUTH_TOKEN``,
with ``RAY_AUTH_MODE=token``. Every process Ray starts inherits both; a client that does not hold
the token (another user, another host) is refused by the GCS and the job server. The dashboard
and job server bind to 127.0.0.1. Its Prometheus metrics export is off (:data:`LOCAL_SYSTEM_CONFIG`):
it would serve, on every interface and without a token, the session name, driver PIDs, node address
and task and actor names.

A configured cluster (``ray_address``) is joined as it is (:mod:`exgrpo.cluster`, which starts this
private Ray when there is none: :func:`exgrpo.cluster.ensure_ray`): its operator secures it.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import secrets
import shutil
import signal
import sys
import tempfile
import threading
from pathlib import Path
from collections.abc import Iterator
from typing import Any

AUTH_MODE_VAR = "RAY_AUTH_MODE"
TOKEN_VAR = "RAY_AUTH_TOKEN"

LOCAL_SYSTEM_CONFIG = {"enable_metrics_collection": False}
"""Ray system config of every private local Ray: no metrics agent exporting on every interface."""


def enable_token_auth() -> dict[str, str]:
    """Token authentication for this process and everything it starts; returns the two variables.

    An explicit ``RAY_AUTH_MODE=disabled`` in the environment is an error: the local Ray would
    accept any client that reaches its ports.
    """
    mode = os.environ.get(AUTH_MODE_VAR, "token").lower()
    if mode != "token":
        raise RuntimeError(
            f"{AUTH_MODE_VAR}={os.environ[AUTH_MODE_VAR]} would start a local Ray that accepts any client; "
            f"unset it (the project starts Ray with token authentication)"
        )
    os.environ[AUTH_MODE_VAR] = "token"
    os.environ.setdefault(TOKEN_VAR, secrets.token_hex(32))
    os.environ.pop("RAY_AUTH_TOKEN_PATH", None)  # the token in the environment is the one
    if "ray" in sys.modules:  # Ray read its config at import: make this process see token mode too
        from ray._raylet import AuthenticationTokenLoader, Config

        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()
    return {AUTH_MODE_VAR: "token", TOKEN_VAR: os.environ[TOKEN_VAR]}


def local_temp_dir() -> str:
    """A fresh temp dir for one private Ray (short: Ray's socket paths must fit in 107 characters)."""
    tmp = os.environ.get("RAY_TMPDIR")
    return tempfile.mkdtemp(prefix="exgrpo-ray-", dir=str(Path(tmp).resolve()) if tmp else None)


_STARTED: list[str] = []
"""The temp dirs of the private Rays this process started (its session logs and sockets)."""


def remove_after_shutdown(dirs: list[str] | None = None, pid: int | None = None) -> None:
    """At the exit of the process that started them: shut down its Ray if it is still up, then remove
    the temp dirs of the private Rays it started (``dirs``, default all of them), and no other: each
    flow run, comparison or sweep would otherwise leave an ``exgrpo-ray-*`` directory behind. A process
    that inherited the list (a fork) leaves them to their owner (``pid``, the one that started them)."""
    if pid is not None and pid != os.getpid():
        return
    if "ray" in sys.modules:
        import ray

        if ray.is_initialized():
            ray.shutdown()
    for d in _STARTED if dirs is None else dirs:
        shutil.rmtree(d, ignore_errors=True)


def agent_port_any() -> None:
    """Give a local Ray's dashboard agent any free port (idempotent). ``ray.init`` always asks for
    port 52365, so a second private Ray on the host (a Prefect worker's job server beside a sweep's
    Ray) got an agent without its HTTP server, and every Ray Job submitted to it failed with "No
    available agent to submit job". Ray's agent supports port 0 (``dashboard/agent.py``)."""
    from ray._private import parameter

    init = parameter.RayParams.__init__
    if getattr(init, "__exgrpo_patched__", False):
        return

    @functools.wraps(init)
    def any_agent_port(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("dashboard_agent_listen_port", 0)
        init(self, *args, **kwargs)

    any_agent_port.__exgrpo_patched__ = True  # type: ignore[attr-defined]
    parameter.RayParams.__init__ = any_agent_port


@contextlib.contextmanager
def sigterm_held() -> Iterator[None]:
    """A SIGTERM that arrives inside the block is held, and handed to this process's handler once the block
    ends (nothing changes where there is no handler of its own, or off the main thread).

    Around Ray's blocking calls (``ray.wait``, ``ray.get``): Python runs a signal's handler wherever the
    main thread checks for signals, inside Ray's Cython code too, and a handler that raises there (the
    CLI's ``Terminated``, Prefect's ``TerminationSignal``) leaves that code returning a result with an
    exception set: a ``SystemError`` and a second traceback instead of the stop. Holding it at the Python
    level, not with ``pthread_sigmask``: a mask is per thread (the signal goes to another thread, and Python
    runs the handler in the main thread all the same), and every process started meanwhile would inherit it
    and ignore SIGTERM for good."""
    main = threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGTERM) if main else None
    if not callable(before):
        yield
        return
    held: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)
        if held:  # also when the block failed: the stop asked for wins over that error
            before(signal.SIGTERM, None)


@contextlib.contextmanager
def sigterm_kept() -> Iterator[None]:
    """Keep this process's own SIGTERM handler across ``ray.init``, which would replace it with ``sys.exit``.

    A command's handler (:mod:`exgrpo.cli`) ends it as Ctrl-C does, stopping what it started; Ray's
    ``sys.exit`` inside a Prefect flow crashed the flow, aborted the process and left its Prefect
    server and Ray's agents running. Inside the block Ray installs no handler, and a SIGTERM that
    arrives is held (:func:`sigterm_held`) and handed to this process's handler once the block ends, with
    Ray whole (up, or failed to start): Ray's handler would exit from the middle of its start, with its
    processes half made."""
    main = threading.current_thread() is threading.main_thread()
    if not (main and callable(signal.getsignal(signal.SIGTERM))):
        yield
        return
    import ray._private.utils as ray_utils

    set_handler = ray_utils.set_sigterm_handler
    ray_utils.set_sigterm_handler = lambda handler: None  # looked up there by ray.init on each call
    try:
        with sigterm_held():
            yield
    finally:
        ray_utils.set_sigterm_handler = set_handler


def init_local_ray(num_cpus: int, **kwargs: Any):
    """``ray.init`` of a private local Ray (``address="local"``, its own temp dir, token auth).

    A stale ``ray_current_cluster`` file left by a dead cluster is never picked up.
    """
    import ray

    env = enable_token_auth()
    agent_port_any()
    runtime_env = dict(kwargs.pop("runtime_env", None) or {})
    runtime_env["env_vars"] = {**runtime_env.get("env_vars", {}), **env}
    temp_dir = local_temp_dir()
    if not _STARTED:  # registered after `import ray`, so it runs before Ray's own exit handler
        atexit.register(remove_after_shutdown, pid=os.getpid())
    _STARTED.append(temp_dir)
    with sigterm_kept():
        return ray.init(address="local", num_cpus=num_cpus, _temp_dir=temp_dir, runtime_env=runtime_env,
                        _system_config=LOCAL_SYSTEM_CONFIG, **kwargs)
