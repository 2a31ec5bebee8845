"""veRL backend step time: GRPO vs ExGRPO on veRL's RayPPOTrainer (CPU, tiny LM), in one run.

Prints the median veRL `timing_s/step` over steps 3.. of each run and their ratio (the replay
overhead; goal <= 5 %), plus the native backend's step on the same model, batch and K. With
``--rollouts hf,vllm`` the GRPO step also runs on veRL's vLLM rollout (in the job environment,
``make job-env``), and the generation and step times of each rollout are printed with their ratio.
    python bench/bench_verl.py [--steps 10] [--rollouts hf,vllm]
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
    ap.add_argument("--rollouts", default="hf", help="comma-separated rollouts for the GRPO step: hf, vllm")
    ap.add_argument("--job-python", default=".venv-job/bin/python", help="the job environment of the vllm rollout")
    args = ap.parse_args()
    out = {}
    gen = {}
    with tempfile.TemporaryDirectory() as d:
        sets = {"output_dir": d, "train.max_steps": args.steps, "train.eval_every_steps": None,
                "train.checkpoint_every": 0}
        for arm, path in (("grpo", "experiments/verl-tiny-grpo.yaml"), ("exgrpo", "experiments/verl-tiny-exgrpo.yaml")):
            t0 = time.perf_counter()
            res = train(load_experiment(path, sets), progress=False)
            out[arm] = (median_step(res.history, "timing_s/step"), time.perf_counter() - t0)
            if arm == "grpo":
                gen["hf"] = (median_step(res.history, "timing_s/gen"), out["grpo"][0], out["grpo"][1])
        for rollout in [r for r in args.rollouts.split(",") if r != "hf"]:
            t0 = time.perf_counter()
            cfg = load_experiment("experiments/verl-tiny-grpo.yaml", {
                **sets, "backend.verl.rollout": rollout, "backend.verl.python": args.job_python})
            res = train(cfg, progress=False)
            gen[rollout] = (median_step(res.history, "timing_s/gen"), median_step(res.history, "timing_s/step"),
                            time.perf_counter() - t0)
        native = load_experiment("experiments/verl-tiny-exgrpo.yaml", {**sets, "backend.name": "native"})
        res = train(native, progress=False)
        out["native-exgrpo"] = (median_step(res.history, "time/step_seconds"), None)
    print(f"{'run':<16}{'median step s':>15}{'whole run s':>13}")
    for arm, (step, total) in out.items():
        print(f"{arm:<16}{step:>15.3f}{(f'{total:.1f}' if total else '-'):>13}")
    print(f"ExGRPO / GRPO step time on veRL: {out['exgrpo'][0] / out['grpo'][0]:.3f}")
    print(f"veRL ExGRPO / native ExGRPO step time: {out['exgrpo'][0] / out['native-exgrpo'][0]:.2f}")
    if len(gen) > 1:
        print(f"\nGRPO on veRL by rollout (median over steps 3..{args.steps})")
        print(f"{'rollout':<10}{'generation s':>14}{'step s':>10}{'whole run s':>13}{'step / hf':>11}")
        for rollout, (g, step, total) in gen.items():
            print(f"{rollout:<10}{g:>14.3f}{step:>10.3f}{total:>13.1f}{step / gen['hf'][1]:>11.2f}")


if __name__ == "__main__":
    main()
