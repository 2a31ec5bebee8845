"""The one monkeypatch veRL 0.9.1 needs on CPU, and the check that it still fits veRL.

``verl.utils.distributed.initialize_global_process_group_ray`` builds the backend string
``f"cpu:gloo,{device}:{backend}"``; on the cpu platform that is ``"cpu:gloo,cpu:gloo"``, which
torch rejects ("Duplicate device type cpu"). On cpu we pass ``backend="cpu:gloo"``.
"""

from __future__ import annotations

import functools
import hashlib
import inspect


def source_sha256(fn) -> str:
    """sha256 of a function's source (what the guard test compares)."""
    return hashlib.sha256(inspect.getsource(fn).encode()).hexdigest()


def patch_process_group_init() -> None:
    """Wrap veRL's process-group init so the cpu platform gets a single gloo backend (idempotent)."""
    import verl.utils.distributed as dist

    original = dist.initialize_global_process_group_ray
    if getattr(original, "__exgrpo_patched__", False):
        return

    @functools.wraps(original)
    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        from verl.utils.device import get_device_name

        if backend is None and get_device_name() == "cpu":
            backend = "cpu:gloo"
        return original(timeout_second=timeout_second, backend=backend)

    initialize_global_process_group_ray.__exgrpo_patched__ = True  # type: ignore[attr-defined]
    initialize_global_process_group_ray.__exgrpo_original__ = original  # type: ignore[attr-defined]
    dist.initialize_global_process_group_ray = initialize_global_process_group_ray
    import sys

    # modules that imported the name before us (from-imports bind at import time)
    for name in ("verl.workers.engine_workers", "verl.checkpoint_engine.base"):
        mod = sys.modules.get(name)
        if mod is not None and getattr(mod, "initialize_global_process_group_ray", None) is original:
            mod.initialize_global_process_group_ray = initialize_global_process_group_ray
