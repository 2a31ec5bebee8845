"""The compute precision of an LM policy's training forward (``policy.precision``), in one place.

* :func:`compute` — the context the policy's scoring forward runs in: nothing for fp32; for bf16,
  ``torch.autocast("cpu", bfloat16)`` (the weights, their gradients and AdamW's state stay fp32, as in
  mixed-precision training; log-softmax and the entropies run in fp32 on autocast's own list).
* :func:`check_precision` — refuses bf16, in one line naming the CPU flag, on a CPU without bf16
  matmul: there autocast emulates bf16 and runs slower than fp32 (pytorch/pytorch#86550). The flag
  reader :func:`cpu_flags` is the one thing a test replaces.

Why the rollout's log-probs are re-scored (:meth:`~exgrpo.policies.lm.policy.LMPolicy.with_training_log_probs`):
the importance ratio exp(log pi_new - log pi_old) compares two forwards. When pi_new comes from a bf16
forward and pi_old from the fp32 sampler, an on-policy token's ratio starts anywhere in about
0.85-1.25 (docs/speed.md), wider than PPO's clip; veRL recomputes pi_old with the actor for this reason.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from exgrpo.config import ConfigError, Precision

__all__ = ["BF16_CPU_FLAGS", "check_precision", "compute", "cpu_flags", "cpu_name"]

BF16_CPU_FLAGS: Final[tuple[str, ...]] = ("avx512_bf16", "amx_bf16")
"""``/proc/cpuinfo`` flags of an x86 CPU with bf16 matmul instructions (AVX-512 BF16, AMX)."""
CPUINFO: Final[Path] = Path("/proc/cpuinfo")


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from ``/proc/cpuinfo`` (empty where there is no such file)."""
    try:
        text = CPUINFO.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def cpu_name() -> str:
    """The CPU's model name from ``/proc/cpuinfo``, else the platform's processor string."""
    try:
        for line in CPUINFO.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                return value.strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine() or "unknown CPU"


def _torch_bf16_supported() -> bool:
    """torch's own check of oneDNN's bf16 kernels, where this build has it (True where it has none)."""
    import torch

    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    try:
        return bool(check()) if check is not None else True
    except RuntimeError:
        return True


def check_precision(precision: Precision | str, field: str = "policy.precision") -> None:
    """ConfigError, one line naming the CPU flag, when ``precision`` is bf16 and this CPU has no bf16
    matmul (none of :data:`BF16_CPU_FLAGS`, or torch's oneDNN says no); nothing for fp32."""
    if Precision(precision) is Precision.FP32:
        return
    flags = cpu_flags()
    if not any(f in flags for f in BF16_CPU_FLAGS):
        raise ConfigError(f"{field}=bf16 needs a CPU with bf16 matmul ({' or '.join(BF16_CPU_FLAGS)} in /proc/cpuinfo "
                          f"flags); {cpu_name()} has neither, and bf16 there is slower than fp32: set {field}=fp32")
    if not _torch_bf16_supported():
        raise ConfigError(f"{field}=bf16: this CPU has {', '.join(f for f in BF16_CPU_FLAGS if f in flags)}, but torch's "
                          f"oneDNN reports no bf16 support (torch.ops.mkldnn._is_mkldnn_bf16_supported): set {field}=fp32")


@contextlib.contextmanager
def compute(precision: Precision | str) -> Iterator[None]:
    """The block's forward in ``precision``: bf16 autocast on CPU, or as it is (fp32)."""
    if Precision(precision) is Precision.FP32:
        yield
        return
    import torch

    with torch.autocast("cpu", dtype=torch.bfloat16):
        yield
