"""A training process's memory does not grow with the shapes its products see: oneDNN's primitive cache is
bounded (exgrpo.backends.native.memory.bound_onednn_cache), so a run whose token counts change every step,
and the runs after it in one process, do not keep a compiled primitive for each."""

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
        out = subprocess.run([sys.executable, "-c", SHAPES, kind], env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        growth[kind] = float(out.stdout.split()[-1])  # MB
    if growth["default"] < 100:
        pytest.skip(f"oneDNN's default cache grew by {growth['default']:.0f} MB here: nothing to bound on this CPU")
    assert growth["bounded"] < growth["default"] / 4, growth
