"""veRL backend step time: GRPO vs ExGRPO on veRL's RayPPOTrainer (CPU, tiny LM), in one run.

Prints the median veRL `timing_s/step` over steps 3.. of each run and their ratio (the replay
overhead; goal <= 5 %), plus the native backend's step on the same model, batch and K.
    python bench/bench_verl.py [--steps 10]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from exgrpo.backends.base import train
from exgrpo.config import load_experiment


def median_step(rows, key):
    vals = [r[key] for r in rows if key in r and r["step"] >= 3]
    return statistics.median(vals)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    out = {}
    with tempfile.TemporaryDirectory() as d:
        sets = {"output_dir": d, "train.max_steps": args.steps, "train.eval_every_steps": None,
                "train.checkpoint_every": 0}
        for arm, path in (("grpo", "experiments/verl-tiny-grpo.yaml"), ("exgrpo", "experiments/verl-tiny-exgrpo.yaml")):
            t0 = time.perf_counter()
            res = train(load_experiment(path, sets), progress=False)
            out[arm] = (median_step(res.history, "timing_s/step"), time.perf_counter() - t0)
        native = load_experiment("experiments/verl-tiny-exgrpo.yaml", {**sets, "backend.name": "native"})
        res = train(native, progress=False)
        out["native-exgrpo"] = (median_step(res.history, "time/step_seconds"), None)
    print(f"{'run':<16}{'median step s':>15}{'whole run s':>13}")
    for arm, (step, total) in out.items():
        print(f"{arm:<16}{step:>15.3f}{(f'{total:.1f}' if total else '-'):>13}")
    print(f"ExGRPO / GRPO step time on veRL: {out['exgrpo'][0] / out['grpo'][0]:.3f}")
    print(f"veRL ExGRPO / native ExGRPO step time: {out['exgrpo'][0] / out['native-exgrpo'][0]:.2f}")


if __name__ == "__main__":
    main()
