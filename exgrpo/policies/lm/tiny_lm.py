"""The tiny-lm tier's model: a small Llama-architecture LM over characters, warm-started by SFT.

* :class:`TinyLMConfig` fixes the architecture (built from a ``LlamaConfig``/``Qwen2Config``; the
  hub is never contacted), the SFT data distribution (:class:`ArithmeticProblemsConfig`) and the
  SFT schedule.
* :func:`load_tiny_lm` returns the warm-started model, training it on first use and caching it
  under ``$EXGRPO_CACHE/tiny-lm/<hash of the config>/`` (default ``~/.cache/exgrpo``) with
  ``save_pretrained`` plus the tokenizer's vocabulary JSON and a ``tiny_lm.json`` record (config,
  SFT time and loss, warm-start accuracy).
* SFT data: questions from the "sft" side of the task's fixed hash split with their worked
  solutions (``"12+7*3=?"`` -> ``"7*3=21 12+21=33 \\boxed{33}"`` + EOS), loss on response tokens
  only. The forward pass is :meth:`RolloutEngine.score`, i.e. the same packed layout the RL
  trainer scores with.
* The recorded warm-start accuracy is greedy accuracy on the validation questions of the default
  RL task built on the same problems (questions the SFT never saw).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from exgrpo.policies.lm.engine import RolloutEngine, SamplingParams
from exgrpo.tasks.tokenizers import CharTokenizer
from exgrpo.config import TinyLMConfig
from exgrpo.filelock import exclusive
from exgrpo.tasks.text_arithmetic import (
    TextArithmetic,
    TextArithmeticTaskConfig,
    sample_sft_problems,
)
from exgrpo.core.selection import pad_right

__all__ = [
    "SFT_SECONDS_PER_STEP", "TinyLM", "TinyLMConfig", "build_model", "cache_root", "config_hash", "greedy_accuracy",
    "load_tiny_lm", "sft", "sft_estimate", "train_tiny_lm", "warm_start",
]

CACHE_FORMAT = 1
"""Bump to invalidate every cached tiny LM (e.g. when the SFT data format changes)."""
RECORD_FILE = "tiny_lm.json"
SFT_THREADS = 1
"""Torch threads the warm start is trained and scored at, whatever the caller's. Float sums split
across threads round differently with the count (measured on this project's AMD EPYC: 1, 2 and 4
threads give the same weights, 3 and 8 others), and the cache key holds only the config, so the
weights must not depend on which command trained them first. One thread splits no sum, and it is the
count the documented warm-start readings were trained at (0.382 on an AMD EPYC: inside a run at
``train.threads: 1``, and the same weights at 2)."""


@dataclass
class TinyLM:
    model: torch.nn.Module
    tokenizer: CharTokenizer
    path: Path | None
    """Cache directory the model was loaded from / saved to (None when caching is off)."""
    record: dict = field(default_factory=dict)
    """What ``tiny_lm.json`` says: config, SFT seconds, final loss, warm-start accuracy."""
    cache_hit: bool = False


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """``cache_dir``, else ``$EXGRPO_CACHE``, else ``~/.cache/exgrpo``."""
    if cache_dir is not None:
        return Path(cache_dir)
    return Path(os.environ.get("EXGRPO_CACHE") or Path.home() / ".cache" / "exgrpo")


_NOT_HASHED = {"eval_questions", "eval_max_new_tokens"}
_HASHED_WHEN_SET = ("sft_direct_fraction",)


def config_hash(cfg: TinyLMConfig) -> str:
    """Cache key: everything that determines the weights (the evaluation settings do not)."""
    fields = cfg.model_dump(mode="json", exclude=_NOT_HASHED)
    for name in _HASHED_WHEN_SET:  # a field added later leaves the keys of the caches made before it
        if fields[name] == TinyLMConfig.model_fields[name].default:
            del fields[name]
    payload = json.dumps({"format": CACHE_FORMAT, "config": fields}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def build_model(cfg: TinyLMConfig, tokenizer: CharTokenizer) -> torch.nn.Module:
    """A randomly initialised model (seeded by ``cfg.seed``; the global torch RNG is left as it was)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    common = dict(
        vocab_size=tokenizer.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=cfg.max_position_embeddings, pad_token_id=tokenizer.pad_id,
        bos_token_id=tokenizer.bos_id, eos_token_id=tokenizer.eos_id, tie_word_embeddings=True,
    )
    config_cls, model_cls = (LlamaConfig, LlamaForCausalLM) if cfg.arch == "llama" else (Qwen2Config, Qwen2ForCausalLM)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = model_cls(config_cls(**common))
    _set_generation_ids(model, tokenizer)
    return model


