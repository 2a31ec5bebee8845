"""Hardening (issue 10, item 1): the embedded default always starts its own local Ray."""

import os
import subprocess
import sys
from pathlib import Path

STALE = Path("/tmp/ray/ray_current_cluster")


def test_dead_ray_cluster_file_does_not_break_local_runs():
    """A `ray start --head` cluster that died without `ray stop` leaves ray_current_cluster behind;
    before the fix every sweep/compare then failed ("When connecting to an existing cluster, num_cpus
    and num_gpus must not be provided")."""
    code = (
        "import ray\n"
        "from exgrpo.sweep.runner import ensure_ray\n"
        "ensure_ray()\n"
        "print(ray.get(ray.remote(lambda: 41 + 1).remote()))\n"
        "ray.shutdown()\n"
    )
    saved = STALE.read_text() if STALE.exists() else None
    STALE.parent.mkdir(parents=True, exist_ok=True)
    STALE.write_text("127.0.0.1:9")  # a GCS address nobody listens on: the dead cluster
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180,
                             env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    finally:
        if saved is None:
            STALE.unlink(missing_ok=True)
        else:
            STALE.write_text(saved)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["42"]
