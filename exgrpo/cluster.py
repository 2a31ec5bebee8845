"""Running on a Ray cluster the user already has.

One address names the cluster everywhere: ``--ray-address`` (CLI), ``ray_address`` (Prefect flow
parameters), else ``RAY_ADDRESS`` as every Ray tool reads it. Without one, work runs on a private
local Ray (:mod:`exgrpo.raylocal`), started by :func:`ensure_ray`, the one entry point of sweeps and
comparisons; :func:`task_cpus` is what each of their runs asks Ray for.

On a cluster:

* **the code travels** as Ray's ``runtime_env`` ``working_dir``: the project's source tree, without
  run outputs, stores, virtual environments or caches (:data:`EXCLUDES`);
* **the records must be reachable from every node**: a tracking server or database for MLflow and a
  database for Optuna, never a local sqlite file (:func:`require_shared_stores`);
* **run directories** (checkpoints, ``metrics.jsonl``) are written under ``output_dir``, which must be
  a path every node shares; the final checkpoint is also logged to the run's MLflow artifacts;
* joining fails with one line: a missing token names ``RAY_AUTH_TOKEN`` (:class:`ClusterError`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exgrpo.config import ConfigError
from exgrpo.raylocal import init_local_ray
from exgrpo.tracking import resolve_tracking_uri

ADDRESS_VAR = "RAY_ADDRESS"

EXCLUDES = ["runs/", "mlruns/", "studies/", "site/", ".venv*/", ".git/", ".pg/", ".hypothesis/",
            ".pytest_cache/", ".ruff_cache/", "*.egg-info/", "__pycache__/", "*.db", "*.pt"]
"""Never uploaded with the code: run outputs, local stores, environments, caches."""


CODE_KEYS = ("working_dir", "py_modules", "excludes")
"""The runtime_env fields that ship the code."""


class ClusterError(RuntimeError):
    """The cluster cannot be joined, or can never run the work; one line, naming the fix."""


def cluster_address(explicit: str | None = None) -> str | None:
    """The cluster to run on: ``explicit``, else ``RAY_ADDRESS``; None (a private local Ray) for
    neither or for ``local``."""
    address = explicit or os.environ.get(ADDRESS_VAR) or None
    return None if address in (None, "local") else address


def require_shared_stores(address: str | None, tracking_uri: str | None = None, storage: str | None = None) -> None:
    """On a cluster, MLflow and Optuna stores every node can reach: a local sqlite file or directory
    cannot be (its trials and runs execute on other machines). A one-line error before any work."""
    if address is None:
        return

    uri = resolve_tracking_uri(tracking_uri)
    if uri.startswith(("sqlite:", "file:")) or "://" not in uri:
        raise ConfigError(
            f"--tracking-uri={uri}: runs on the Ray cluster at {address} cannot reach a local MLflow store; "
            "pass --tracking-uri (or MLFLOW_TRACKING_URI) http://<host>:<port> of an `mlflow server`, or "
            "postgresql://... as in team mode")
    if storage is not None and storage.startswith("sqlite:"):
        raise ConfigError(
            f"--storage={storage}: trials on the Ray cluster at {address} cannot reach a local sqlite study; "
            "pass --storage (or EXGRPO_OPTUNA_STORAGE) postgresql://... as in team mode")


def code_root() -> Path:
    """The project's source tree (the directory holding ``exgrpo/`` and ``pyproject.toml``)."""
    return Path(__file__).resolve().parent.parent


def runtime_env(env_vars: dict[str, str] | None = None) -> dict[str, Any]:
    """Ray's ``runtime_env`` for work on a cluster: the code as ``working_dir`` (a source checkout) or
    the package as ``py_modules`` (an installed one), without :data:`EXCLUDES`."""
    root = code_root()
    if (root / "pyproject.toml").is_file():
        code: dict[str, Any] = {"working_dir": str(root), "excludes": EXCLUDES}
    else:
        code = {"py_modules": [str(Path(__file__).resolve().parent)], "excludes": EXCLUDES}
    return {**code, "env_vars": dict(env_vars or {})}


def join(address: str, **kwargs: Any) -> None:
    """``ray.init`` on the cluster at ``address`` with the code shipped (unless this is a Ray Job,
    whose runtime env already holds it); one-line errors."""
    import ray

    env = dict(kwargs.pop("runtime_env", None) or {})
    env = {**runtime_env(env.pop("env_vars", None)), **env}
    try:
        ray.init(address=address, runtime_env=without_job_env(env), **kwargs)
    except ConnectionError as e:
        raise ClusterError(join_failure(address, e)) from None


