"""Rollout throughput: the native LM engine vs HF ``generate`` on the same model, one process.

    .venv/bin/python bench/bench_rollout.py [--model tiny-lm|smollm2] [--prompts N] [--new-tokens T] \
        [--group-size K] [--repeats 5] [--threads 2] [--cases fixed,eos,greedy]

Defaults are the training batch of each tier: tiny-lm 256 rows (32 questions x K=8) x 40 new
tokens, 1 thread (a sweep/compare worker's setting); SmolLM2-135M 16 rows (4 x 4) x 64 new tokens,
2 threads (``experiments/smollm2-arith.yaml``). Five engine variants are timed against HF
``generate``: ``static-kv`` (oneDNN-packed weights), ``unpacked`` (the same decoder on the model's
own weights, ``policy.prepack_weights: false``), ``fused`` and ``fused-unp`` (``policy.decoder:
fused``, the decode step of fewer kernels, packed and not) and ``hf`` (the engine's loop over the
model's own forward, the slowest decoder). The goal is recorded for the variant the tier's
policy config defaults to.

Before timing it checks what the speed must not cost: greedy tokens equal to HF ``generate``'s,
and the sampled rows' log-probs equal to a full-forward re-score (max |difference| printed).

The batch is laid out as the trainer's: N / K distinct questions, each K times in a row (the
engine prefills each distinct prompt once; HF ``generate`` prefills every row).

Three cases on the same model and the same batch of task prompts (left-padded identically):

* ``fixed``:  sampling at T=1, every row forced to ``--new-tokens`` tokens (engine: no EOS stop;
  HF: ``min_new_tokens = max_new_tokens``), so both produce exactly N x new-tokens tokens.
* ``eos``:    sampling at T=1 with EOS stopping (the trainer's case); tokens = real response
  tokens (through EOS).
* ``greedy``: argmax decoding with EOS stopping.

The engine also returns per-token log-probs and entropies; plain HF ``generate`` does not (it would
need ``output_logits=True`` plus a log-softmax). The tiny LM is loaded from the cache (trained on
first use, ~1 min). Each call's rate is its tokens over its time; a side's rate is the median over
``--repeats`` calls, engine and HF interleaved, after a warm-up of each. Repeat r seeds every call
alike (the engine variants' generators, HF's global RNG), so the engine variants sample the same
responses up to rounding and differ only in their speed. (Before 2026-11-26 the calls shared one
generator and a side's rate was its last call's tokens over its median time: with EOS stopping the
token counts differ from call to call, which added noise to the ratios.)

The malloc setting is the trainer's default (``train.keep_freed_memory``: glibc keeps freed memory
instead of unmapping it, so a step's fresh tensors are not page-faulted again); it is process-wide,
so HF ``generate`` runs with it too. ``--default-malloc`` runs both without it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from exgrpo.policies.lm.engine import RolloutEngine, SamplingParams, build_packed_batch  # noqa: E402
from exgrpo.backends.native.memory import keep_freed_memory  # noqa: E402
from exgrpo.config.policies import HFPolicyConfig, LMPolicyConfig  # noqa: E402
from exgrpo.policies.lm.tiny_lm import load_tiny_lm  # noqa: E402
from exgrpo.tasks.text_arithmetic import TextArithmetic  # noqa: E402
from summary import record  # noqa: E402  (bench/summary.py)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=["tiny-lm", "smollm2"], default="tiny-lm")
    ap.add_argument("--prompts", type=int, default=None, help="rows (default: the tier's training batch)")
    ap.add_argument("--new-tokens", type=int, default=None)
    ap.add_argument("--group-size", type=int, default=None, help="K rows per question (default: the tier's)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--cases", default="fixed,eos,greedy")
    ap.add_argument("--default-malloc", action="store_true", help="glibc's default (not train.keep_freed_memory)")
    args = ap.parse_args()
    if not args.default_malloc:
        keep_freed_memory()  # as the trainer does by default, for both sides
    defaults = {"tiny-lm": (256, 40, 1, 8), "smollm2": (16, 64, 2, 4)}[args.model]
    args.prompts = args.prompts or defaults[0]
    args.new_tokens = args.new_tokens or defaults[1]
    args.threads = args.threads or defaults[2]
    k = args.group_size or defaults[3]
    questions = -(-args.prompts // k)
    torch.set_num_threads(args.threads)

    if args.model == "smollm2":
        from exgrpo.policies.lm.smollm2 import chat_prompt_ids, load_smollm2, smollm2_dir

        model, hf_tok = load_smollm2()
        model = model.eval()
        pad_id, eos_id, label = hf_tok.pad_token_id, hf_tok.eos_token_id, smollm2_dir()
        prompts = [chat_prompt_ids(hf_tok, f"What is {3 * i % 50} + {7 * i % 40}?") for i in range(questions)]
    else:
        tiny = load_tiny_lm(progress=True)
        model, tok = tiny.model.eval(), tiny.tokenizer
        pad_id, eos_id, label = tok.pad_id, tok.eos_id, tiny.path
        task = TextArithmetic()
        prompts = task.prompts(list(task.val_ids[:questions]))
    prompts = [p for p in prompts for _ in range(k)][: args.prompts]  # each question K times in a row
    batch = build_packed_batch(prompts, None, None, pad_id)
    n, t = args.prompts, args.new_tokens
    params = SamplingParams(max_new_tokens=t, temperature=1.0, top_p=1.0)
    # engine variant -> (decoder, prepack_weights)
    variants = {"static-kv": ("static-kv", True), "unpacked": ("static-kv", False), "fused": ("fused", True),
                "fused-unp": ("fused", False), "hf": ("hf", False)}
    decoders = tuple(variants)
    policy = {"tiny-lm": LMPolicyConfig, "smollm2": HFPolicyConfig}[args.model]()
    default = next(d for d, v in variants.items() if v == (policy.decoder.value, policy.prepack_weights))
    eng_stop = {d: RolloutEngine(model, pad_id, eos_id, params, decoder=v[0], prepack=v[1]) for d, v in variants.items()}
    eng_fixed = {d: RolloutEngine(model, pad_id, None, params, decoder=v[0], prepack=v[1]) for d, v in variants.items()}
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

    # every call takes the repeat's seed: the engine variants draw from a generator seeded with it (so
    # they sample the same responses, up to rounding), HF ``generate`` from torch's global one
    def engine_cases(d: str) -> dict:
        return {
            "fixed": lambda s: int(eng_fixed[d].generate(prompts, torch.Generator().manual_seed(s)).mask.sum()),
            "eos": lambda s: int(eng_stop[d].generate(prompts, torch.Generator().manual_seed(s)).mask.sum()),
            "greedy": lambda s: int(eng_stop[d].generate(prompts, greedy=True).mask.sum()),
        }

    def hf_call(**kw):
        def call(s: int) -> int:
            torch.manual_seed(s)
            return hf_tokens(model.generate(**kw))
        return call

    hf_cases = {
        "fixed": hf_call(**hf_common, do_sample=True, min_new_tokens=t),
        "eos": hf_call(**hf_common, do_sample=True),
        "greedy": hf_call(**hf_greedy, do_sample=False),
    }
    runners = {"HF generate": hf_cases, **{f"engine {d}": engine_cases(d) for d in decoders}}
    print(f"model: {label}  params {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M  "
          f"batch {n} rows ({questions} questions x K {k}) x {t} new tokens  threads {args.threads}  repeats {args.repeats} (median)  "
          f"malloc {'glibc default' if args.default_malloc else 'train.keep_freed_memory'}")
    with torch.no_grad():
        hf_greedy_out = model.generate(**hf_greedy, do_sample=False)[:, batch.prompt_width :]
        for d in decoders:
            g = eng_stop[d].generate(prompts, greedy=True)
            same = g.tokens.shape == hf_greedy_out.shape and torch.equal(g.tokens, hf_greedy_out)
            ro = eng_stop[d].generate(prompts, torch.Generator().manual_seed(1))
            sc = eng_stop[d].score(prompts, ro.tokens, ro.mask)
            gap = float((sc.log_prob - ro.log_prob).abs().max())
            print(f"check {d:9s}: greedy tokens equal to HF generate: {same}; "
                  f"sampled log-probs vs full-forward re-score: max |diff| {gap:.2e}")
        print(f"{'case':8s} " + " ".join(f"{r + ' tok/s':>22s}" for r in runners)
              + "   ratios vs HF generate (" + ", ".join(decoders) + ")")
        for name in args.cases.split(","):
            calls = {r: c[name] for r, c in runners.items()}
            for call in calls.values():
                call(999)  # warm-up
            rates: dict[str, list[float]] = {r: [] for r in calls}  # tokens / second of each call
            for rep in range(args.repeats):  # interleaved, so drift hits every side alike
                for r, call in calls.items():
                    t0 = time.perf_counter()
                    n_tokens = call(1000 + rep)
                    rates[r].append(n_tokens / (time.perf_counter() - t0))
            rate = {r: statistics.median(rates[r]) for r in calls}
            base = rate["HF generate"]
            print(f"{name:8s} " + " ".join(f"{rate[r]:22.0f}" for r in calls)
                  + "   " + " ".join(f"{rate[f'engine {d}'] / base:5.2f}x" for d in decoders))
            if name == "eos":  # the trainer's case, with the engine variant the tier's policy config defaults to
                record(f"1. rollout vs HF generate, {args.model}, EOS", rate[f"engine {default}"] / base, 3.0,
                       f"{n} rows x <= {t} tokens, {args.threads} thread(s), engine {default}, {args.repeats} repeats")


if __name__ == "__main__":
    main()
