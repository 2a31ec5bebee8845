"""One line per device path a veRL job takes, printed by the process that takes it.

On a GPU the paths that only CUDA takes are vLLM's sleep mode (its weights and KV cache released for
training), the CUDA IPC weight sync from the FSDP actor to vLLM, the actor's bf16 compute under FSDP,
and NCCL collectives. None of them can run on this project's CPU CI, so a GPU user's first run must
say, for each, that it ran and how (``exgrpo gpu-smoke`` reads these lines back from the job's log).
The same hooks print the CPU form of each path (sleep mode off, shared-memory buckets, fp32 compute,
gloo) in every CPU run, where the tests check them.

A line reads ``exgrpo path <name>: <what ran>`` (:mod:`exgrpo.backends.verl.path_lines` reads them back);
each name is printed once per process:

* ``sleep-mode`` by the vLLM server, at its first release of the GPU for training;
* ``weight-sync`` by each FSDP worker, after its first weight sync to vLLM;
* ``actor`` and ``collectives`` by each FSDP worker, after its first training micro-batches.
"""

from __future__ import annotations

import functools
from typing import Any

from exgrpo.backends.verl.path_lines import line

_SAID: set[str] = set()


def report(name: str, text: str) -> None:
    """Print ``exgrpo path <name>: <text>`` the first time this process reports ``name``."""
    if name in _SAID:
        return
    _SAID.add(name)
    print(line(name, text), flush=True)


def device_free_gib() -> float | None:
    """Free memory of this process's CUDA device in GiB (None without CUDA)."""
    import torch

    if not torch.cuda.is_available():
        return None
    free, _total = torch.cuda.mem_get_info()
    return free / 2**30


async def sleep_and_report(server: Any, sleep) -> None:
    """Run the vLLM server's ``sleep`` and report what it released (the server's ``free_cache_engine``
    decides whether it sleeps at all: veRL's CPU overrides turn it off)."""
    if not server.config.free_cache_engine:
        await sleep()
        report("sleep-mode", "off (rollout.free_cache_engine=False): vLLM keeps its weights and KV cache")
        return
    try:
        before = device_free_gib()
    except Exception:  # noqa: BLE001 - a report must never stop the sleep it reports on
        before = None
    await sleep()
    try:
        after = device_free_gib()
    except Exception:  # noqa: BLE001
        after = None
    if server.node_rank != 0:
        return
    freed = "" if before is None or after is None else f": the GPU's free memory went from {before:.1f} to {after:.1f} GiB"
    report("sleep-mode", f"vLLM released its GPU memory for training (level {server._resolve_sleep_level()}){freed}")


def report_weight_sync(use_shm: bool, n_tensors: int, megabytes: float) -> None:
    how = "shared-memory buckets" if use_shm else "CUDA IPC buckets"
    report("weight-sync", f"{how}: {n_tensors} tensors, {megabytes:.1f} MB from the FSDP actor to vLLM")


def wrap_engine(engine_cls: type) -> type:
    """Wrap ``engine_cls.forward_backward_batch`` (veRL's FSDP engine) so that its first training call
    reports the dtype the actor's linear layers compute in and the backend of its collectives (idempotent)."""
    original = engine_cls.forward_backward_batch
    if getattr(original, "__exgrpo_reports__", False):
        return engine_cls

    @functools.wraps(original)
    def forward_backward_batch(self, data, loss_function, forward_only=False):
        if forward_only or "actor" in _SAID:
            return original(self, data, loss_function, forward_only=forward_only)
        import torch

        seen: dict[str, Any] = {}
        linear = next((m for m in self.module.modules() if isinstance(m, torch.nn.Linear)), None)

        def look(module, args):
            if args and torch.is_tensor(args[0]) and "input" not in seen:
                seen["input"], seen["weight"] = args[0].dtype, module.weight.dtype

        hook = linear.register_forward_pre_hook(look) if linear is not None else None
        try:
            out = original(self, data, loss_function, forward_only=forward_only)
        finally:
            if hook is not None:
                hook.remove()
        try:
            report_actor(self, seen)
        except Exception as e:  # noqa: BLE001 - a report must never stop the training it reports on
            report("actor", f"not reported ({type(e).__name__}: {e})")
        return out

    forward_backward_batch.__exgrpo_reports__ = True  # type: ignore[attr-defined]
    engine_cls.forward_backward_batch = forward_backward_batch
    return engine_cls


def report_actor(engine: Any, seen: dict[str, Any]) -> None:
    import torch.distributed as dist
    from verl.utils.fsdp_utils import fsdp_version

    version = {1: "FSDP", 2: "FSDP2"}.get(fsdp_version(engine.module), "not FSDP")
    dtypes = f"inputs {seen.get('input')}, weights {seen.get('weight')}" if seen else "no linear layer seen"
    report("actor", f"{version}; the first linear layer computed with {dtypes}")
    group = engine.get_data_parallel_group()
    report("collectives", f"{dist.get_backend(group)} (data-parallel all_reduce of the batch's token count over "
                          f"{dist.get_world_size(group)} rank(s))")


def install() -> None:
    """Wrap the engine class veRL picks for the actor (``EngineRegistry.get_engine_cls``; idempotent). The
    vLLM server and rollout adapter report from their subclasses (:mod:`.vllm_seeded`)."""
    import os

    if not os.environ.get("VERL_ENGINE_DEVICE"):  # not a veRL job (every job's runner sets it): a native run
        return  # imports veRL's losses only, and the engine module's device probe would warn there
    from verl.workers.engine.base import EngineRegistry

    original = EngineRegistry.get_engine_cls
    if getattr(original, "__exgrpo_reports__", False):
        return

    def get_engine_cls(model_type: str, backend: str):
        cls = original(model_type, backend)
        return wrap_engine(cls) if hasattr(cls, "forward_backward_batch") and hasattr(cls, "get_data_parallel_group") \
            else cls

    get_engine_cls.__exgrpo_reports__ = True  # type: ignore[attr-defined]
    EngineRegistry.get_engine_cls = staticmethod(get_engine_cls)