def without_job_env(env: dict[str, Any]) -> dict[str, Any]:
    """``env`` less what the enclosing Ray Job's runtime env sets (its code, its variables): the job's
    apply to its driver anyway, and Ray refuses a driver's runtime env that repeats any of their keys."""
    raw = os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR")
    if not raw:
        return env
    job = json.loads(raw).get("runtime_env") or {}
    job_vars = job.get("env_vars") or {}
    out = {k: v for k, v in env.items() if k not in job and k != "env_vars" and k not in CODE_KEYS}
    out["env_vars"] = {k: v for k, v in (env.get("env_vars") or {}).items() if k not in job_vars}
    return out


def join_failure(address: str, error: BaseException) -> str:
    """The one line for a cluster that refused or did not answer."""
    why = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    if not os.environ.get("RAY_AUTH_TOKEN") and not os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return (f"cannot join the Ray cluster at {address} ({why}): RAY_AUTH_TOKEN is not set; export the "
                "cluster's token (a token-auth cluster refuses clients without it), and check the address")
    return (f"cannot join the Ray cluster at {address} ({why}): check the address (`ray status --address "
            f"{address}`) and that RAY_AUTH_TOKEN is the cluster's token")


@dataclass(frozen=True)
class NodeResources:
    cpus: float
    gpus: float


def alive_nodes() -> list[NodeResources]:
    """Total CPUs and GPUs of every live node of the joined cluster."""
    import ray

    return [NodeResources(float(n["Resources"].get("CPU", 0)), float(n["Resources"].get("GPU", 0)))
            for n in ray.nodes() if n.get("Alive")]


def describe(address: str | None) -> str:
    """Where work is running, for the terminal: ``Ray cluster at X: 2 nodes, 5 CPUs, 1 GPU``."""
    nodes = alive_nodes()
    where = f"Ray cluster at {address}" if address else "a private local Ray"
    return (f"{where}: {len(nodes)} node{'s' * (len(nodes) != 1)}, {sum(n.cpus for n in nodes):g} CPUs, "
            f"{sum(n.gpus for n in nodes):g} GPUs")


def announce(address: str | None, client: Any, run_id: str) -> str:
    """Say where a comparison's or sweep's work runs: in the terminal, and as the tag ``ray`` of its
    MLflow parent run (``client`` an MlflowClient). Returns the description."""
    where = describe(address)
    print(f"running on {where}", flush=True)
    client.set_tag(run_id, "ray", where)
    return where


def largest_node_cpus() -> int:
    """The most CPUs one live node has: a task asking for more could never be scheduled."""
    return int(max((n.cpus for n in alive_nodes()), default=1))


def ensure_ray(address: str | None = None, num_cpus: int = 2) -> None:
    """``ray.init`` once per process: the cluster of ``address`` (else ``RAY_ADDRESS``) with the code
    shipped (:func:`join`); otherwise a private local Ray with token authentication
    (:func:`exgrpo.raylocal.init_local_ray`)."""
    import ray

    if ray.is_initialized():
        return
    address = cluster_address(address)
    runtime_env = {"env_vars": {"OMP_NUM_THREADS": "1"}}
    if address:
        join(address, log_to_driver=True, runtime_env=runtime_env)
    else:
        init_local_ray(num_cpus, include_dashboard=False, log_to_driver=True, runtime_env=runtime_env)


def task_cpus(cfg: Any) -> int:
    """CPUs the Ray task of a run of ``cfg`` (a sweep trial, a compare run) asks for: a native run's
    torch threads (``train.threads``), so Ray never runs more of them at once than the cluster has
    cores for (2 runs x 2 threads on 2 cores ran each far below its speed alone), capped by the
    largest node's CPUs (a task no node can hold would wait forever); a veRL run 1 (its job's actors
    ask for their own)."""
    if cfg.backend.name != "native":
        return 1
    return max(1, min(int(cfg.train.threads), largest_node_cpus()))


def on_cluster(cfg: Any, address: str | None) -> Any:
    """``cfg`` with a veRL job on the cluster at ``address`` too, unless its own
    ``backend.verl.ray_address`` names one (a native run is unchanged)."""
    if address is None or cfg.backend.name != "verl" or cfg.backend.verl.ray_address is not None:
        return cfg
    verl = cfg.backend.verl.model_copy(update={"ray_address": address})
    return cfg.model_copy(update={"backend": cfg.backend.model_copy(update={"verl": verl})})
