"""A ``cpu`` platform for veRL's platform registry (selected with ``VERL_PLATFORM=cpu``).

veRL schedules workers on Ray "GPU" resources; on a CPU machine the driver gives Ray as many
logical GPUs as workers (``ray_init.num_gpus``), so veRL's resource pools schedule unchanged while
every tensor stays on the CPU and collectives run on gloo.
"""

from __future__ import annotations

import contextlib
import os
from types import ModuleType
from typing import Any

import torch
from verl.plugin.platform.platform_base import PlatformBase


class _CPUDeviceModule(ModuleType):
    """``torch.cpu`` plus the ``torch.cuda``-style calls veRL makes (memory queries, caches), as
    no-ops or host-memory answers."""

    def __init__(self) -> None:
        super().__init__("exgrpo_cpu_device")

    def __getattr__(self, name: str) -> Any:
        if hasattr(torch.cpu, name):
            return getattr(torch.cpu, name)
        if name == "mem_get_info":
            return _mem_get_info
        if name in {"manual_seed", "manual_seed_all"}:
            return lambda seed: torch.manual_seed(seed)
        if name == "get_rng_state":
            return lambda *a, **k: torch.get_rng_state()
        if name == "set_rng_state":
            return lambda state, *a, **k: torch.set_rng_state(state)
        if name in {"memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved"}:
            return lambda *a, **k: 0
        if name in {"empty_cache", "reset_peak_memory_stats", "set_device", "ipc_collect"}:
            return lambda *a, **k: None
        if name == "memory_stats":
            return lambda *a, **k: {}
        if name == "get_device_name":
            return lambda *a, **k: "CPU"
        raise AttributeError(f"torch.cpu has no {name!r} (exgrpo cpu platform)")


def _mem_get_info(*args: Any, **kwargs: Any) -> tuple[int, int]:
    pages, size = os.sysconf("SC_AVPHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    total = os.sysconf("SC_PHYS_PAGES") * size
    return pages * size, total


CPU_DEVICE_MODULE = _CPUDeviceModule()


class CPUPlatform(PlatformBase):
    """Device ``cpu``, collectives on gloo, Ray resource ``GPU`` (logical, one per worker)."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> ModuleType:
        return CPU_DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return os.environ.get("VERL_PLATFORM", "").strip().lower() == "cpu"

    def current_device(self) -> str:  # type: ignore[override]
        # veRL passes this straight to .to(...): an int 0 would mean "accelerator 0" to torch
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        return {"num_gpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None
