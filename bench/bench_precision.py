"""The native training step in fp32 vs bf16 (``policy.precision``), and the rollout in both, one process.

    .venv/bin/python bench/bench_precision.py [--model smollm2|tiny-lm] [--pairs 4] [--rollout-repeats 3]

**Step.** Two native trainers of the same config, seed and questions, one per precision: SmolLM2-135M at
its training batch (``experiments/smollm2-arith.yaml`` as ``bench_vs_trl.py`` runs it: 4 prompts x 4
samples x <= 64 tokens, one optimizer step, on-policy GRPO, 2 threads), or the tiny LM's chain regime
(``experiments/tiny-lm-chain-bf16.yaml``'s two arms: 32 x 8 x <= 48 tokens, 2 mini-batches, 1 thread).
After a warm-up step each, ``--pairs`` pairs of steps run interleaved (fp32 then bf16, then bf16 then
fp32, ...), so that drift on shared cores hits both alike. Printed: the median step and the median of
its parts (``time/<phase>_seconds``; bf16 adds ``old_log_prob``, the no-grad bf16 re-score of the fresh
rollouts), the ratio fp32 / bf16 of the whole step and of its training part (old_log_prob + forward +
backward, what the precision changes), and the mean sampled tokens per row of each side: the two
trainers sample the same first batch and drift apart after their first updates, so the rollout's share
can differ by their lengths.

**Rollout.** The policy's fp32 rollout (the tier's decoder, as the trainer samples) against a bf16 one on
the same prompts and seeds: the model's weights copied to bfloat16 (timed with it: a trainer would copy
them after every update) and sampled by the static-KV decoder (the fused decoder runs fp32 only), with
the tier's weight packing. Tokens/s medians over ``--rollout-repeats``, interleaved, and their ratio.

The CPU's name and whether it has bf16 matmul (avx512_bf16 / amx_bf16) are printed beside the figures;
on a CPU without it the bf16 trainer is refused in one line, as ``exgrpo train`` refuses it.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "disabled")
REPO = Path(__file__).resolve().parents[1]

import torch  # noqa: E402

from exgrpo.backends.native.trainer import Trainer  # noqa: E402
from exgrpo.config import ConfigError, load_compare, load_experiment  # noqa: E402
from exgrpo.policies.lm.engine import RolloutEngine  # noqa: E402
from exgrpo.policies.lm.precision import BF16_CPU_FLAGS, cpu_flags, cpu_name  # noqa: E402

TRAINING_PARTS = ("old_log_prob", "forward", "backward")
"""The phases of a step the compute precision changes."""


def configs(model: str, out: Path) -> dict:
    """precision -> the native config of one side."""
    if model == "tiny-lm":
        cc = load_compare(str(REPO / "experiments" / "tiny-lm-chain-bf16.yaml"), {
            "train.eval_before_train": False, "train.eval_every_steps": 10_000, "train.checkpoint_every": 0})
        return {p: cc.arm_config(p, 0).model_copy(update={"output_dir": out / p}) for p in ("fp32", "bf16")}
    return {p: load_experiment(str(REPO / "experiments" / "smollm2-arith.yaml"), {
        "policy.precision": p, "algorithm.replay": "none", "algorithm.group_size": 4, "train.batch_size": 4,
        "policy.max_new_tokens": 64, "train.mini_batches": 1, "train.lr": 1e-5, "train.threads": 2,
        "train.eval_before_train": False, "train.eval_every_steps": 10_000, "train.checkpoint_every": 0,
        "output_dir": str(out / p), "seed": 0}) for p in ("fp32", "bf16")}


def bench_steps(model: str, pairs: int) -> tuple[dict, dict]:
    """Per side: the trainer, its counted steps' metrics."""
    with tempfile.TemporaryDirectory() as d:
        trainers = {p: Trainer(cfg) for p, cfg in configs(model, Path(d)).items()}
        rows: dict[str, list[dict]] = {p: [] for p in trainers}

        def step(p: str) -> dict:
            m = trainers[p].train_step()
            trainers[p].step += 1
            return m

        for p in trainers:
            step(p)  # warm-up, not counted
        for r in range(pairs):
            for p in (("fp32", "bf16") if r % 2 == 0 else ("bf16", "fp32")):
                rows[p].append(step(p))
    return trainers, rows


