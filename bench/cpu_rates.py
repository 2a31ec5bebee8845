"""This CPU's rates at SmolLM2's shapes: what a training phase's FLOPs and a decode step's weight reads cost at best.

    .venv/bin/python bench/cpu_rates.py [--threads 1] [--rows 224] [--repeats 20]

**Products.** ``(rows, d_in) @ (d_in, d_out)`` in fp32 and in bf16 (torch's CPU ``mm``, the kernel of the
training forward's and backward's linears) at SmolLM2-135M's layer shapes (hidden 576, MLP 1,536, GQA
keys and values 192) and its LM head (49,152 outputs, 85-row blocks as the chunked head runs them), and
the backward's weight-gradient shape ``(d_out, rows) @ (rows, d_in)``. ``--rows``: tokens a product
sees (a SmolLM2 mini-batch: ~150-300). Printed per shape: GFLOP/s, the best of ``--repeats`` timed runs
after a warm-up (the products' best sustained rate: a phase's bound divides its FLOPs by it).

**Weight reads.** A decode step reads every weight once for a few rows, so its floor is the weights'
bytes over the memory's read rate: the sum of a 270 MB bf16 tensor (SmolLM2's weights in bf16, too large
for any cache) and a 270 MB copy, GB/s.

The CPU's name and its bf16 flags are printed first; on a CPU without bf16 matmul the bf16 rows are the
emulated rate (several times slower than fp32 there: why ``policy.precision=bf16`` is refused).
"""

from __future__ import annotations

import argparse
import time

import torch

from exgrpo.policies.lm.precision import ARM_BF16_FEATURE, BF16_CPU_FLAGS, bf16_matmul, cpu_flags, cpu_name

HIDDEN, MLP, KV, VOCAB, HEAD_ROWS = 576, 1536, 192, 49152, 85
WEIGHT_BYTES = 270_000_000
"""SmolLM2-135M's weights in bf16 (134.5 M parameters)."""


def shapes(rows: int) -> list[tuple[str, int, int, int]]:
    """(name, m, k, n) of the products a training step runs, ``rows`` tokens at a time."""
    return [
        ("q, o (576 -> 576)", rows, HIDDEN, HIDDEN),
        ("k, v (576 -> 192)", rows, HIDDEN, KV),
        ("gate, up (576 -> 1536)", rows, HIDDEN, MLP),
        ("down (1536 -> 576)", rows, MLP, HIDDEN),
        ("weight gradient (1536 x rows x 576)", MLP, rows, HIDDEN),
        (f"LM head ({HEAD_ROWS} rows -> {VOCAB})", HEAD_ROWS, HIDDEN, VOCAB),
    ]


def positive(text: str) -> int:
    """argparse type: an integer of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive integer")
    return value


def best_seconds(fn, repeats: int) -> float:
    fn()  # warm-up: oneDNN / MKL pick and cache their kernel
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def product_rate(m: int, k: int, n: int, dtype: torch.dtype, repeats: int) -> float:
    """GFLOP/s of (m, k) @ (k, n) in ``dtype``."""
    a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
    return 2 * m * k * n / best_seconds(lambda: a @ b, repeats) / 1e9


def read_rates(repeats: int) -> tuple[float, float]:
    """(GB/s reading a weight-sized bf16 tensor, GB/s of a weight-sized copy counted read + write)."""
    w = torch.ones(WEIGHT_BYTES // 2, dtype=torch.bfloat16)
    out = torch.empty_like(w)
    read = WEIGHT_BYTES / best_seconds(lambda: w.sum(), repeats) / 1e9
    copy = 2 * WEIGHT_BYTES / best_seconds(lambda: out.copy_(w), repeats) / 1e9
    return read, copy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=positive, default=1, help="torch threads (default 1, as train.threads in the SmolLM2 control)")
    ap.add_argument("--rows", type=positive, default=224, help="tokens a training product sees (default 224)")
    ap.add_argument("--repeats", type=positive, default=20, help="timed runs per product, the best kept (default 20)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    flags = cpu_flags()
    bf16 = ", ".join(f for f in (*BF16_CPU_FLAGS, ARM_BF16_FEATURE) if f in flags) or "none"
    print(f"{cpu_name()}: bf16 matmul flags {bf16}{'' if bf16_matmul(flags) else ' (bf16 below is emulated)'}; "
          f"torch {torch.__version__}, {args.threads} thread(s), {args.rows} rows")
    print(f"{'product [m x k x n]':<54} {'fp32':>9} {'bf16':>9}  GFLOP/s")
    for name, m, k, n in shapes(args.rows):
        rates = [product_rate(m, k, n, dt, args.repeats) for dt in (torch.float32, torch.bfloat16)]
        print(f"{name + f' [{m} x {k} x {n}]':<54} {rates[0]:>9.0f} {rates[1]:>9.0f}")
    read, copy = read_rates(max(3, args.repeats // 4))
    print(f"weight reads: {read:.1f} GB/s reading {WEIGHT_BYTES / 1e6:.0f} MB of bf16, {copy:.1f} GB/s copying it "
          f"(read + write); one decode step's floor: {WEIGHT_BYTES / read / 1e9 * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
