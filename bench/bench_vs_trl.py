"""One GRPO step: the native trainer vs TRL's ``GRPOTrainer``, same model, batch and threads, one process.

    make bench                                    # installs TRL into .bench-deps/ and runs this among the others
    PYTHONPATH=.bench-deps .venv/bin/python bench/bench_vs_trl.py [--steps 4] [--rounds 1] [--threads 2]

TRL (pinned in the Makefile) is installed with ``pip --target .bench-deps``, never into .venv: veRL
imports ``trl.AutoModelForCausalLMWithValueHead``, which TRL 1.x removed, whenever TRL is importable,
so an environment with both cannot run veRL.

Both sides train SmolLM2-135M-Instruct (fp32, the project's converted weights, a fresh copy each)
on the same reasoning-gym questions of ``experiments/smollm2-arith.yaml`` (the ones the native
trainer draws at seed 0, in its order): 4 prompts x 4 samples x
up to 64 new tokens (T = 1, top-p 1), the same ChatML prompts, the same grader, one optimizer
step per generation (TRL: ``steps_per_generation=1, num_iterations=1``; native:
``train.mini_batches=1``), no KL term (TRL ``beta=0``), AdamW at lr 1e-5, 2 torch threads,
on-policy GRPO (native ``replay: none``). The first step of each side is a warm-up and is not
counted; the median of the rest is printed with the ratio. Responses stop at EOS on both sides,
so the step times include each side's own sampled lengths (printed as mean tokens per row).

The native side also prints the share of its step spent in each part (``time/<phase>_seconds``,
METRICS.md): rollout, reward, forward, backward (+ clip + AdamW), replay bookkeeping; and, with
``--exgrpo-steps``, the same for ExGRPO with replay on from step 1 (the pool's bookkeeping and the
forward that scores stored trajectories for selection).

The native trainer's ``train.keep_freed_memory`` (default on) is a process-wide malloc setting, so it
is applied before either side runs and TRL gets it too; ``--default-malloc`` runs both without it.

``--precisions fp32,bf16`` (the default) also runs a native arm with ``policy.precision: bf16`` (bf16
autocast over fp32 weights, pi_old re-scored in bf16; a CPU with avx512_bf16 or amx_bf16) in every
round, beside the fp32 arm, against the same TRL steps (TRL stays fp32: ``bf16=False``). The speed
goal against TRL (bench/summary.py) is recorded for the fp32 arm, the one whose outputs are TRL's up
to rounding.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "disabled")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
warnings.filterwarnings("ignore")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from summary import record  # noqa: E402  (bench/summary.py)

PROMPTS, SAMPLES, NEW_TOKENS, LR = 4, 4, 64, 1e-5
KEEP_FREED = [True]  # train.keep_freed_memory of the native side; set for the whole process, so TRL's too


def native_config(steps: int, threads: int, out: Path, replay: str = "none", precision: str = "fp32"):
    from exgrpo.config import load_experiment

    return load_experiment(str(REPO / "experiments" / "smollm2-arith.yaml"), {
        "algorithm.replay": replay, **({"algorithm.replay_start_pass_rate": 0.0} if replay != "none" else {}), "algorithm.group_size": SAMPLES, "train.batch_size": PROMPTS,
        "policy.max_new_tokens": NEW_TOKENS, "train.mini_batches": 1, "train.lr": LR, "train.threads": threads,
        "train.max_steps": steps, "train.eval_before_train": False, "train.eval_every_steps": 10_000,
        "train.checkpoint_every": 0, "output_dir": str(out), "seed": 0, "train.keep_freed_memory": KEEP_FREED[0],
        "policy.precision": precision,
    })


def run_native(steps: int, threads: int, out: Path, replay: str = "none",
               precision: str = "fp32") -> tuple[list[float], dict[str, float], float]:
    """Per-step seconds (warm-up dropped), each phase's share of the counted steps, mean tokens per row."""
    from exgrpo.backends.native.trainer import PHASES, Trainer

    trainer = Trainer(native_config(steps, threads, out, replay, precision))
    rows = []
    for _ in range(steps):
        rows.append(trainer.train_step())
        trainer.step += 1
    counted = rows[1:]
    total = sum(r["time/step_seconds"] for r in counted)
    shares = {p: sum(r[f"time/{p}_seconds"] for r in counted) / total for p in PHASES}
    tokens = statistics.mean(r["compute/rollout_tokens"] for r in counted) / (PROMPTS * SAMPLES)
    return [r["time/step_seconds"] for r in counted], shares, tokens


