"""What a veRL job asks Ray for, derived from the typed config, and whether a cluster can ever give it.

veRL places its actor/rollout workers in one placement group per node (``STRICT_PACK``): one bundle
per worker of ``{"CPU": 3, "GPU": 1}`` (``RayResourcePool`` with ``max_colocate_count=3``: actor,
rollout and reference share a bundle). On the cpu platform the "GPU" is logical: a CPU node is given
GPUs with ``ray start --num-gpus``. Beside the workers run veRL's TaskRunner, the reward worker and
the agent loop's worker: :data:`EXTRA_CPUS`.

A cluster that cannot hold this is never waited on: :func:`check` fails in seconds, naming what is
missing and the ``ray start`` flags that provide it.

Several jobs on one cluster (a comparison's runs, a sweep's trials) start only as it can host them
whole (:func:`plan_slots`): each run's launcher task and veRL's TaskRunner are placed on a node the
plan chose for them, beside or away from the workers' bundles. Jobs started all at once would let the
runs' launchers and TaskRunners take the CPUs that the runs' bundles need on a GPU node, and then no
run could start.
"""

from __future__ import annotations

from collections.abc import Callable
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


DRIVER_CPUS = 2
"""CPUs beside the bundles, on one node, of a job a comparison or sweep starts: its launcher (a Ray task
of 1 CPU, :func:`exgrpo.raylocal.task_cpus`) and veRL's TaskRunner, which the job places on the
launcher's node (``DRIVER_NODE_ENV``)."""
DRIVER_NODE_ENV = "EXGRPO_DRIVER_NODE"
"""The Ray node id the job's TaskRunner is placed on (the launcher's node), when a plan chose it."""


def place(v: VerlSettings, free: list[list[float]]) -> tuple[int, list[list[float]]] | None:
    """Where one job of ``backend.verl`` goes in ``free`` (``[cpus, gpus]`` per node): the node its
    launcher and TaskRunner go to (:data:`DRIVER_CPUS`), and what it takes of each node; None when it
    does not fit. Its bundles go on ``nnodes`` distinct nodes (the GPU nodes with the fewest GPUs to
    spare first), its launcher's node is one with no GPU to spare first (so GPU nodes keep their CPUs
    for bundles), and the rest of its :data:`EXTRA_CPUS` go anywhere."""
    need = needs(v)
    left = [f[:] for f in free]
    fits = sorted((i for i, (c, g) in enumerate(left) if c >= need.cpus_per_node and g >= need.gpus_per_node),
                  key=lambda i: (left[i][1], left[i][0]))
    if len(fits) < need.nodes:
        return None
    for i in fits[:need.nodes]:
        left[i][0] -= need.cpus_per_node
        left[i][1] -= need.gpus_per_node
    spare_first = sorted(range(len(left)), key=lambda i: (left[i][1] > 0, -left[i][0]))
    drivers = [i for i in spare_first if left[i][0] >= DRIVER_CPUS]
    if not drivers:
        return None
    left[drivers[0]][0] -= DRIVER_CPUS
    rest = need.extra_cpus + 1 - DRIVER_CPUS  # the reward / agent-loop workers; +1: the launcher
    for i in spare_first:
        take = min(rest, int(left[i][0]))
        left[i][0] -= take
        rest -= take
    if rest > 0:
        return None
    return drivers[0], [[f[0] - x[0], f[1] - x[1]] for f, x in zip(free, left, strict=True)]


def plan_slots(v: VerlSettings, nodes: list[NodeResources]) -> list[int]:
    """How many jobs of ``backend.verl`` the ``nodes`` hold at once, whole (:func:`place`, one after
    the other), as the node (an index of ``nodes``) each one's launcher and TaskRunner go to. An
    empty list: the cluster cannot hold even one."""
    free = [[n.cpus, n.gpus] for n in nodes]
    slots: list[int] = []
    while (placed := place(v, free)) is not None:
        driver, took = placed
        free = [[f[0] - t[0], f[1] - t[1]] for f, t in zip(free, took, strict=True)]
        slots.append(driver)
    return slots


class SlotPlan:
    """veRL runs of a comparison or sweep started one by one as the cluster can host each whole, each
    by its own ``backend.verl`` (arms may differ), from what Ray reports free (a cluster shared with
    other work): :meth:`place` says where a run goes now, or None when it must wait; :meth:`release`
    gives its share back when it ends.

    Ray reports a started run's resources only as its job takes them, seconds later, so the plan keeps
    its own ledger: what is free for the next run is, per node, the lesser of what Ray reports free
    and what was free when none of these runs was running less what the running ones take."""

    def __init__(self, nodes: list[NodeResources], available: Callable[[], list[NodeResources]],
                 say: Callable[[str], None] = print) -> None:
        self.nodes, self.available, self.say = nodes, available, say
        self.running: dict[int, list[list[float]]] = {}
        self._base: dict[str, NodeResources] = {}
        self._said: set[str] = set()
        self._next = 0

    def free(self) -> list[list[float]]:
        """``[cpus, gpus]`` per node that the next run may take."""
        now = {n.node_id: n for n in self.available()}
        if not self.running:  # none of ours runs: Ray's numbers are the whole truth
            self._base = now
        free = []
        for i, node in enumerate(self.nodes):
            base, cur = self._base.get(node.node_id), now.get(node.node_id)
            if base is None or cur is None:  # a node that left (or joined since): nothing to plan on
                free.append([0.0, 0.0])
                continue
            ours = [sum(t[i][k] for t in self.running.values()) for k in (0, 1)]
            free.append([min(base.cpus - ours[0], cur.cpus), min(base.gpus - ours[1], cur.gpus)])
        return free

    def place(self, v: VerlSettings, name: str = "a run") -> tuple[int, int] | None:
        """``(handle, node index of its launcher)`` of a run of ``backend.verl`` started now, or None
        when what is free cannot hold it whole (said once per reason)."""
        free = self.free()
        placed = place(v, free)
        if placed is None:
            have = ", ".join(f"{c:g} CPU/{g:g} GPU" for c, g in free)
            need = needs(v)
            what = (f"{need.nodes} node(s) with {need.cpus_per_node} CPUs and {need.gpus_per_node} GPUs for its "
                    f"workers and {need.extra_cpus + 1} CPUs beside them")
            why = ("until a running veRL run of this batch ends" if self.running
                   else "until other work on the cluster frees room")
            if not self._said:  # once: a run just ended may still hold its share for a moment
                self._said.add(why)
                self.say(f"note: {name} waits {why}: it needs {what}; free now: {have}")
            return None
        driver, took = placed
        self._next += 1
        self.running[self._next] = took
        return self._next, driver

    def release(self, handle: int) -> None:
        self.running.pop(handle, None)


def waiting_note(v: VerlSettings, nodes: list[NodeResources], at_once: int, runs: int) -> str:
    """The one line saying that ``runs`` veRL runs start ``at_once`` at a time, with what each needs and
    what the cluster has."""
    need = needs(v)
    gpu_kind = "logical GPUs" if v.device == "cpu" else "GPUs"
    have = ", ".join(f"{n.cpus:g} CPU/{n.gpus:g} GPU" for n in nodes)
    return (f"the cluster hosts {at_once} of these {runs} veRL runs at a time, whole: each needs {need.nodes} "
            f"node(s) with {need.cpus_per_node} CPUs and {need.gpus_per_node} {gpu_kind} for its workers and "
            f"{need.extra_cpus + 1} CPUs beside them (its launcher, TaskRunner, reward and agent-loop workers); "
            f"its nodes have {have}. The other runs wait for a running one to end")


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
