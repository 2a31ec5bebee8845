"""The compute precision of an LM policy's training forward (``policy.precision``), in one place.

* :func:`compute` — the context the policy's scoring forward runs in: nothing for fp32; for bf16,
  ``torch.autocast("cpu", bfloat16)`` (the weights, their gradients and AdamW's state stay fp32, as in
  mixed-precision training; log-softmax and the entropies run in fp32 on autocast's own list).
* :func:`check_precision` — refuses bf16, in one line naming the CPU flag, on a CPU without bf16
  matmul: there autocast emulates bf16 and runs slower than fp32 (pytorch/pytorch#86550).
* :func:`check_weights_dtype` — refuses bf16 weights (``policy.dtype: bfloat16``) on a CPU without
  oneDNN's bf16 kernels, where the decoders' weight prepack raises.

Both read x86 ``flags`` and ARM ``Features`` from ``/proc/cpuinfo``; both take the text of another
CPU's ``/proc/cpuinfo`` instead, which is how the tests show them CPUs this machine is not.

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

__all__ = [
    "ARM_BF16_FEATURE", "BF16_CPU_FLAGS", "BF16_WEIGHT_FLAGS", "bf16_matmul", "bf16_weights", "check_precision",
    "check_weights_dtype", "compute", "cpu_flags", "cpu_name",
]

BF16_CPU_FLAGS: Final[tuple[str, ...]] = ("avx512_bf16", "amx_bf16")
"""``/proc/cpuinfo`` flags of an x86 CPU with bf16 matmul instructions (AVX-512 BF16, AMX)."""
ARM_BF16_FEATURE: Final[str] = "bf16"
"""The ``Features`` entry of an ARM CPU with bf16 instructions (BFDOT, BFMMLA: Armv8.6, e.g. Neoverse
V1 and N2), which oneDNN's bf16 matmul uses there."""
BF16_WEIGHT_FLAGS: Final[tuple[tuple[str, ...], ...]] = (("avx512bw", "avx512vl", "avx512dq"), ("avx_ne_convert",))
"""x86 flag sets (any one, complete) under which oneDNN has bf16 kernels; torch's own check
(``mkldnn_bf16_device_check``) asks for the same, and without them reordering bf16 weights for oneDNN
(the static-KV decoder's prepack) raises."""
CPUINFO: Final[Path] = Path("/proc/cpuinfo")


def _cpuinfo(text: str | None) -> str:
    """``text``, else this machine's ``/proc/cpuinfo`` ("" where there is no such file)."""
    if text is not None:
        return text
    try:
        return CPUINFO.read_text()
    except OSError:
        return ""


def _field(text: str, *keys: str) -> str | None:
    """The value of the first line of ``text`` whose key is one of ``keys``."""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in keys:
            return value.strip()
    return None


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The CPU's feature flags from ``/proc/cpuinfo`` text (default: this machine's): an x86 CPU's
    ``flags`` line, an ARM CPU's ``Features`` line; empty where there is neither."""
    return frozenset((_field(_cpuinfo(cpuinfo), "flags", "Features") or "").split())


def cpu_name(cpuinfo: str | None = None) -> str:
    """The CPU's name from ``/proc/cpuinfo`` text (default: this machine's): an x86 CPU's model name, an
    ARM CPU's implementer and part numbers; else the platform's processor string."""
    text = _cpuinfo(cpuinfo)
    name = _field(text, "model name")
    if name:
        return name
    part = _field(text, "CPU part")
    if part:
        return f"an ARM CPU (implementer {_field(text, 'CPU implementer')}, part {part})"
    import platform

    return platform.processor() or platform.machine() or "unknown CPU"


def bf16_matmul(flags: frozenset[str]) -> bool:
    """The CPU has bf16 matmul instructions (any of :data:`BF16_CPU_FLAGS`, or :data:`ARM_BF16_FEATURE`)."""
    return ARM_BF16_FEATURE in flags or any(f in flags for f in BF16_CPU_FLAGS)


def bf16_weights(flags: frozenset[str]) -> bool:
    """oneDNN runs bf16 weights on the CPU (one of :data:`BF16_WEIGHT_FLAGS` complete, or an ARM CPU's
    :data:`ARM_BF16_FEATURE`)."""
    return ARM_BF16_FEATURE in flags or any(all(f in flags for f in group) for group in BF16_WEIGHT_FLAGS)


def _torch_bf16_supported() -> bool:
    """torch's own check of oneDNN's bf16 kernels, where this build has it (True where it has none)."""
    import torch

    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    try:
        return bool(check()) if check is not None else True
    except RuntimeError:
        return True


_WHERE = "in /proc/cpuinfo's flags, or bf16 in an ARM CPU's Features"


def check_precision(precision: Precision | str, field: str = "policy.precision", cpuinfo: str | None = None) -> None:
    """ConfigError, one line naming the CPU flag, when ``precision`` is bf16 and this CPU (``cpuinfo``:
    the text of its ``/proc/cpuinfo``, default this machine's) has no bf16 matmul (:func:`bf16_matmul`,
    or torch's oneDNN says no); nothing for fp32."""
    if Precision(precision) is Precision.FP32:
        return
    flags = cpu_flags(cpuinfo)
    if not bf16_matmul(flags):
        raise ConfigError(f"{field}=bf16 needs a CPU with bf16 matmul ({' or '.join(BF16_CPU_FLAGS)} {_WHERE}); "
                          f"{cpu_name(cpuinfo)} has none, and bf16 there is slower than fp32: set {field}=fp32")
    if cpuinfo is None and not _torch_bf16_supported():  # torch speaks for this machine, not for ``cpuinfo``'s
        have = ", ".join(f for f in (*BF16_CPU_FLAGS, ARM_BF16_FEATURE) if f in flags)
        raise ConfigError(f"{field}=bf16: this CPU has {have}, but torch's oneDNN reports no bf16 support "
                          f"(torch.ops.mkldnn._is_mkldnn_bf16_supported): set {field}=fp32")


def check_weights_dtype(dtype: str, field: str = "policy.dtype", cpuinfo: str | None = None,
                        spelled: tuple[str, str] | None = None) -> None:
    """ConfigError, one line naming the CPU flags, when ``dtype`` is bfloat16 and this CPU (``cpuinfo``
    as in :func:`check_precision`) has no oneDNN bf16 kernels (:func:`bf16_weights`, or torch says no):
    the decoders' prepacked bf16 weights need them; nothing for float32."""
    if dtype == "float32":
        return
    asked, fallback = spelled or (dtype, "float32")  # how ``field`` spells bf16 and its fp32 fallback
    needs = " or ".join(", ".join(group) for group in BF16_WEIGHT_FLAGS)
    if not bf16_weights(cpu_flags(cpuinfo)):
        raise ConfigError(f"{field}={asked} needs a CPU with oneDNN's bf16 kernels ({needs} {_WHERE}); "
                          f"{cpu_name(cpuinfo)} has none: set {field}={fallback}")
    if cpuinfo is None and not _torch_bf16_supported():
        raise ConfigError(f"{field}={asked}: torch's oneDNN reports no bf16 support on this CPU "
                          f"(torch.ops.mkldnn._is_mkldnn_bf16_supported): set {field}={fallback}")


@contextlib.contextmanager
def compute(precision: Precision | str) -> Iterator[None]:
    """The block's forward in ``precision``: bf16 autocast on CPU, or as it is (fp32)."""
    if Precision(precision) is Precision.FP32:
        yield
        return
    import torch

    with torch.autocast("cpu", dtype=torch.bfloat16):
        yield