def bench_rollout(trainer, repeats: int) -> dict[str, float]:
    """Tokens/s medians: the policy's fp32 rollout vs a bf16 copy of its weights (copy timed)."""
    policy, task = trainer.policy, trainer.task
    k, b = trainer.algo.group_size, trainer.cfg.train.batch_size
    prompts = task.prompts([q for q in task.train_ids[:b] for _ in range(k)])
    base = policy.engine

    def fp32(seed: int) -> int:
        return int(policy.generate(prompts, torch.Generator().manual_seed(seed)).mask.sum())

    def bf16(seed: int) -> int:
        model = copy.deepcopy(policy.model).to(torch.bfloat16)
        engine = RolloutEngine(model, base.pad_id, base.eos_id, base.params, decoder="static-kv", prepack=base.prepack)
        return int(engine.generate(prompts, torch.Generator().manual_seed(seed)).mask.sum())

    calls = {"fp32": fp32, "bf16": bf16}
    rates: dict[str, list[float]] = {name: [] for name in calls}
    with torch.no_grad():
        for call in calls.values():
            call(999)  # warm-up
        for rep in range(repeats):
            for name, call in calls.items():
                t0 = time.perf_counter()
                n = call(1000 + rep)
                rates[name].append(n / (time.perf_counter() - t0))
    return {name: statistics.median(v) for name, v in rates.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=["smollm2", "tiny-lm"], default="smollm2")
    ap.add_argument("--pairs", type=int, default=4, help="interleaved fp32/bf16 step pairs after a warm-up each")
    ap.add_argument("--rollout-repeats", type=int, default=3, help="fp32/bf16 rollouts each (0 skips)")
    args = ap.parse_args()
    have = [f for f in BF16_CPU_FLAGS if f in cpu_flags()]
    cpu = f"{cpu_name()} ({', '.join(have) or 'no bf16 matmul'})"
    print(f"native step fp32 vs bf16, {args.model}, CPU: {cpu}, {args.pairs} interleaved pairs, "
          f"load {os.getloadavg()[0]:.2f}", flush=True)
    try:
        trainers, rows = bench_steps(args.model, args.pairs)
    except ConfigError as e:
        sys.exit(f"bench_precision: {e}")
    med = {p: {ph: statistics.median(r[f"time/{ph}_seconds"] for r in rs) for ph in ("step", "rollout", *TRAINING_PARTS)}
           for p, rs in rows.items()}
    for p, rs in rows.items():
        rows_per_step = trainers[p].algo.group_size * trainers[p].cfg.train.batch_size
        tokens = statistics.mean(r["compute/rollout_tokens"] for r in rs) / rows_per_step
        print(f"    {p}  step {med[p]['step']:6.3f} s  ("
              + ", ".join(f"{ph} {med[p][ph]:.3f}" for ph in ("rollout", *TRAINING_PARTS))
              + f"; mean {tokens:.1f} tokens/row)")
    train = {p: sum(med[p][ph] for ph in TRAINING_PARTS) for p in med}
    print(f"    fp32 / bf16: step {med['fp32']['step'] / med['bf16']['step']:.2f}x, training part "
          f"(old_log_prob + forward + backward) {train['fp32'] / train['bf16']:.2f}x   [CPU: {cpu}]")
    if args.rollout_repeats:
        rate = bench_rollout(trainers["fp32"], args.rollout_repeats)
        print(f"    rollout: fp32 {rate['fp32']:.0f} tok/s, bf16 (weights copied each rollout) {rate['bf16']:.0f} tok/s: "
              f"bf16 / fp32 {rate['bf16'] / rate['fp32']:.2f}x   [CPU: {cpu}]")


if __name__ == "__main__":
    main()
