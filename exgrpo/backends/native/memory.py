"""Process memory settings for a training process (glibc's ``malloc``, Linux).

Why: glibc serves every allocation above 32 MB with a fresh ``mmap`` and returns it to the system
on free. A SmolLM2 step allocates and frees vocabulary-sized tensors (16 x 64 x 49,152 floats =
200 MB each: logits, log-softmax, probabilities, their gradients) dozens of times, so each one is
page-faulted and zero-filled by the kernel again, every step: about a fifth of the step
(``bench/bench_vs_trl.py``). :func:`keep_freed_memory` makes ``malloc`` serve them from the heap and
keep freed memory in the process, so a step reuses the pages of the last one. The price: the
process's resident memory stays at its peak (as with a GPU caching allocator) until the run ends, when
:func:`release_freed_memory` gives the free pages back.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import os

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # mallopt parameters (malloc.h)

ONEDNN_CACHE_ENV = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
ONEDNN_CACHE_PRIMITIVES = 64
"""oneDNN primitives kept per process. oneDNN (bf16 products, packed fp32 ones) compiles one primitive per
shape and keeps the last 1,024 by default, 1-4 MB each with their scratch buffers. A training step's products
take a new shape with every count of real response tokens, so a run fills the whole cache, step after step:
a SmolLM2 process grew by gigabytes over a run and kept them between the runs of a comparison. A step reuses
a shape only among the layers of one pass, a few dozen primitives, which 64 covers."""


@functools.cache
def _libc():
    """glibc, when this process has it (None elsewhere, e.g. macOS or musl: nothing here changes there)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    if libc is None or not hasattr(libc, "mallopt") or not hasattr(libc, "malloc_trim"):
        return None
    libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    libc.malloc_trim.argtypes, libc.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
    return libc


@functools.cache
def keep_freed_memory() -> bool:
    """Tell glibc's malloc to use no ``mmap`` chunks and never trim the heap; True when applied
    (False on a libc without ``mallopt`` and ``malloc_trim``, e.g. macOS or musl: nothing changes there,
    and :func:`release_freed_memory` has nothing to give back)."""
    libc = _libc()
    if libc is None:
        return False
    # trim threshold is an int here; the largest positive int keeps freed heap memory
    return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1))


def release_freed_memory() -> bool:
    """Give the free pages of the heap back to the system (glibc's ``malloc_trim``, after a garbage
    collection); True when it released any. What :func:`keep_freed_memory` keeps serves the next step of a
    run; once the run has ended it only holds the process at the run's peak, so the next run of a
    process (a comparison's worker trains one run after another) would start there and grow from it."""
    gc.collect()
    libc = _libc()
    return bool(libc.malloc_trim(0)) if libc is not None else False


def bound_onednn_cache(primitives: int = ONEDNN_CACHE_PRIMITIVES) -> int:
    """Bound oneDNN's primitive cache (:data:`ONEDNN_CACHE_PRIMITIVES`) unless the user set
    ``ONEDNN_PRIMITIVE_CACHE_CAPACITY``; returns the capacity in force. oneDNN reads the variable when it
    makes its first primitive, so this acts when called before the process's first oneDNN product."""
    return int(os.environ.setdefault(ONEDNN_CACHE_ENV, str(primitives)))