def _set_generation_ids(model: torch.nn.Module, tokenizer: CharTokenizer) -> None:
    gc = getattr(model, "generation_config", None)
    if gc is not None:
        gc.pad_token_id, gc.bos_token_id, gc.eos_token_id = tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id


def _lr_at(step: int, cfg: TinyLMConfig) -> float:
    if cfg.sft_warmup and step < cfg.sft_warmup:
        return cfg.sft_lr * (step + 1) / cfg.sft_warmup
    span = max(1, cfg.sft_steps - cfg.sft_warmup)
    frac = min(1.0, (step - cfg.sft_warmup) / span)
    return cfg.sft_lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def sft(
    cfg: TinyLMConfig, model: torch.nn.Module, tokenizer: CharTokenizer, progress: bool = True,
    on_step: Callable[[int, float], None] | None = None,
) -> dict:
    """Supervised warm start in place; returns {"sft_seconds", "sft_final_loss" (an EMA of the
    per-step loss, decay 0.95), "sft_loss_curve" (the raw loss every 10 steps)}.
    ``on_step(step, loss)`` is called after every optimiser step (e.g. to evaluate along the way)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    engine = RolloutEngine(model, tokenizer.pad_id, tokenizer.eos_id, SamplingParams(temperature=1.0))
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.sft_lr, betas=(0.9, 0.98), weight_decay=cfg.sft_weight_decay)
    rng = np.random.default_rng(cfg.seed + 10_007)
    model.train()
    curve: list[float] = []
    ema = None
    t0 = time.perf_counter()
    bar = Progress(
        TextColumn("[bold]tiny-lm SFT"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(), console=Console(stderr=True), disable=not progress, transient=False,
    )
    with bar:
        task = bar.add_task("sft", total=cfg.sft_steps, info="")
        for step in range(cfg.sft_steps):
            pairs = sample_sft_problems(cfg.problems, rng, cfg.sft_batch_size, cfg.sft_direct_fraction)
            prompts = [tokenizer.encode(q, add_bos=True, strict=True) for q, _ in pairs]
            targets = [tokenizer.encode(s, add_eos=True, strict=True) for _, s in pairs]
            resp, mask = pad_right(targets, pad=tokenizer.pad_id)
            out = engine.score(prompts, resp, mask, temperature=1.0)
            loss = -out.log_prob.sum() / mask.sum()
            for g in opt.param_groups:
                g["lr"] = _lr_at(step, cfg)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            v = float(loss.detach())
            if on_step is not None:
                on_step(step, v)
            ema = v if ema is None else 0.95 * ema + 0.05 * v
            if step % 10 == 0 or step == cfg.sft_steps - 1:
                curve.append(round(v, 4))
            bar.update(task, advance=1, info=f"loss {ema:.3f}")
    model.eval()
    return {"sft_seconds": time.perf_counter() - t0, "sft_final_loss": ema, "sft_loss_curve": curve}


@torch.no_grad()
def greedy_accuracy(
    model: torch.nn.Module, tokenizer: CharTokenizer, task: TextArithmetic, qids: list[int] | None = None,
    max_new_tokens: int = 48, batch_size: int = 256,
) -> float:
    """Greedy pass@1 of ``model`` on ``qids`` (default: the task's validation ids)."""
    qids = list(task.val_ids if qids is None else qids)
    engine = RolloutEngine(model, tokenizer.pad_id, tokenizer.eos_id, SamplingParams(max_new_tokens=max_new_tokens))
    hits = 0.0
    for i in range(0, len(qids), batch_size):
        chunk = qids[i : i + batch_size]
        ro = engine.generate(task.prompts(chunk), greedy=True)
        hits += float(task.rewards(chunk, ro.tokens, ro.mask).sum())
    return hits / max(1, len(qids))


@contextlib.contextmanager
def _quiet_hf(enabled: bool):
    """Silence transformers' save/load progress bars (``enabled``: do it)."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    if enabled and was:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled and was:
            hf_logging.enable_progress_bar()


@contextlib.contextmanager
def _torch_threads(n: int):
    """The block at ``n`` torch threads; the caller's count afterwards."""
    was = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(was)


def _cached(path: Path) -> dict | None:
    """The record of the complete cache entry at ``path`` trained at :data:`SFT_THREADS`, else None (no
    entry, or one trained at the caller's thread count, whose weights may differ: trained again)."""
    try:
        record = json.loads((path / RECORD_FILE).read_text())
    except (OSError, ValueError):
        return None
    return record if record.get("torch_threads") == SFT_THREADS else None


def cached_entry(cfg: TinyLMConfig, cache_dir: str | Path | None = None) -> Path | None:
    """The directory of ``cfg``'s complete cache entry (what :func:`load_tiny_lm` would load), else None;
    nothing is loaded."""
    path = cache_root(cache_dir) / "tiny-lm" / config_hash(cfg)
    return path if _cached(path) else None


def _load_cached(path: Path) -> TinyLM:
    from transformers import AutoModelForCausalLM

    record = json.loads((path / RECORD_FILE).read_text())
    tokenizer = CharTokenizer.load(path)
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval()
    _set_generation_ids(model, tokenizer)
    return TinyLM(model, tokenizer, path, record, cache_hit=True)


def train_tiny_lm(cfg: TinyLMConfig, progress: bool = True) -> TinyLM:
    """Build and SFT a tiny LM (no cache), recording SFT time/loss and the warm-start accuracy; at
    :data:`SFT_THREADS` torch threads whatever the caller's (restored after), so that the weights are a
    function of ``cfg`` alone."""
    with _torch_threads(SFT_THREADS):
        return _train_tiny_lm(cfg, progress)


def _train_tiny_lm(cfg: TinyLMConfig, progress: bool) -> TinyLM:
    tokenizer = CharTokenizer()
    model = build_model(cfg, tokenizer)
    record: dict = {"config": cfg.model_dump(mode="json"), "hash": config_hash(cfg), "format": CACHE_FORMAT}
    record.update(sft(cfg, model, tokenizer, progress=progress))
    if cfg.eval_questions:
        task = TextArithmetic(TextArithmeticTaskConfig(problems=cfg.problems), tokenizer=tokenizer)
        ids = task.val_ids[: cfg.eval_questions]
        t0 = time.perf_counter()
        record["warm_start_accuracy"] = greedy_accuracy(model, tokenizer, task, ids, cfg.eval_max_new_tokens)
        record["warm_start_eval_questions"] = len(ids)
        record["warm_start_eval_seconds"] = time.perf_counter() - t0
    record["torch_threads"] = torch.get_num_threads()  # SFT_THREADS: an entry that says otherwise is retrained
    return TinyLM(model, tokenizer, None, record, cache_hit=False)


def load_tiny_lm(
    cfg: TinyLMConfig | None = None,
    cache_dir: str | Path | None = None,
    progress: bool = True,
    use_cache: bool = True,
    retrain: bool = False,
) -> TinyLM:
    """The warm-started tiny LM for ``cfg``: from the cache if present, else trained and cached.

    ``use_cache=False`` trains without reading or writing the cache; ``retrain=True`` trains and
    overwrites the cached copy. A cache entry is complete once its ``tiny_lm.json`` exists (it is
    written last, into a temporary directory that is then renamed into place); one whose record says
    it was trained at another thread count than :data:`SFT_THREADS` is trained again and replaced."""
    cfg = cfg or TinyLMConfig()
    if not use_cache:
        return train_tiny_lm(cfg, progress)
    path = cache_root(cache_dir) / "tiny-lm" / config_hash(cfg)
    with _quiet_hf(not progress):
        if not retrain and _cached(path):
            return _load_cached(path)
        with exclusive(path.parent / f".{path.name}.lock"):
            if not retrain and _cached(path):  # another process trained it meanwhile
                return _load_cached(path)
            tiny = train_tiny_lm(cfg, progress)
            tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
            os.chmod(tmp, 0o755)  # mkdtemp makes it 0700; the cache may be shared
            try:
                tiny.model.save_pretrained(tmp)
                tiny.tokenizer.save(tmp)
                (tmp / RECORD_FILE).write_text(json.dumps(tiny.record, indent=1))  # last: marks completion
                if path.exists():
                    shutil.rmtree(path)
                os.replace(tmp, path)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    tiny.path = path
    return tiny


SFT_SECONDS_PER_STEP = (0.05, 0.3)
"""Approximate seconds one SFT step of the default model takes on a 2-core CPU: 0.05 idle (the demo's
400 steps in 20 s on an AMD EPYC), up to 0.3 on a machine other work shares: the range a warm start
about to be trained is announced with."""


def sft_estimate(cfg: TinyLMConfig) -> str:
    """How long training the warm start of ``cfg`` takes, roughly: "under a minute", "roughly 20 s-2 min",
    "roughly 2-10 min"."""
    low, high = (cfg.sft_steps * s for s in SFT_SECONDS_PER_STEP)
    if high < 60:
        return "under a minute"
    hi_min = math.ceil(high / 60)
    if low < 60:
        return f"roughly {max(10, round(low, -1)):.0f} s-{hi_min} min"
    lo_min = round(low / 60)
    return f"roughly {lo_min} min" if hi_min <= lo_min else f"roughly {lo_min}-{hi_min} min"


def warm_start(cfg: TinyLMConfig, progress: bool = True, say: Callable[[str], None] | None = None) -> str:
    """Have the SFT warm start of ``cfg`` in the cache before a command's runs load it, training it now
    if it is not there; one line saying which, with its path (a cached warm start saves minutes).
    A warm start about to be trained is first announced through ``say`` in one line, with its number
    of SFT steps and roughly how long they take, since training it is silent without a progress bar."""
    path = cache_root() / "tiny-lm" / config_hash(cfg)
    if _cached(path):
        return f"tiny LM warm start: loaded from the cache, {path}"
    why = "not in the cache" if not (path / RECORD_FILE).is_file() else (
        f"the cached one was trained at another thread count than {SFT_THREADS}")
    if say is not None:
        per_step = "-".join(f"{s:g}" for s in SFT_SECONDS_PER_STEP)
        say(f"tiny LM warm start: {why}, training it now: {cfg.sft_steps} SFT steps, "
            f"{sft_estimate(cfg)} (approximate: about {per_step} s a step on a 2-core CPU)")
    t0 = time.perf_counter()
    tiny = load_tiny_lm(cfg, progress=progress)
    if tiny.cache_hit:  # another process trained it while this one waited for the lock
        return f"tiny LM warm start: loaded from the cache, {tiny.path} (trained meanwhile by another process)"
    minutes, seconds = divmod(round(time.perf_counter() - t0), 60)
    took = f"{minutes} m {seconds:02d} s" if minutes else f"{seconds} s"
    return f"tiny LM warm start: trained now in {took} ({why}); cached at {tiny.path} for the next runs"
