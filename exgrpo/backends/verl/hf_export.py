"""A veRL checkpoint of an external HF model (``policy.path`` of an hf policy, or ``backend.verl.model_path``)
as an HF model directory.

exgrpo does not rebuild such a model as one of its policies, so its checkpoint is evaluated as
the paper evaluates: with vLLM, from an HF directory. :func:`export` merges the actor's FSDP shards
(:func:`exgrpo.backends.verl.actor_weights.actor_state_dict`: ``weights_only`` loads; veRL's own
``model_merger`` unpickles) into ``<checkpoints>/verl_global_step_N_hf/``, once, atomically:

* ``model.safetensors``, the config, generation config and tokenizer (veRL's ``actor/huggingface/``,
  else the directory the run trained): what vLLM and transformers load;
* ``verl_run.json``: the run's spec (our config and veRL's overrides) and the step;
* ``val.parquet``: the run's validation split, so that the directory evaluates by itself (e.g. a
  registered copy downloaded from MLflow on another machine).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

from exgrpo.atomic import directory_atomic
from exgrpo.backends.base import HFCheckpoint
from exgrpo.backends.verl.prepared import SPEC_FILE, spec_model

_STEP_DIR = re.compile(r"^global_step_(\d+)$")
MODEL_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
               "special_tokens_map.json", "vocab.json", "merges.txt", "tokenizer.model", "chat_template.jinja")
"""What of an HF model directory besides its weights a merged checkpoint carries (those present)."""
VAL_FILE = "val.parquet"


def external_model(step_dir: Path) -> str | None:
    """The external model the run whose checkpoint ``step_dir`` is trained, None for the tiny LM (or when
    the run's spec is not beside it)."""
    spec = Path(step_dir).parent.parent / SPEC_FILE
    if not spec.is_file():
        return None
    return spec_model(json.loads(spec.read_text()))


def why_incomplete(step_dir: Path) -> str | None:
    """Why the actor shards of ``step_dir`` cannot be merged (a rank's file missing or empty), or None.
    Read from the file listing only: said before any shard is loaded."""
    actor = Path(step_dir) / "actor"
    try:
        world = int(json.loads((actor / "fsdp_config.json").read_text())["world_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return f"{actor / 'fsdp_config.json'} does not give the actor's world_size"
    files = [actor / f"model_world_size_{world}_rank_{r}.pt" for r in range(world)]
    bad = [f.name for f in files if not f.is_file() or f.stat().st_size == 0]
    if bad:
        return f"actor shards {bad} are missing or empty (world size {world})"
    return None


def merged_dir(step_dir: Path) -> Path:
    return Path(step_dir).parent / f"verl_{Path(step_dir).name}_hf"


def _spec_overrides(spec: dict[str, Any]) -> dict[str, str]:
    return dict(o.lstrip("+").split("=", 1) for o in spec.get("overrides", []) if "=" in o)


def export(step_dir: Path) -> Path:
    """``step_dir``'s actor as an HF model directory beside it (made once; see the module); returns it."""
    from safetensors.torch import save_file

    from exgrpo.backends.verl.actor_weights import actor_state_dict

    step_dir = Path(step_dir).resolve()
    out = merged_dir(step_dir)
    if (out / SPEC_FILE).is_file():
        return out
    if (reason := why_incomplete(step_dir)) is not None:
        raise FileNotFoundError(f"{step_dir}: {reason}; it cannot be merged (a torn save: use an earlier step)")
    spec = json.loads((step_dir.parent.parent / SPEC_FILE).read_text())
    overrides = _spec_overrides(spec)
    source = step_dir / "actor" / "huggingface"
    if not (source / "config.json").is_file():
        source = Path(spec_model(spec))
    with directory_atomic(out) as tmp:
        # clones: a tied head and embedding may share storage, which safetensors refuses to write twice
        weights = {k: v.detach().clone().contiguous() for k, v in actor_state_dict(step_dir).items()}
        save_file(weights, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        for name in MODEL_FILES:
            if (source / name).is_file():
                shutil.copy2(source / name, tmp / name)
        val = Path(overrides.get("data.val_files", ""))
        if val.is_file():
            shutil.copy2(val, tmp / VAL_FILE)
        step = int(_STEP_DIR.match(step_dir.name).group(1))
        (tmp / SPEC_FILE).write_text(json.dumps({**spec, "step": step, "verl_checkpoint": str(step_dir)}, indent=1))
    return out


def is_merged_dir(path: Path) -> bool:
    return Path(path).is_dir() and (Path(path) / SPEC_FILE).is_file() and (Path(path) / "config.json").is_file()


def _grader(config: dict[str, Any]):
    from exgrpo.backends.verl.reward import compute_score

    task = config["task"]
    kwargs = {"answer_format": task.get("answer_format", "boxed"), "require_think": bool(task.get("require_think"))}
    if task.get("max_answer_chars"):
        kwargs["max_answer_chars"] = task["max_answer_chars"]
    return lambda data_source, text, gold: compute_score(data_source, text, gold, **kwargs)


def hf_checkpoint(path: Path) -> HFCheckpoint | None:
    """``path`` (a ``global_step_N/`` of an external model's run, or its merged directory) as an
    :class:`HFCheckpoint`; None for anything else. A step directory whose shards are incomplete is a
    FileNotFoundError here, before anything is merged."""
    from exgrpo.backends.verl.actor_weights import is_step_dir

    path = Path(path).resolve()
    if is_merged_dir(path):
        spec = json.loads((path / SPEC_FILE).read_text())
        val = path / VAL_FILE
        return HFCheckpoint(json.dumps(spec["config"]), int(spec["step"]), val if val.is_file() else None,
                            _grader(spec["config"]), lambda: path)
    if not is_step_dir(path) or external_model(path) is None:
        return None
    if (reason := why_incomplete(path)) is not None:
        raise FileNotFoundError(f"--checkpoint {path}: {reason}; evaluate an earlier global_step_N")
    spec = json.loads((path.parent.parent / SPEC_FILE).read_text())
    val = Path(_spec_overrides(spec).get("data.val_files", ""))
    return HFCheckpoint(json.dumps(spec["config"]), int(_STEP_DIR.match(path.name).group(1)),
                        val if val.is_file() else None, _grader(spec["config"]), lambda: export(path))
