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
* joining fails with one line (:class:`ClusterError`), in seconds: :func:`probe` checks the token, a
  TCP connection and the GCS's answer, each with a timeout, before ``ray.init`` (which retries an
  address that answers nothing for minutes).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exgrpo.config import ConfigError
from exgrpo.errors import UserError, one_line
from exgrpo.lean_imports import RAY_SETUP_HOOK
from exgrpo.raylocal import init_local_ray, sigterm_kept
from exgrpo.tracking import resolve_tracking_uri

ADDRESS_VAR = "RAY_ADDRESS"

EXCLUDES = ["runs/", "mlruns/", "studies/", "site/", ".venv*/", ".git/", ".pg/", ".hypothesis/",
            ".pytest_cache/", ".ruff_cache/", "*.egg-info/", "__pycache__/", "*.db", "*.pt"]
"""Never uploaded with the code: run outputs, local stores, environments, caches."""


CODE_KEYS = ("working_dir", "py_modules", "excludes")
"""The runtime_env fields that ship the code."""


class ClusterError(UserError, RuntimeError):
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


def check_cluster(address: str | None, tracking_uri: str | None = None, storage: str | None = None) -> None:
    """Before any work on the cluster at ``address`` (None: a private local Ray, nothing to check):
    stores every node reaches (:func:`require_shared_stores`), and a cluster that answers (:func:`probe`)."""
    require_shared_stores(address, tracking_uri, storage)
    if address is not None:
        probe(address)


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
    whose runtime env already holds it), after :func:`probe`; one-line errors."""
    import ray

    probe(address)
    env = dict(kwargs.pop("runtime_env", None) or {})
    env = {**runtime_env(env.pop("env_vars", None)), **env}
    try:
        with sigterm_kept():
            ray.init(address=address, runtime_env=without_job_env(env), **kwargs)
    except (ConnectionError, ray.exceptions.AuthenticationError) as e:
        raise ClusterError(join_failure(address, e)) from None


TCP_SECONDS = 5.0
"""How long a TCP connection to the cluster's address may take."""
GCS_SECONDS = 5.0
"""How long the GCS may take to give its cluster ID once connected (Ray's client adds up to 10 s of
its own connection waits): the whole probe ends within about 20 s. ``EXGRPO_RAY_GCS_SECONDS`` sets
another (a head reached over a slow link)."""
GCS_SECONDS_VAR = "EXGRPO_RAY_GCS_SECONDS"
TOKEN_FILE = Path("~/.ray/auth_token")
"""Where Ray looks for a token when neither RAY_AUTH_TOKEN nor RAY_AUTH_TOKEN_PATH is set."""


def token_problem(address: str, env: dict[str, str] | None = None) -> str | None:
    """The one line for token mode without a token (``ray.init`` would end in a raw
    AuthenticationError, Ray's GCS client would abort the process), else None."""
    env = os.environ if env is None else env
    if env.get("RAY_AUTH_MODE", "").lower() != "token" or env.get("RAY_AUTH_TOKEN"):
        return None
    path = env.get("RAY_AUTH_TOKEN_PATH")
    if path and Path(path).expanduser().is_file():
        return None
    if not path and TOKEN_FILE.expanduser().is_file():
        return None
    where = f"RAY_AUTH_TOKEN_PATH={path} is no file" if path else "RAY_AUTH_TOKEN is not set"
    return (f"cannot join the Ray cluster at {address}: RAY_AUTH_MODE=token but {where}; export the cluster's "
            "token as RAY_AUTH_TOKEN (the same 64 hex characters as on its nodes)")


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` (also ``ray://host:port`` and ``[v6]:port``) as (host, port); a ClusterError for
    anything else."""
    rest = address.split("://", 1)[-1].rstrip("/")
    host, _, port = rest.rpartition(":")
    if not host or not port.isdigit():
        raise ClusterError(f"--ray-address={address}: give the head's GCS address as <host>:<port>, e.g. "
                           "10.0.0.5:6379 (the --port of `ray start --head`)")
    return host.strip("[]"), int(port)


def probe(address: str, tcp_seconds: float = TCP_SECONDS, gcs_seconds: float | None = None) -> None:
    """Check, in seconds, that ``address`` is a Ray cluster this process may join: the token is set
    where token mode asks for one, a TCP connection is accepted, and the GCS answers with its cluster
    ID. Raise :class:`ClusterError` (one line: the address, what was tried, the fix) otherwise.

    ``ray.init`` itself retries an address that answers nothing 20 times for 40 s each, and does not
    return to Python (so neither SIGINT nor SIGTERM acts) in between. The GCS's answer is awaited in a
    thread, so the caller stays interruptible. ``auto`` (a local cluster Ray finds itself) is not probed."""
    problem = token_problem(address)
    if problem:
        raise ClusterError(problem)
    if address == "auto":
        return
    host, port = split_address(address)
    try:
        socket.create_connection((host, port), timeout=tcp_seconds).close()
    except OSError as e:
        why = "no answer" if isinstance(e, TimeoutError) else (e.strerror or type(e).__name__)
        raise ClusterError(
            f"cannot join the Ray cluster at {address}: nothing accepts a connection there (TCP connect: {why}, "
            f"{tcp_seconds:g} s timeout); check the address: the head's <ip>:<port> of `ray start --head --port` "
            "(6379 unless set), reachable from this machine") from None
    if "://" in address:  # Ray Client (ray://): its server speaks its own protocol
        return
    if gcs_seconds is None:
        gcs_seconds = float(os.environ.get(GCS_SECONDS_VAR) or GCS_SECONDS)
    error = _gcs_answer(address, gcs_seconds)
    if error is not None:
        raise ClusterError(error)


def _gcs_answer(address: str, seconds: float) -> str | None:
    """None when the GCS at ``address`` gives its cluster ID, else the one line saying why not."""
    import ray
    from ray._private.services import canonicalize_bootstrap_address
    from ray._raylet import InnerGcsClient

    target = canonicalize_bootstrap_address(address) or address  # what ray.init will connect to
    outcome: list[BaseException | None] = []

    def ask() -> None:
        try:
            InnerGcsClient.standalone(target, None, int(seconds * 1000))
            outcome.append(None)
        except BaseException as e:  # noqa: BLE001 - reported to the waiting thread
            outcome.append(e)

    wait = seconds + 2 * TCP_SECONDS + 5  # Ray's client waits up to 5 s to connect, 5 s for its pubsub
    with _quiet_stderr():  # Ray's client logs each of its retries on fd 2: the user gets one line instead
        thread = threading.Thread(target=ask, daemon=True, name="ray-gcs-probe")
        thread.start()
        thread.join(wait)
    if not outcome:
        return (f"cannot join the Ray cluster at {address}: it accepts connections but its GCS gave no answer "
                f"in {wait:g} s; check the address is the head's GCS port (`ray start --head --port`, 6379 "
                "unless set), not its dashboard, client or another service's port")
    error = outcome[0]
    if error is None:
        return None
    if isinstance(error, ray.exceptions.AuthenticationError):
        return join_failure(address, error)
    first = str(error).strip().splitlines()[0].rstrip(".") if str(error).strip() else type(error).__name__
    return (f"cannot join the Ray cluster at {address}: it accepts connections but no Ray GCS gave its cluster "
            f"ID ({first}); check the address is the head's GCS port (`ray start --head "
            "--port`, 6379 unless set), not its dashboard, client or another service's port")


