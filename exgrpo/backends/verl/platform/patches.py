"""The monkeypatches veRL 0.9.1 needs on CPU, and the check that they still fit veRL.

``verl.utils.distributed.initialize_global_process_group_ray`` builds the backend string
``f"cpu:gloo,{device}:{backend}"``; on the cpu platform that is ``"cpu:gloo,cpu:gloo"``, which
torch rejects ("Duplicate device type cpu"). On cpu we pass ``backend="cpu:gloo"``.

veRL's rollout servers (vLLM's HTTP server among them) bind the address ``ray.util.get_node_ip_address``
reports, and Ray never reports loopback (``ray.init(_node_ip_address="127.0.0.1")`` is resolved to
the host's address). A private local run (:data:`LOOPBACK_ENV` set by the runner) answers
127.0.0.1 instead, so its servers are not reachable from the network.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import logging

from exgrpo.backends.verl.live import LOOPBACK_ENV


def source_sha256(fn) -> str:
    """sha256 of a function's source (what the guard test compares)."""
    return hashlib.sha256(inspect.getsource(fn).encode()).hexdigest()


def bind_loopback() -> None:
    """Under :data:`LOOPBACK_ENV`, ``ray.util.get_node_ip_address()`` is 127.0.0.1 (idempotent)."""
    import os

    import ray.util

    original = ray.util.get_node_ip_address
    if os.environ.get(LOOPBACK_ENV) != "1" or getattr(original, "__exgrpo_patched__", False):
        return

    @functools.wraps(original)
    def get_node_ip_address(*args, **kwargs) -> str:
        return "127.0.0.1"

    get_node_ip_address.__exgrpo_patched__ = True  # type: ignore[attr-defined]
    ray.util.get_node_ip_address = get_node_ip_address


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


class OncePerProcess(logging.Filter):
    """Lets the first record of each message template through, drops the repeats."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg in self.seen:
            return False
        self.seen.add(str(record.msg))
        return True


REPEATED_WARNINGS = ("verl.utils.tokenizer.continuous_token_wiring",)
"""Loggers that warn the same thing for every request (veRL's agent loop: "No model-specific Continuous
Token builder is registered ... falling back to default", about 80 lines a step): said once per process."""


def quiet_repeated_warnings() -> None:
    for name in REPEATED_WARNINGS:
        log = logging.getLogger(name)
        if not any(isinstance(f, OncePerProcess) for f in log.filters):
            log.addFilter(OncePerProcess())
