"""The replay-core refactor (issue 8) changed no number: fixed-seed runs reproduce the per-step
metrics recorded before it, bit for bit (tests/golden.py records them)."""

import json

import pytest

from golden import FIXTURES, RUNS, run_pinned

RECORDED = json.loads(FIXTURES.read_text())
DROPPED = {"notebook/lambda"}
"""Keys the old trainer logged for every algorithm; now only the notebook strategy reports them."""
ADDED = {"compute/rollout_tokens", "compute/grad_tokens", "train/accuracy"}
"""Keys logged since the recording (new metrics, not changed numbers)."""


@pytest.mark.parametrize("name", sorted(RUNS))
def test_fixed_seed_run_reproduces_recorded_metrics(tmp_path, name):
    got = [{k: v for k, v in row.items() if k not in ADDED} for row in run_pinned(name, tmp_path / "out", tmp_path / "cache")]
    want = [{k: v for k, v in row.items() if k not in ADDED} for row in RECORDED[name]]
    if not name.endswith("notebook"):
        want = [{k: v for k, v in row.items() if k not in DROPPED} for row in want]
    assert len(got) == len(want)
    for step, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g == w, f"{name} step {step}: " + str({k: (g.get(k), w.get(k)) for k in set(g) | set(w) if g.get(k) != w.get(k)})