@contextlib.contextmanager
def _quiet_stderr():
    """File descriptor 2 sent to a temp file for the block (Ray's C++ logs bypass ``sys.stderr``)."""
    import sys

    with contextlib.suppress(Exception):
        sys.stderr.flush()
    saved = os.dup(2)
    try:
        with tempfile.TemporaryFile() as sink:
            os.dup2(sink.fileno(), 2)
            try:
                yield
            finally:
                os.dup2(saved, 2)
    finally:
        os.close(saved)


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
    why = why.split(". ")[0]  # Ray's own advice after the first sentence names files this project does not use
    if not os.environ.get("RAY_AUTH_TOKEN") and not os.environ.get("RAY_AUTH_TOKEN_PATH"):
        mode = "" if os.environ.get("RAY_AUTH_MODE", "").lower() == "token" else "RAY_AUTH_MODE=token and "
        return (f"cannot join the Ray cluster at {address} ({why}): RAY_AUTH_TOKEN is not set; export "
                f"{mode}the cluster's token as RAY_AUTH_TOKEN (a token-auth cluster refuses clients without it)")
    return (f"cannot join the Ray cluster at {address} ({why}): check that RAY_AUTH_TOKEN is the cluster's token "
            f"and the address (`ray status --address {address}`)")


@dataclass(frozen=True)
class NodeResources:
    cpus: float
    gpus: float
    node_id: str = ""


def alive_nodes() -> list[NodeResources]:
    """Total CPUs and GPUs of every live node of the joined cluster."""
    import ray

    return [NodeResources(float(n["Resources"].get("CPU", 0)), float(n["Resources"].get("GPU", 0)), n["NodeID"])
            for n in ray.nodes() if n.get("Alive")]


def available_nodes() -> list[NodeResources]:
    """What every live node has free now, as Ray reports it: its total less what any work holds
    (other users' jobs and actors on a shared cluster too)."""
    import ray
    from ray._private.state import available_resources_per_node  # what ray.util's own placement helpers read

    free = available_resources_per_node()
    return [NodeResources(float(free.get(n.node_id, {}).get("CPU", 0)), float(free.get(n.node_id, {}).get("GPU", 0)),
                          n.node_id) for n in alive_nodes()] if ray.is_initialized() else []


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
    # its workers load transformers without scikit-learn (exgrpo/lean_imports.py)
    runtime_env = {"env_vars": {"OMP_NUM_THREADS": "1"}, "worker_process_setup_hook": RAY_SETUP_HOOK}
    if address:
        join(address, log_to_driver=True, runtime_env=runtime_env)
        return
    try:
        init_local_ray(num_cpus, include_dashboard=False, log_to_driver=True, runtime_env=runtime_env)
    except Exception as e:  # a deployment's flow run, a sweep or a compare ends on this one line
        raise ClusterError(local_start_failure(e)) from e


def local_start_failure(error: BaseException) -> str:
    """The one line for a private local Ray that did not start: its cause, and what to do about it."""
    cause = one_line(error, 240)
    if "AF_UNIX path length" in cause:
        fix = ("Ray's socket paths must fit in 107 characters: set RAY_TMPDIR to a short directory "
               "(e.g. `export RAY_TMPDIR=/tmp`)")
    elif isinstance(error, TimeoutError) or "timed out" in cause.lower():
        fix = ("a machine too loaded to start Ray's processes in time (they need a few seconds of CPU): run it "
               "again when the machine is quieter, or give --ray-address of a running cluster")
    else:
        fix = "Ray's own logs are under its session directory (RAY_TMPDIR, else the system temp dir, exgrpo-ray-*)"
    return f"the private local Ray did not start ({cause}); {fix}"


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
