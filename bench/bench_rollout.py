"""Rollout throughput: the native LM engine vs HF ``generate`` on the same model, one process.

    .venv/bin/python bench/bench_rollout.py [--model tiny-lm|smollm2] [--prompts 64] [--new-tokens 32] [--repeats 5] [--threads 2]

Three cases on the same model and the same batch of task prompts (left-padded identically):

* ``fixed``:  sampling at T=1, every row forced to ``--new-tokens`` tokens (engine: no EOS stop;
  HF: ``min_new_tokens = max_new_tokens``), so both produce exactly N x new-tokens tokens.
* ``eos``:    sampling at T=1 with EOS stopping (the trainer's case); tokens = real response
  tokens (through EOS).
* ``greedy``: argmax decoding with EOS stopping.

The engine also returns per-token log-probs and entropies; plain HF ``generate`` does not (it would
need ``output_logits=True`` plus a log-softmax). The tiny LM is loaded from the cache (trained on
first use, ~1 min). Timings are medians over ``--repeats``, engine and HF interleaved, after a
warm-up of each.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from exgrpo.backends.native.lm.engine import RolloutEngine, SamplingParams, build_packed_batch  # noqa: E402
from exgrpo.backends.native.lm.tiny_lm import load_tiny_lm  # noqa: E402
from exgrpo.tasks.text_arithmetic import TextArithmetic  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=["tiny-lm", "smollm2"], default="tiny-lm")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    if args.model == "smollm2":
        from exgrpo.backends.native.lm.smollm2 import chat_prompt_ids, load_smollm2, smollm2_dir

        model, hf_tok = load_smollm2()
        model = model.eval()
        pad_id, eos_id, label = hf_tok.pad_token_id, hf_tok.eos_token_id, smollm2_dir()
        prompts = [chat_prompt_ids(hf_tok, f"What is {3 * i % 50} + {7 * i % 40}?") for i in range(args.prompts)]
    else:
        tiny = load_tiny_lm(progress=True)
        model, tok = tiny.model.eval(), tiny.tokenizer
        pad_id, eos_id, label = tok.pad_id, tok.eos_id, tiny.path
        task = TextArithmetic()
        qids = (task.val_ids * (args.prompts // len(task.val_ids) + 1))[: args.prompts]
        prompts = task.prompts(qids)
    batch = build_packed_batch(prompts, None, None, pad_id)
    n, t = args.prompts, args.new_tokens
    params = SamplingParams(max_new_tokens=t, temperature=1.0, top_p=1.0)
    eng_stop = RolloutEngine(model, pad_id, eos_id, params)
    eng_fixed = RolloutEngine(model, pad_id, None, params)
    gen = torch.Generator().manual_seed(0)
    hf_common = dict(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, max_new_tokens=t,
        pad_token_id=pad_id, eos_token_id=eos_id, top_k=0, top_p=1.0, temperature=1.0,
    )

    hf_greedy = {k: v for k, v in hf_common.items() if k not in ("top_k", "top_p", "temperature")}

    def hf_tokens(out: torch.Tensor) -> int:
        """Real generated tokens of an HF output: up to and including each row's first EOS."""
        resp = out[:, batch.prompt_width :]
        is_eos = resp == eos_id
        after = (is_eos.cumsum(1) - is_eos.long()) > 0  # strictly after the first EOS
        return int((~after).sum())

    cases = {
        "fixed": (
            lambda: int(eng_fixed.generate(prompts, gen).mask.sum()),
            lambda: hf_tokens(model.generate(**hf_common, do_sample=True, min_new_tokens=t)),
        ),
        "eos": (
            lambda: int(eng_stop.generate(prompts, gen).mask.sum()),
            lambda: hf_tokens(model.generate(**hf_common, do_sample=True)),
        ),
        "greedy": (
            lambda: int(eng_stop.generate(prompts, greedy=True).mask.sum()),
            lambda: hf_tokens(model.generate(**hf_greedy, do_sample=False)),
        ),
    }
    print(f"model: {label}  params {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M  "
          f"batch {n} prompts x {t} new tokens  threads {args.threads}")
    print(f"{'case':8s} {'engine tok/s':>13s} {'HF tok/s':>10s} {'ratio':>7s}   (tokens per call: engine / HF)")
    with torch.no_grad():
        for name, (run_engine, run_hf) in cases.items():
            run_engine(), run_hf()  # warm-up
            te, th, ne, nh = [], [], 0, 0
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                ne = run_engine()
                te.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                nh = run_hf()
                th.append(time.perf_counter() - t0)
            e_rate, h_rate = ne / statistics.median(te), nh / statistics.median(th)
            print(f"{name:8s} {e_rate:13.0f} {h_rate:10.0f} {e_rate / h_rate:6.2f}x   ({ne} / {nh})")


if __name__ == "__main__":
    main()
