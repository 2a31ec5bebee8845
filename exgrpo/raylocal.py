"""Starting the embedded default's private local Ray, safely.

Ray 2.60's GCS, raylet and workers listen on every interface whatever ``node_ip_address`` says
(measured with ``ss -ltnp``; README "Security and failure behaviour"), so the private Ray is
protected by Ray's **token authentication**: a random token per process, in ``RAY_AUTH_TOKEN``,
with ``RAY_AUTH_MODE=token``. Every process Ray starts inherits both; a client that does not hold
the token (another user, another host) is refused by the GCS and the job server. The dashboard
and job server bind to 127.0.0.1.

A configured cluster (``ray_address``) is joined as it is: its operator secures it (README,
team mode). :func:`ensure_ray` is the one entry point of sweeps and comparisons; :func:`task_cpus`
is what each of their runs asks Ray for.
"""

from __future__ import annotations

import os
import secrets
import sys
import tempfile
from pathlib import Path
from typing import Any

AUTH_MODE_VAR = "RAY_AUTH_MODE"
TOKEN_VAR = "RAY_AUTH_TOKEN"


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


def init_local_ray(num_cpus: int, **kwargs: Any):
    """``ray.init`` of a private local Ray (``address="local"``, its own temp dir, token auth).

    A stale ``ray_current_cluster`` file left by a dead cluster is never picked up.
    """
    import ray

    env = enable_token_auth()
    runtime_env = dict(kwargs.pop("runtime_env", None) or {})
    runtime_env["env_vars"] = {**runtime_env.get("env_vars", {}), **env}
    return ray.init(address="local", num_cpus=num_cpus, _temp_dir=local_temp_dir(), runtime_env=runtime_env, **kwargs)


def ensure_ray(address: str | None = None, num_cpus: int = 2) -> None:
    """``ray.init`` once per process: a cluster only when ``address`` is given; otherwise always a
    private local Ray with token authentication (:func:`init_local_ray`)."""
    import ray

    if ray.is_initialized():
        return
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": True,
                              "runtime_env": {"env_vars": {"OMP_NUM_THREADS": "1"}}}
    if address:
        ray.init(address=address, **kwargs)
    else:
        init_local_ray(num_cpus, **kwargs)


def task_cpus(cfg: Any) -> int:
    """CPUs the Ray task of a run of ``cfg`` (a sweep trial, a compare run) asks for: a native run's
    torch threads (``train.threads``), so Ray never runs more of them at once than the cluster has
    cores for (2 runs x 2 threads on 2 cores ran each far below its speed alone), capped by the
    cluster's CPUs; a veRL run 1 (its job's actors ask for their own)."""
    import ray

    if cfg.backend.name != "native":
        return 1
    return max(1, min(int(cfg.train.threads), int(ray.cluster_resources().get("CPU", 1))))
