"""Toy-tier step throughput: GRPO vs paper ExGRPO (replay on) vs the notebook variant, one process.

Prints ms/step for each and the ratio against GRPO (the baseline measured in the same run), so the
cost of replay (pool sampling, selection forward pass, pool update) is visible; then GRPO's step with
the toy policy's row dedupe done by ``torch.unique(dim=0)`` (the code before ``unique_rows``; the same
values), as the baseline of that change.

    .venv/bin/python bench/bench_toy_step.py [--steps 200]
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch

from exgrpo.policies import mlp_policy
from exgrpo.backends.native.trainer import Trainer
from exgrpo.config import load_experiment

REPLAY_ON = {"none": {}, "buckets": {"algorithm.replay_start_pass_rate": 0.0}, "notebook": {"algorithm.notebook.warm": 0}}
"""Each algorithm's own setting that makes it replay from the first step."""


def ms_per_step(replay: str, steps: int, out: str) -> float:
    cfg = load_experiment(
        "experiments/toy-exgrpo.yaml",
        {"algorithm.replay": replay, "train.max_steps": steps, "train.eval_every_epochs": 1000,
         "output_dir": out, "name": f"bench-{replay}", **REPLAY_ON[replay]},
    )
    trainer = Trainer(cfg)
    for _ in range(5):  # warm-up (and fill the pool)
        trainer.train_step()
        trainer.step += 1
    t0 = time.perf_counter()
    for _ in range(steps):
        trainer.train_step()
        trainer.step += 1
    return 1000 * (time.perf_counter() - t0) / steps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as out:
        base = ms_per_step("none", args.steps, out)
        print(f"{'algorithm':<10} {'ms/step':>8} {'vs grpo':>8}   (B=128 questions, K=16, 5x256 MLP, 1 thread)")
        print(f"{'grpo':<10} {base:8.2f} {1.0:8.2f}x")
        for replay in ("buckets", "notebook"):
            ms = ms_per_step(replay, args.steps, out)
            print(f"{replay:<10} {ms:8.2f} {ms / base:8.2f}x")
        fast = mlp_policy.unique_rows
        mlp_policy.unique_rows = lambda x: torch.unique(x, dim=0, return_inverse=True)
        try:
            old = ms_per_step("none", args.steps, out)
        finally:
            mlp_policy.unique_rows = fast
        print(f"grpo with torch.unique(dim=0) as the row dedupe: {old:.2f} ms/step, unique_rows {old / base:.2f}x faster")


if __name__ == "__main__":
    main()
