"""The experience pool at scale: packed layout vs the unpacked legacy layout, one run.

Grows a synthetic pool (questions with 2 correct trajectories of ``--tokens`` tokens each, buckets
1..7 of K = 8) to each size and prints, per layout: resident bytes per stored token (process RSS),
insert time per group, sample + select time per step for a batch of 128 questions (bucket draw,
fetching their trajectories, padding them for the scorer), and checkpoint save / load time and
MB/s (``torch.save`` / ``torch.load(weights_only=True)`` + ``load_state_dict``). Each (layout, size)
runs in a fresh process, so RSS is its own. The old layout is skipped where it would not fit in RAM.

    .venv/bin/python bench/bench_pool.py [--sizes 10000,100000,1000000] [--tokens 512]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

OLD_BYTES_PER_TOKEN = 81
"""The old layout's resident cost (measured, and confirmed by this bench at 10 k)."""


def _rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def measure(layout: str, n_traj: int, n_tokens: int, seed: int = 0) -> dict[str, float]:
    """Build a pool of ``n_traj`` trajectories in this process and time it (see the module doc)."""
    import numpy as np
    import torch

    from exgrpo.core.pool import ExperiencePool, Trajectory
    from exgrpo.core.sampler import sample_questions
    from exgrpo.core.selection import pad_right

    torch.set_num_threads(1)
    if layout == "packed":
        pool = ExperiencePool(group_size=8)

        def sample_select(rng):  # the packed pool's path in BucketReplay.select
            qids = sample_questions(pool.bucket_views(), 128, 8, rng)
            return pool.padded([r for q in qids for r in pool.rows(q)])
    else:
        sys.path.insert(0, str(Path(__file__).parent))
        from legacy_pool import LegacyPool

        pool = LegacyPool(group_size=8)

        def sample_select(rng):  # the old path: a bucket scan, Python tuples padded one by one
            qids = sample_questions(pool.buckets(), 128, 8, rng)
            return pad_right([t.tokens for q in qids for t in pool.trajectories(q)])
    rng = np.random.default_rng(seed)
    gc.collect()
    rss0 = _rss()
    insert = 0.0
    block = 1024  # trajectories generated at a time (their generation is not timed)
    for first in range(0, n_traj, block):
        tokens = rng.integers(0, 32_000, size=(block, n_tokens), dtype=np.int32)
        log_prob = -rng.random((block, n_tokens), dtype=np.float32)
        for i in range(0, min(block, n_traj - first), 2):
            q = (first + i) // 2
            group = [Trajectory(tuple(tokens[j].tolist()), tuple(log_prob[j].tolist()), 0.5, q // 64)
                     for j in (i, i + 1)]
            t0 = time.perf_counter()
            pool.observe_group(q, 1 + q % 7, group, q // 64)
            insert += time.perf_counter() - t0
        del tokens, log_prob, group
    gc.collect()
    stored = n_traj * n_tokens
    out = {"trajectories": n_traj, "tokens": stored, "bytes_per_token": (_rss() - rss0) / stored,
           "insert_us_per_group": 1e6 * insert / (n_traj // 2)}

    steps, t0 = 20, time.perf_counter()
    for _ in range(steps):
        sample_select(rng)
    out["sample_select_ms"] = 1e3 * (time.perf_counter() - t0) / steps

    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as d:
        path = Path(d) / "pool.pt"
        t0 = time.perf_counter()
        torch.save(pool.state_dict(), path)
        out["save_s"] = time.perf_counter() - t0
        size = path.stat().st_size
        pool = None  # freed before the load is measured (the closures above hold the name, not the pool)
        gc.collect()
        t0 = time.perf_counter()
        other = ExperiencePool(group_size=8) if layout == "packed" else LegacyPool(group_size=8)
        other.load_state_dict(torch.load(path, weights_only=True))
        out["load_s"] = time.perf_counter() - t0
        out["file_mb"] = size / 2**20
    return out


def _child(layout: str, n_traj: int, n_tokens: int) -> dict[str, float] | str:
    cmd = [sys.executable, __file__, "--child", layout, str(n_traj), "--tokens", str(n_tokens)]
    res = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if res.returncode != 0:
        return f"failed: {(res.stderr.strip().splitlines() or ['?'])[-1][:80]}"
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="10000,100000,1000000", help="pool sizes in trajectories")
    ap.add_argument("--tokens", type=int, default=512, help="tokens per trajectory")
    ap.add_argument("--child", nargs=2, metavar=("LAYOUT", "N"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.child[0], int(args.child[1]), args.tokens)))
        return
    import psutil

    ram = psutil.virtual_memory().total
    print(f"pool of N trajectories x {args.tokens} tokens, 2 per question, K=8; batch 128; "
          f"{os.cpu_count()} cores, {ram / 2**30:.0f} GiB RAM")
    head = (f"{'N':>9} {'layout':<7} {'B/token':>8} {'insert us/group':>16} {'sample+select ms':>17} "
            f"{'save s':>8} {'load s':>8} {'save MB/s':>10} {'load MB/s':>10}")
    print(head)
    for n in (int(x) for x in args.sizes.split(",")):
        for layout in ("packed", "old"):
            need = OLD_BYTES_PER_TOKEN * n * args.tokens * (2 if layout == "old" else 0)  # pool + its checkpoint
            if layout == "old" and need > 0.8 * ram:
                print(f"{n:>9} {layout:<7} skipped: needs about {need / 2**30:.0f} GiB "
                      f"({OLD_BYTES_PER_TOKEN} B/token, twice over while checkpointing)")
                continue
            r = _child(layout, n, args.tokens)
            if isinstance(r, str):
                print(f"{n:>9} {layout:<7} {r}")
                continue
            print(f"{n:>9} {layout:<7} {r['bytes_per_token']:8.1f} {r['insert_us_per_group']:16.1f} "
                  f"{r['sample_select_ms']:17.2f} {r['save_s']:8.2f} {r['load_s']:8.2f} "
                  f"{r['file_mb'] / r['save_s']:10.0f} {r['file_mb'] / r['load_s']:10.0f}", flush=True)


if __name__ == "__main__":
    main()
