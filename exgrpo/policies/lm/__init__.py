"""HF causal-LM policies (tiny-lm tier and up), trained by both backends; the engine is also veRL's CPU rollout.

* :mod:`.engine` — :class:`RolloutEngine`: KV-cache batched sampling and one-forward scoring, with
  the single packing helper :func:`build_packed_batch`.
* :mod:`.static_kv`, :mod:`.fused_kv` — the engine's own decode loops for Llama-family models
  (``policy.decoder``: ``static-kv``, ``fused``); :mod:`.unpadded` — the training forward without padding.
* :mod:`.policy` — :class:`LMPolicy`, the trainer's Policy protocol over an HF model.
* :class:`CharTokenizer` (defined in :mod:`exgrpo.tasks.tokenizers`, re-exported here).
* :mod:`.tiny_lm` — :class:`TinyLMConfig` and :func:`load_tiny_lm` (SFT warm start, cached).

Names are resolved lazily so that importing one submodule does not import the others.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "RolloutEngine": ".engine", "SamplingParams": ".engine", "GenerationOutput": ".engine", "ScoreOutput": ".engine",
    "build_packed_batch": ".engine", "LMPolicy": ".policy", "LMPolicyConfig": ".policy",
    "CharTokenizer": "exgrpo.tasks.tokenizers", "TinyLM": ".tiny_lm", "TinyLMConfig": ".tiny_lm",
    "load_tiny_lm": ".tiny_lm",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
