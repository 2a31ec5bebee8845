"""Process memory settings for a training process (glibc's ``malloc``, Linux).

Why: glibc serves every allocation above 32 MB with a fresh ``mmap`` and returns it to the system
on free. A SmolLM2 step allocates and frees vocabulary-sized tensors (16 x 64 x 49,152 floats =
200 MB each: logits, log-softmax, probabilities, their gradients) dozens of times, so each one is
page-faulted and zero-filled by the kernel again, every step: about a fifth of the step
(``bench/bench_vs_trl.py``). :func:`keep_freed_memory` makes ``malloc`` serve them from the heap and
keep freed memory in the process, so a step reuses the pages of the last one. The price: the
process's resident memory stays at its peak (as with a GPU caching allocator).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # mallopt parameters (malloc.h)


@functools.cache
def keep_freed_memory() -> bool:
    """Tell glibc's malloc to use no ``mmap`` chunks and never trim the heap; True when applied
    (False on a libc without ``mallopt``, e.g. macOS or musl: nothing changes there)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        mallopt = libc.mallopt if libc is not None else None
    except (OSError, AttributeError):
        return False
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # trim threshold is an int here; the largest positive int keeps freed heap memory
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, 2**31 - 1))
