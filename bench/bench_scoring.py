"""The training forward + backward over a rollout: padded vs unpadded responses, one process.

    .venv/bin/python bench/bench_scoring.py [--model smollm2|tiny-lm] [--repeats 5] [--threads N]
        [--bf16 | --checkpoint | --split]

One sampled rollout at the tier's training batch (SmolLM2-135M: 16 rows = 4 questions x K 4,
<= 64 tokens, 2 threads; tiny-lm: 256 rows = 32 x 8, <= 40 tokens, 1 thread), then the policy's
``score`` of it with a backward of a loss over every log-prob and entropy, timed for:

* ``padded``:   each distinct prompt once, the responses right-padded to the longest on top
  (``policy.unpadded_scoring: false``, the default before this bench);
* ``unpadded``: the same prompts, then only the responses' real tokens
  (:mod:`exgrpo.policies.lm.unpadded`, ``policy.unpadded_scoring: true``).

``--bf16`` instead times the unpadded forward + backward in fp32 against the same under
``torch.autocast("cpu", bfloat16)`` (fp32 weights) and prints how far the bf16 log-probs are from
fp32's (mean, p99, max over the real tokens) and the gradients' relative difference: the price of
that speed in importance ratios when π_old is the fp32 sampler's (what ``policy.precision: bf16`` avoids by re-scoring
the rollouts in bf16: docs/speed.md, "bf16 compute").

``--checkpoint`` instead times the unpadded forward + backward against the same with its layers recomputed in
the backward (``policy.gradient_checkpointing``), and prints the bytes each keeps for the backward (autograd's
saved tensors, each storage once, the model's own weights left out): the memory that setting buys, and its
price in time.

``--split`` instead times a step's training forward + backward over 2 mini-batches (bf16 autocast, as the
SmolLM2 runs train) cut from the same rollout as a random row partition (``train.mini_batch_split: rows``, the
native default) against whole groups (``groups``): the same rows and tokens, each question's prompt run in
both mini-batches or in one.

The malloc setting is the trainer's default (``train.keep_freed_memory``). Before timing it prints the largest log-prob / entropy / gradient difference between the two.
Timings are medians over ``--repeats``, the two interleaved, after a warm-up of each.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from exgrpo.policies.lm.engine import RolloutEngine, SamplingParams  # noqa: E402
from exgrpo.backends.native.memory import keep_freed_memory  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=["tiny-lm", "smollm2"], default="smollm2")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--bf16", action="store_true", help="fp32 vs bf16 autocast (unpadded) instead of padded vs unpadded")
    mode.add_argument("--checkpoint", action="store_true",
                      help="unpadded vs unpadded with its layers recomputed (policy.gradient_checkpointing)")
    mode.add_argument("--split", action="store_true",
                      help="2 mini-batches of random rows vs of whole groups (train.mini_batch_split), bf16 autocast")
    ap.add_argument("--default-malloc", action="store_true", help="glibc's default (not train.keep_freed_memory)")
    args = ap.parse_args()
    if not args.default_malloc:
        keep_freed_memory()  # as the trainer does by default
    rows, new_tokens, threads, k = {"tiny-lm": (256, 40, 1, 8), "smollm2": (16, 64, 2, 4)}[args.model]
    torch.set_num_threads(args.threads or threads)
    if args.model == "smollm2":
        from exgrpo.policies.lm.smollm2 import chat_prompt_ids, load_smollm2

        model, hf_tok = load_smollm2()
        pad_id, eos_id = hf_tok.pad_token_id, hf_tok.eos_token_id
        questions = [chat_prompt_ids(hf_tok, f"What is {3 * i % 50} + {7 * i % 40}?") for i in range(rows // k)]
    else:
        from exgrpo.policies.lm.tiny_lm import load_tiny_lm
        from exgrpo.tasks.text_arithmetic import TextArithmetic

        tiny = load_tiny_lm(progress=True)
        model, pad_id, eos_id = tiny.model, tiny.tokenizer.pad_id, tiny.tokenizer.eos_id
        task = TextArithmetic()
        questions = task.prompts(list(task.train_ids[: rows // k]))
    prompts = [p for p in questions for _ in range(k)]  # each question K times in a row, as the trainer
    model.train()
    params = SamplingParams(max_new_tokens=new_tokens, temperature=1.0)
    names = (("fp32", "bf16") if args.bf16 else ("unpadded", "recomputed") if args.checkpoint
             else ("rows", "groups") if args.split else ("padded", "unpadded"))
    engines = {name: RolloutEngine(model, pad_id, eos_id, params, unpadded=name != "padded",
                                   checkpoint_layers=name == "recomputed") for name in names}
    ro = engines[names[0]].generate(prompts, torch.Generator().manual_seed(0))
    weights = torch.linspace(-1, 1, ro.mask.numel()).view_as(ro.mask)
    trainable = [p for p in model.parameters() if p.requires_grad]
    whole = [torch.arange(len(prompts))]
    chunks = {name: whole for name in names}  # the rows each mini-batch scores (one: the whole batch)
    if args.split:
        import numpy as np

        from exgrpo.config import MiniBatchSplit
        from exgrpo.core.batch import mini_batch_rows

        chunks = {name: [torch.as_tensor(c) for c in mini_batch_rows(np.random.default_rng(0), len(prompts), k, 2,
                                                                      MiniBatchSplit(name))] for name in names}

    kept: dict[str, int] = {}  # bytes autograd saved for the backward, per engine (each storage once, weights not counted)
    weights_at = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def step(name: str, count: bool = False) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """``count``: read what autograd keeps for the backward (the warm-up's call; timed calls run without)."""
        storages: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            if t.untyped_storage().data_ptr() not in weights_at:
                storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t) if count else contextlib.nullcontext()
        log_prob, entropy = torch.zeros_like(weights), torch.zeros_like(weights)
        grads: list[torch.Tensor] = [torch.zeros_like(p) for p in trainable]
        for idx in chunks[name]:  # a mini-batch's forward, then its backward, as the trainer steps
            storages.clear()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=name in ("bf16", "rows", "groups")), hooks:
                sc = engines[name].score([prompts[i] for i in idx], ro.tokens[idx], ro.mask[idx], share_prompts=True)
            if count:
                kept[name] = max(kept.get(name, 0), sum(storages.values()))
            loss = (sc.log_prob * weights[idx]).sum() + 0.01 * sc.entropy.sum()
            grads = [g + d for g, d in zip(grads, torch.autograd.grad(loss, trainable), strict=True)]
            log_prob[idx], entropy[idx] = sc.log_prob.detach(), sc.entropy.detach()
        return log_prob, entropy, grads

    real = int(ro.mask.sum())
    print(f"model: {args.model}  batch {len(prompts)} rows x {ro.mask.shape[1]} columns  real response tokens "
          f"{real} ({real / ro.mask.numel():.0%} of the grid)  threads {torch.get_num_threads()}  "
          f"repeats {args.repeats} (median)")
    (lp_a, ent_a, g_a), (lp_b, ent_b, g_b) = step(names[0], count=True), step(names[1], count=True)  # also the warm-up
    g_gap = max(float((a - b).abs().max()) for a, b in zip(g_a, g_b, strict=True))
    print(f"check: max |diff| log-prob {float((lp_a - lp_b).abs().max()):.2e}  entropy "
          f"{float((ent_a - ent_b).abs().max()):.2e}  gradient {g_gap:.2e}")
    print("kept for the backward (weights aside): " + "  ".join(f"{name} {b / 2**20:.0f} MiB" for name, b in kept.items()))
    if args.bf16:
        d = (lp_b - lp_a)[ro.mask]
        rel = max(float((b - a).norm() / a.norm()) for a, b in zip(g_a, g_b, strict=True))
        print(f"bf16 vs fp32 log-prob |diff| mean {float(d.abs().mean()):.3f}  p99 {float(d.abs().quantile(0.99)):.3f}  "
              f"max {float(d.abs().max()):.3f}; on-policy ratio exp(diff) in [{float(d.exp().min()):.2f}, "
              f"{float(d.exp().max()):.2f}]; gradient relative difference up to {rel:.1%}")
    times: dict[str, list[float]] = {name: [] for name in engines}
    for _ in range(args.repeats):  # interleaved, so drift hits both alike
        for name in engines:
            t0 = time.perf_counter()
            step(name)
            times[name].append(time.perf_counter() - t0)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    a, b = names
    print(f"forward + backward: {a} {med[a]:.3f} s  {b} {med[b]:.3f} s  ratio {med[a] / med[b]:.2f}x")


if __name__ == "__main__":
    main()
