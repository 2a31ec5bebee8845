"""What a veRL run reads from disk, built from our typed config: an HF model directory (the tiny
LM's SFT warm start with an HF tokenizer over its character vocabulary) and train/val parquet files
of the task's questions in veRL's RLHFDataset layout (for a file task, its file's rows, split as the
native trainer splits them). Nothing is downloaded.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from exgrpo.atomic import directory_atomic
from exgrpo.config import (ConfigError, ExperimentConfig, FileTaskConfig, HFPolicyConfig, LMPolicyConfig,
                           TextArithmeticTaskConfig)
from exgrpo.config.backend import verl_model, verl_model_field

DATA_SOURCE = "exgrpo/text_arithmetic"
"""``data_source`` of our task's rows; :mod:`exgrpo.backends.verl.reward` grades it with the task's grader."""

CHAT_TEMPLATE = "{{ bos_token }}{% for m in messages %}{{ m['content'] | lower }}{% endfor %}"
"""``[BOS] + chars(question.lower())``: the tiny-lm tier's prompt, as a chat template for veRL."""


def hf_char_tokenizer(char_tokenizer):
    """A ``PreTrainedTokenizerFast`` that encodes exactly like :class:`CharTokenizer` (one token per
    character, unknown characters to ``<unk>``), so veRL's dataset and agent loop can load it."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab=dict(char_tokenizer.token_to_id), unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")  # every character, newlines too
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(["<pad>", "<bos>", "<eos>", "<unk>"])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>",
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def model_positions(model: str) -> int | None:
    """The positions an HF model holds (``max_position_embeddings`` of its ``config.json``): ``model`` is
    a local directory or a hub id in the local HF cache; None when its config is not found here."""
    config = Path(model).expanduser() / "config.json"
    if not config.is_file():
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(model, "config.json")
        except (ImportError, ValueError):  # no hub client, or not a hub id (e.g. an absolute path)
            return None
        if not isinstance(cached, str):
            return None
        config = Path(cached)
    try:
        data = json.loads(config.read_text())
    except (OSError, ValueError):
        return None
    positions = data.get("max_position_embeddings", (data.get("text_config") or {}).get("max_position_embeddings"))
    return positions if isinstance(positions, int) else None


def check_model_context(cfg: ExperimentConfig) -> None:
    """A vLLM rollout's model must hold the longest prompt plus the longest response: veRL sizes vLLM's
    context from the model's config, and on cuda a shorter one cuts every response there without a word.
    ConfigError in one line otherwise (a model whose config is not found here is left to veRL)."""
    v, model = cfg.backend.verl, verl_model(cfg)
    if v.rollout != "vllm" or model is None:
        return
    need = v.max_prompt_length + cfg.policy.max_new_tokens
    have = model_positions(model)
    if have is not None and have < need:
        raise ConfigError(
            f"{verl_model_field(cfg)}={model}: the model holds {have} positions (max_position_embeddings "
            f"in its config.json), fewer than backend.verl.max_prompt_length + policy.max_new_tokens = {need}; "
            "extend its context (rope_theta and max_position_embeddings, docs/gpu.md) or lower policy.max_new_tokens")


def model_dir(cfg: ExperimentConfig, progress: bool = False) -> str:
    """The model directory (or hub id) veRL trains: ``policy.path`` of an hf policy (a packaged model made
    once), ``backend.verl.model_path``, or the tiny LM exported (:func:`export_model`)."""
    if isinstance(cfg.policy, HFPolicyConfig):
        from exgrpo.policies.lm.hf_model import any_family_dir

        return str(any_family_dir(cfg.policy.path, progress=progress))
    return cfg.backend.verl.model_path or str(export_model(cfg, progress=progress))


def export_model(cfg: ExperimentConfig, progress: bool = False) -> Path:
    """The tiny LM of ``cfg.policy.model`` (SFT warm start, trained once and cached) as an HF model
    directory veRL loads with ``AutoModelForCausalLM`` / ``AutoTokenizer``; cached beside it."""
    from exgrpo.policies.lm.tiny_lm import cached_entry, load_tiny_lm  # torch: not imported with the runner, which reads this module

    if not isinstance(cfg.policy, LMPolicyConfig):
        raise ValueError(f"backend.name=verl needs policy.kind=lm (the tiny LM), got policy.kind={cfg.policy.kind!r}")
    entry = cached_entry(cfg.policy.model)
    if entry is not None and (entry / "hf-verl" / "tokenizer.json").is_file():
        return entry / "hf-verl"  # exported before: neither transformers nor the model is loaded (seconds of CPU)
    tiny = load_tiny_lm(cfg.policy.model, progress=progress)
    out = tiny.path / "hf-verl"
    if (out / "tokenizer.json").is_file():
        return out
    with directory_atomic(out) as tmp:
        tiny.model.save_pretrained(tmp)
        hf_char_tokenizer(tiny.tokenizer).save_pretrained(tmp)
        gen = {"bos_token_id": tiny.tokenizer.bos_id, "eos_token_id": tiny.tokenizer.eos_id,
               "pad_token_id": tiny.tokenizer.pad_id}
        (tmp / "generation_config.json").write_text(json.dumps(gen))
    return out


def _text_arithmetic_rows(cfg: ExperimentConfig, model: str) -> dict[str, list[dict]]:
    from exgrpo.tasks.text_arithmetic import TextArithmetic  # torch: as above

    task = TextArithmetic(cfg.task)
    return {split: [{
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": task.question_text(q)}],
        "ability": "arithmetic",
        "reward_model": {"style": "rule", "ground_truth": str(task.answers[q])},
        "extra_info": {"index": i, "qid": int(q), "split": split},
    } for i, q in enumerate(ids)] for split, ids in (("train", task.train_ids), ("val", task.val_ids))}


def _file_rows(cfg: ExperimentConfig, model: str) -> dict[str, list[dict]]:
    """The file task's questions as the native task splits them (``task.val_path``, or ``task.n_val`` of
    ``task.path``), system messages dropped when it drops them, and with ``task.max_prompt_length`` those
    whose prompt in ``model``'s chat template is longer left out, as the native task leaves them out; the
    file's own ``extra_info.index`` is kept as ``extra_info.source_index``."""
    from exgrpo.tasks.openr1 import OpenR1Task  # torch: as above

    tokenizer = None
    if cfg.task.max_prompt_length is not None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model, local_files_only=True)
    task = OpenR1Task(cfg.task, tokenizer=tokenizer)
    return {split: [{
        "data_source": task.data_sources[q],
        "prompt": task.messages[q],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": task.golds[q]},
        "extra_info": {"index": i, "source_index": task.indices[q], "qid": int(q), "split": split},
    } for i, q in enumerate(ids)] for split, ids in (("train", task.train_ids), ("val", task.val_ids))}


