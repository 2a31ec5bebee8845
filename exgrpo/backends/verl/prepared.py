"""A prepared veRL run and how its end is told: its spec file, the error of a failed run, and the
one-line diagnosis a job prints of its own failure (shared by the child-process and Ray Job launches)."""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

SPEC_FILE = "verl_run.json"
"""The run's spec in its run directory: our config, the veRL overrides derived from it, and the directory
of the external model it trains (``external_model``)."""


def spec_model(spec: dict) -> str | None:
    """The external HF model a run's spec says it trains (the directory veRL loaded), None for the tiny LM.
    A spec written before ``external_model`` was recorded names it in ``backend.verl.model_path``."""
    return spec.get("external_model") or spec["config"]["backend"]["verl"].get("model_path")
JOB_ERROR = "exgrpo: error: "
"""Prefix of the one line a job prints when it diagnosed its own failure (the runner reports just that)."""


OOM_KILLS = re.compile(r"(\d+) Workers \(tasks / actors\) killed due to memory pressure \(OOM\)")
"""Ray's raylet, in a driver's log, when its memory monitor killed workers of the job (node memory over
``RAY_memory_usage_threshold``)."""


def fatal_line(line: str) -> str | None:
    """Why the job cannot finish, if ``line`` of its log says so while it still runs; else None.

    Ray's memory monitor kills the workers of veRL's actors (the trainer, the rollout servers), which
    are never restarted, yet the driver can wait on them until the stall bound ends it: the run is
    stopped on the line instead, its reason named."""
    match = OOM_KILLS.search(line)
    if match and int(match.group(1)) > 0:
        return (f"out of memory: Ray's memory monitor killed {match.group(1)} of its workers (the node's memory use "
                "passed RAY_memory_usage_threshold), so it was stopped; free memory on the node or run fewer jobs on it")
    return None


def stalled(seconds: float) -> str:
    """Why a job whose log stayed the same for ``seconds`` was stopped."""
    return f"stalled: no output for {seconds:.0f} s (backend.verl.stall_timeout_s), so it was stopped"


class VerlRunError(RuntimeError):
    """A veRL run that failed: the one-line reason and the last lines of its log."""


@dataclass
class PreparedRun:
    run_dir: Path
    command: list[str]
    env: dict[str, str]
    """Variables the run needs on top of the caller's environment (also a Ray Job's runtime_env)."""
    scratch: list[Path] = field(default_factory=list)
    """Directories made for this run alone (its private Ray's temp dir, its datasets cache), removed when it ends."""


def diagnosed(lines) -> str | None:
    """The job's own one-line diagnosis (e.g. a cluster too small for it), if it printed one."""
    for line in reversed(list(lines)):
        if line.startswith(JOB_ERROR):
            return line[len(JOB_ERROR):].strip()
    return None


DIAGNOSIS_LINES = 2000
"""How many of a failed job's last lines its error is read from: a dead vLLM engine's cause is its
worker's traceback, tens of lines above the death's report."""

ERROR_CHARS = 1000
"""The most of an error line a failure's one-line reason quotes: cut at a word, with the exception's name."""


def last_error(lines) -> str:
    """The last line of ``lines`` that names an error (e.g. a rollout server's exception), as a clause:
    whole, or its first :data:`ERROR_CHARS` characters cut at a word (never mid-word). When a vLLM
    engine died, the exception that killed it follows (the death's own line says only "See stack
    trace (above)")."""
    from exgrpo.evaluation.vllm_engine import engine_death_cause  # (not with the job's entry point, which reads JOB_ERROR)

    lines = list(lines)
    for line in reversed(lines):
        if "Error" in line or "Exception" in line:
            cause = engine_death_cause(lines)
            why = f"; its cause: {textwrap.shorten(cause, ERROR_CHARS, placeholder=' ...')}" if cause else ""
            return textwrap.shorten(line.strip(), ERROR_CHARS, placeholder=" ...") + why + "; "
    return ""
