"""What a veRL job asks Ray for, derived from the typed config, and whether a cluster can ever give it.

veRL places its actor/rollout workers in one placement group per node (``STRICT_PACK``): one bundle
per worker of ``{"CPU": 3, "GPU": 1}`` (``RayResourcePool`` with ``max_colocate_count=3``: actor,
rollout and reference share a bundle). On the cpu platform the "GPU" is logical: a CPU node is given
GPUs with ``ray start --num-gpus``. Beside the workers run veRL's TaskRunner, the reward worker and
the agent loop's worker: :data:`EXTRA_CPUS`.

A cluster that cannot hold this is never waited on: :func:`check` fails in seconds, naming what is
missing and the ``ray start`` flags that provide it.
"""

from __future__ import annotations

from dataclasses import dataclass

from exgrpo.cluster import ClusterError, NodeResources
from exgrpo.config.backend import VerlSettings

CPUS_PER_WORKER = 3
"""veRL's ``max_colocate_count`` for FSDP: CPUs of each worker's bundle."""
EXTRA_CPUS = 2
"""The TaskRunner and the reward / agent-loop workers, anywhere on the cluster."""


@dataclass(frozen=True)
class JobNeeds:
    nodes: int
    cpus_per_node: int
    gpus_per_node: int
    extra_cpus: int

    @property
    def total_cpus(self) -> int:
        return self.nodes * self.cpus_per_node + self.extra_cpus


def needs(v: VerlSettings) -> JobNeeds:
    """The resources of ``backend.verl``'s job: ``nnodes`` nodes of ``workers_per_node`` bundles."""
    return JobNeeds(v.nnodes, CPUS_PER_WORKER * v.workers_per_node, v.workers_per_node, EXTRA_CPUS)


def check(v: VerlSettings, nodes: list[NodeResources], address: str) -> None:
    """Raise :class:`ClusterError` (one line) unless the live ``nodes`` can hold the job."""
    need = needs(v)
    fit = [n for n in nodes if n.cpus >= need.cpus_per_node and n.gpus >= need.gpus_per_node]
    total = sum(n.cpus for n in nodes)
    if len(fit) >= need.nodes and total >= need.total_cpus:
        return
    gpu_kind = "logical GPUs" if v.device == "cpu" else "GPUs"
    have = ", ".join(f"{n.cpus:g} CPU/{n.gpus:g} GPU" for n in nodes) or "none alive"
    flags = (f"--num-cpus={need.cpus_per_node + need.extra_cpus} --num-gpus={need.gpus_per_node}"
             if v.device == "cpu" else f"--num-cpus={need.cpus_per_node + need.extra_cpus}")
    raise ClusterError(
        f"the Ray cluster at {address} can never run this veRL job: it needs {need.nodes} node(s) with "
        f"{need.cpus_per_node} CPUs and {need.gpus_per_node} {gpu_kind} each (backend.verl.workers_per_node="
        f"{v.workers_per_node}, nnodes={v.nnodes}; {CPUS_PER_WORKER} CPUs per worker) and {need.total_cpus} "
        f"CPUs in all; its nodes have: {have}. Add such a node, e.g. `ray start --address={address} {flags}`"
        + (" (logical GPUs: the cpu platform's workers)" if v.device == "cpu" else ""))
