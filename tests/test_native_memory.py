"""A training process's memory does not grow with the shapes its products see: oneDNN's primitive cache is
bounded (exgrpo.backends.native.memory.bound_onednn_cache), so a run whose token counts change every step,
and the runs after it in one process, do not keep a compiled primitive for each. And what glibc keeps of a
run's freed memory (train.keep_freed_memory) goes back to the system when the run ends."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from exgrpo.policies.lm.precision import bf16_matmul, cpu_flags

SHAPES = """
import sys, torch
if sys.argv[1] == "bounded":
    from exgrpo.backends.native.memory import bound_onednn_cache
    bound_onednn_cache()
torch.set_num_threads(1)
def rss():
    return [int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS")][0] / 1e3
mlp = torch.randn(1536, 576, requires_grad=True)
head = torch.randn(49152, 576, requires_grad=True)  # SmolLM2's layer and head shapes
marks = []
for i, m in enumerate(range(300, 540, 3)):  # 80 token counts, as 80 mini-batches of a run would give
    x = torch.randn(m, 576, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = torch.nn.functional.linear(x, mlp).float().sum() + torch.nn.functional.linear(x, head).float().sum()
    y.backward()
    if i in (29, 79):
        marks.append(rss())
print(marks[1] - marks[0])  # MB gained over the last 50 shapes, once any bounded cache is full
"""


@pytest.mark.slow
@pytest.mark.skipif(not bf16_matmul(cpu_flags()), reason="bf16 products go through oneDNN on a CPU with bf16 matmul")
def test_products_of_ever_new_shapes_leave_the_memory_bounded(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "ONEDNN_PRIMITIVE_CACHE_CAPACITY"}
    growth = {}
    for kind in ("default", "bounded"):
        readings = []
        for _ in range(2):  # RSS also moves with what the kernel does to the heap's pages meanwhile (busy hosts,
            out = subprocess.run([sys.executable, "-c", SHAPES, kind], env=env, capture_output=True, text=True,
                                 timeout=300)  # huge pages): the smaller of two readings; a cache grows in both
            assert out.returncode == 0, out.stderr[-2000:]
            readings.append(float(out.stdout.split()[-1]))  # MB
        growth[kind] = min(readings)
    if growth["default"] < 100:
        pytest.skip(f"oneDNN's default cache grew by {growth['default']:.0f} MB here: nothing to bound on this CPU")
    assert growth["bounded"] < growth["default"] / 4, growth


RELEASE = """
import sys, torch
from exgrpo.backends.native.memory import keep_freed_memory, release_freed_memory
def rss():
    return [int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS")][0] / 1e3
assert keep_freed_memory()
blocks = [torch.ones(64, 1 << 20) for _ in range(2)]  # 2 x 256 MB, from the heap, as a step's tensors are
blocks.append(torch.ones(1 << 10))  # something alive above them, as a run's tensors are
del blocks[:2]
kept = rss()
if sys.argv[1] == "release":
    release_freed_memory()
print(kept - rss())  # MB given back
"""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_the_memory_a_run_kept_goes_back_to_the_system_when_it_ends():
    """What keep_freed_memory keeps in the heap (here two freed 256 MB blocks below a live one, which glibc
    never trims on its own) is given back by release_freed_memory, which the native backend calls at a
    run's end: the next run of a comparison's worker starts from what is alive."""
    given_back = {}
    for kind in ("keep", "release"):
        out = subprocess.run([sys.executable, "-c", RELEASE, kind], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        given_back[kind] = float(out.stdout.split()[-1])
    assert given_back["keep"] < 50 and given_back["release"] > 400, given_back