DATASETS: dict[type, Callable[[ExperimentConfig, str], dict[str, list[dict]]]] = {
    TextArithmeticTaskConfig: _text_arithmetic_rows,
    FileTaskConfig: _file_rows,
}
"""Task config -> its train and val rows in veRL's layout (the tasks whose data a veRL run builds)."""


def write_dataset(cfg: ExperimentConfig, directory: Path, model: str) -> tuple[Path, Path]:
    """Train and validation parquet files of the task in veRL's layout (``model``: the directory veRL
    trains, whose tokenizer counts a prompt's tokens). ``extra_info.index`` is the
    row of the file (the replay pool's key: the sampler yields rows), ``extra_info.qid`` the task's
    question id."""
    import pandas as pd

    build = DATASETS.get(type(cfg.task))
    if build is None:
        kinds = ", ".join(c.model_fields["kind"].default for c in DATASETS)
        raise ValueError(f"backend.name=verl builds data for task.kind={kinds}, got {cfg.task.kind!r}")
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for split, rows in build(cfg, model).items():
        path = directory / f"{split}.parquet"
        tmp = path.with_suffix(".parquet.tmp")
        pd.DataFrame(rows).to_parquet(tmp, index=False)
        os.replace(tmp, path)
        paths.append(path)
    return paths[0], paths[1]
