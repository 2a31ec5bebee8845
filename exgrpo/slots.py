"""When the runs of a comparison or sweep start on Ray: one scheduling loop
(:func:`run_as_slots_free`) and the veRL slot plan it follows on a cluster (:func:`launch_slots`).
Each run itself is :func:`exgrpo.launch.tracked_train`'s."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import Any

from exgrpo.backends.verl.resources import DRIVER_CPUS, SlotPlan, check, needs, plan_slots
from exgrpo.cluster import ClusterError, alive_nodes, available_nodes
from exgrpo.raylocal import sigterm_held


def launch_slots(cfgs: Iterable[Any], address: str | None,
                 config_of: Callable[[Any], Any] = lambda job: job) -> VerlSlots | None:
    """How a comparison's or sweep's runs (of configs ``cfgs``; a job's config is ``config_of(job)``)
    start on the cluster at ``address``: None, no limit (native runs are one task each, and a veRL job
    on its own private Ray holds nothing here), else veRL runs start only as the cluster can host each
    whole, by its own ``backend.verl``, from what Ray reports free (:class:`VerlSlots`), since runs
    started at once take each other's CPUs and none can start. A run that no state of the cluster
    can host is refused here, in one line, before any work."""
    verl = [c for c in cfgs if _verl_on(c, address)]
    if address is None or not verl:
        return None
    nodes = alive_nodes()
    for v in {c.backend.verl.model_dump_json(): c.backend.verl for c in verl}.values():
        check(v, nodes, address)  # one line for a cluster too small for even a job alone
        if not plan_slots(v, nodes):
            need = needs(v)
            raise ClusterError(
                f"the Ray cluster at {address} can never run these veRL runs (backend.verl.workers_per_node="
                f"{v.workers_per_node}, nnodes={v.nnodes}): beside its workers' node(s) each run needs a node with "
                f"{DRIVER_CPUS} free CPUs for its launcher and TaskRunner and {need.total_cpus + 1} CPUs in all; its "
                f"nodes have: {', '.join(f'{n.cpus:g} CPU/{n.gpus:g} GPU' for n in nodes)}. Add a node, e.g. "
                f"`ray start --address={address} --num-cpus={DRIVER_CPUS + 1}`")
    return VerlSlots(SlotPlan(nodes, available_nodes), config_of, address)


def _verl_on(cfg: Any, address: str | None) -> bool:
    return address is not None and cfg.backend.name == "verl" and cfg.backend.verl.ray_address == address


class VerlSlots:
    """The scheduler's side of a :class:`~exgrpo.backends.verl.resources.SlotPlan`: a job's Ray
    ``.options`` (pinned to the node the plan chose for its launcher) when it can start now."""

    def __init__(self, plan: SlotPlan, config_of: Callable[[Any], Any], address: str) -> None:
        self.plan, self.config_of, self.address = plan, config_of, address

    def take(self, job: Any) -> tuple[dict[str, Any], Any] | None:
        cfg = self.config_of(job)
        if not _verl_on(cfg, self.address):
            return {}, None
        placed = self.plan.place(cfg.backend.verl, f"run {cfg.name} seed {cfg.seed}")
        if placed is None:
            return None
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        handle, node = placed
        return {"scheduling_strategy": NodeAffinitySchedulingStrategy(self.plan.nodes[node].node_id, soft=False)}, handle

    def give_back(self, handle: Any) -> None:
        if handle is not None:
            self.plan.release(handle)


class _FixedSlots:
    """Slots given as a list of Ray ``.options``: a job takes a free one."""

    def __init__(self, options: list[dict[str, Any]]) -> None:
        self.options, self.free = options, list(range(len(options)))

    def take(self, job: Any) -> tuple[dict[str, Any], Any] | None:
        if not self.free:
            return None
        slot = self.free.pop(0)
        return self.options[slot], slot

    def give_back(self, handle: Any) -> None:
        self.free.append(handle)


def run_as_slots_free(jobs: Iterable[Any], launch: Callable[[Any, dict[str, Any]], Any],
                      on_end: Callable[[Any, Any, BaseException | None], None], *,
                      slots: VerlSlots | list[dict[str, Any]] | None = None, limit: int | None = None,
                      poll: Callable[[], None] = lambda: None) -> None:
    """The Ray scheduling loop of comparisons and sweeps: take the next job (``jobs`` is read lazily,
    e.g. a sweep asking its study for the next trial), ``launch(job, options)`` it (a Ray ObjectRef;
    ``options``: the Ray ``.options`` its slot gives, {} without slots) once ``slots`` has room for it
    (:func:`launch_slots`, or a list of ``.options``; in order: a job that must wait holds back those
    after it), and as each one ends, ``on_end(job, result, error)`` (``error`` the exception a failed
    job raised, its ``result`` None). At most ``limit`` jobs run at once (None: as many as the slots,
    or all); ``poll()`` runs about every second (progress, and a held job's next try)."""
    import time

    import ray

    schedule = _FixedSlots(slots) if isinstance(slots, list) else slots
    pending = iter(jobs)
    held: list[Any] = []
    inflight: dict[Any, tuple[Any, Any]] = {}

    def fill() -> None:
        while (limit is None or len(inflight) < limit) and (not isinstance(schedule, _FixedSlots) or schedule.free):
            job = held.pop() if held else next(pending, _NONE)
            if job is _NONE:
                return
            taken = schedule.take(job) if schedule is not None else ({}, None)
            if taken is None:  # no room now: tried again as runs end, or as other work frees the cluster
                held.append(job)
                return
            options, handle = taken
            inflight[launch(job, options)] = (job, handle)

    try:
        fill()
        while inflight or held:
            if inflight:
                with sigterm_held():  # a stop raised inside Ray's wait would be a SystemError: raised after it
                    ready, _ = ray.wait(list(inflight), num_returns=1, timeout=1.0)
            else:
                ready = []
                time.sleep(1.0)
            poll()
            for ref in ready:
                job, handle = inflight.pop(ref)
                if schedule is not None:
                    schedule.give_back(handle)
                try:
                    with sigterm_held():
                        result, error = ray.get(ref), None
                except Exception as e:  # noqa: BLE001 - the job failed (or its worker died): said through on_end
                    result, error = None, e
                on_end(job, result, error)
            fill()
    except BaseException:
        # A stop (or a failure of the loop itself) ends the jobs it started before the caller records them as
        # ended: on a cluster that outlives this process they would otherwise train on, and log into runs
        # already marked KILLED.
        cancel(list(inflight))
        raise


CANCEL_GRACE_SECONDS = 45.0
"""How long a cancelled job has to clean up (a Ray Job it submitted stopped, its run ended) before its
worker is killed."""


def cancel(refs: list[Any], grace_seconds: float | None = None) -> None:
    """End the Ray tasks of ``refs``: interrupted first (a KeyboardInterrupt in the task, whose handlers
    stop what it started elsewhere), then, past ``grace_seconds`` (None: :data:`CANCEL_GRACE_SECONDS`),
    their workers killed."""
    import ray

    if not refs:
        return
    grace_seconds = CANCEL_GRACE_SECONDS if grace_seconds is None else grace_seconds
    for ref in refs:
        with contextlib.suppress(Exception):
            ray.cancel(ref)
    try:
        with contextlib.suppress(Exception), sigterm_held():  # a second stop while they clean up: after the kill
            _, refs = ray.wait(refs, num_returns=len(refs), timeout=grace_seconds)
    finally:
        for ref in refs:
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)


_NONE = object()
"""The end of a job iterator."""