def run_trl(steps: int, threads: int, out: Path) -> tuple[list[float], float]:
    """Per-step seconds of TRL's GRPOTrainer (warm-up dropped) and mean completion tokens per row."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from exgrpo.policies.lm.smollm2 import load_smollm2
    from exgrpo.policies.build import build_task_and_policy
    from exgrpo.core.fresh import FreshSampler

    cfg = native_config(steps, threads, out / "task")
    task, _ = build_task_and_policy(cfg)
    # the questions the native trainer draws at the same seed, in the same order
    fresh = FreshSampler(task.train_ids, np.random.default_rng(cfg.seed + 1))
    qids = [int(q) for _ in range(steps) for q in fresh.next(PROMPTS, set())]
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": task.prompt_text(q)}], "qid": int(q)} for q in qids])

    def reward(completions, qid, **_):  # the same grader as the native task
        return [task.score_text(q, c[0]["content"]) for q, c in zip(qid, completions, strict=True)]

    model, tokenizer = load_smollm2()
    args = GRPOConfig(
        output_dir=str(out / "trl"), per_device_train_batch_size=PROMPTS * SAMPLES, num_generations=SAMPLES,
        max_completion_length=NEW_TOKENS, gradient_accumulation_steps=1, steps_per_generation=1, num_iterations=1,
        beta=0.0, learning_rate=LR, temperature=1.0, top_p=1.0, top_k=0, use_cpu=True, bf16=False, fp16=False,
        report_to="none", save_strategy="no", logging_steps=10_000, max_steps=steps, seed=0, shuffle_dataset=False,
        dataloader_num_workers=0, disable_tqdm=True,
    )
    times: list[float] = []
    lengths: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.t0 = time.perf_counter()

        def on_step_end(self, *a, **k):
            times.append(time.perf_counter() - self.t0)

        def on_log(self, _args, _state, _control, logs=None, **k):
            if logs and "completions/mean_length" in logs:
                lengths.append(float(logs["completions/mean_length"]))

    args.logging_steps = 1
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=data, processing_class=tokenizer,
                          callbacks=[Clock()])
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)  # its per-step log dicts
    torch.set_num_threads(threads)
    trainer.train()
    return times[1:], statistics.mean(lengths[1:]) if len(lengths) > 1 else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4, help="steps per side per round (the first is a warm-up)")
    ap.add_argument("--rounds", type=int, default=1, help="native/TRL rounds, alternating which goes first")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--default-malloc", action="store_true",
                    help="leave glibc's malloc as it is (native train.keep_freed_memory false) for both sides")
    ap.add_argument("--exgrpo-steps", type=int, default=4,
                    help="also time the native ExGRPO step's parts (replay from step 1); 0 skips")
    ap.add_argument("--precisions", default="fp32,bf16",
                    help="native arms by policy.precision, each against the same TRL steps (fp32 always runs)")
    args = ap.parse_args()
    precisions = ["fp32", *(p for p in dict.fromkeys(x.strip() for x in args.precisions.split(",")) if p and p != "fp32")]
    try:
        import trl
    except ImportError:
        sys.exit("bench_vs_trl: TRL is not importable; run `make bench` (it installs TRL into .bench-deps/, never .venv) "
                 "or: .venv/bin/pip install --no-deps --target .bench-deps trl==1.16.0; "
                 "PYTHONPATH=.bench-deps .venv/bin/python bench/bench_vs_trl.py")
    torch.set_num_threads(args.threads)
    KEEP_FREED[0] = not args.default_malloc
    if KEEP_FREED[0]:  # process-wide: applied before either side runs, so both get it
        from exgrpo.backends.native.memory import keep_freed_memory

        KEEP_FREED[0] = keep_freed_memory()
    from exgrpo.policies.lm.precision import cpu_name

    print(f"native vs TRL {trl.__version__} GRPOTrainer: SmolLM2-135M-Instruct (native arms: {', '.join(precisions)}; "
          f"TRL fp32), {PROMPTS} prompts x {SAMPLES} "
          f"samples x <= {NEW_TOKENS} new tokens, {args.threads} threads, {args.steps - 1} counted steps per side "
          f"x {args.rounds} round(s), load {os.getloadavg()[0]:.2f}; malloc keeps freed memory (both sides): {KEEP_FREED[0]}; "
          f"CPU: {cpu_name()}")
    native_t: dict[str, list[float]] = {p: [] for p in precisions}
    tok_native: dict[str, list[float]] = {p: [] for p in precisions}
    trl_t, shares, tok_trl = [], [], []
    with tempfile.TemporaryDirectory() as d:
        for r in range(args.rounds):
            natives = [f"native-{p}" for p in precisions]
            order = (*natives, "trl") if r % 2 == 0 else ("trl", *natives[::-1])
            for side in order:
                out = Path(d) / f"{side}{r}"
                if side == "trl":
                    t, tok = run_trl(args.steps, args.threads, out)
                    trl_t += t
                    tok_trl.append(tok)
                else:
                    precision = side.removeprefix("native-")
                    t, s, tok = run_native(args.steps, args.threads, out, precision=precision)
                    native_t[precision] += t
                    tok_native[precision].append(tok)
                    if precision == "fp32":
                        shares.append(s)
    t_med = statistics.median(trl_t)
    n_med = {p: statistics.median(ts) for p, ts in native_t.items()}
    for p in precisions:
        print(f"    native {p}  {n_med[p]:6.2f} s/step (steps: {', '.join(f'{x:.1f}' for x in native_t[p])}; "
              f"mean {statistics.mean(tok_native[p]):.1f} tokens/row)")
    print(f"    TRL          {t_med:6.2f} s/step (steps: {', '.join(f'{x:.1f}' for x in trl_t)}; "
          f"mean {statistics.mean(tok_trl):.1f} tokens/row)")
    for p in precisions:
        print(f"    TRL / native {p}: {t_med / n_med[p]:.2f}x   [CPU: {cpu_name()}]")
    record("2. native step vs TRL GRPOTrainer (SmolLM2)", t_med / n_med["fp32"], 2.0,
           f"{PROMPTS} prompts x {SAMPLES} samples x <= {NEW_TOKENS} tokens, {args.threads} threads, "
           f"{len(native_t['fp32'])} + {len(trl_t)} steps")
    share = {p: statistics.mean(s[p] for s in shares) for p in shares[0]}
    print("    native fp32 step parts: " + ", ".join(f"{p} {100 * v:.1f}%" for p, v in share.items())
          + f", other {100 * (1 - sum(share.values())):.1f}%")
    if args.exgrpo_steps:
        with tempfile.TemporaryDirectory() as d:
            t, share, _ = run_native(args.exgrpo_steps, args.threads, Path(d), replay="buckets")
        print(f"    native ExGRPO (replay from step 1), {statistics.median(t):.2f} s/step, parts: "
              + ", ".join(f"{p} {100 * v:.2f}%" for p, v in share.items()))


if __name__ == "__main__":
    main()
