"""Run directories: a run resumes only from its own checkpoints, and a fresh run never mixes with old ones.

* :func:`run_identity_diff` compares the config a checkpoint was made with against the current one,
  ignoring :data:`SAFE_TO_CHANGE` (budget, evaluation cadence, where things are written, speed settings).
* :func:`check_resume` turns a difference into a one-line error naming the fields (unless forced).
* :func:`move_aside` moves an earlier run's directory out of a fresh run's way and says where.
* :func:`has_checkpoint` says whether a run directory holds checkpoints to resume from, and
  :func:`resumable` says so to the user when a ``--resume`` has none.
* :func:`read_metrics` / :func:`write_metrics`: its ``metrics.jsonl``, one record per step, on either backend.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from exgrpo.atomic import write_text_atomic
from exgrpo.config import ExperimentConfig, resume_safe_fields
from exgrpo.errors import UserError

logger = logging.getLogger(__name__)

SAFE_TO_CHANGE: frozenset[str] = resume_safe_fields()
"""Fields a resumed run may change (marked ``RESUME_SAFE`` in the config): they do not change what the
checkpoint means. The budget and the cadence of evaluation and checkpoints, where things are written
and run, and speed settings that compute the same thing up to float rounding (threads, the decoder,
packed weights, the optimiser's fused kernel, ...): a run checkpointed before a release changed such
a default resumes on the new one."""


def _flat(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _resolved(config: dict[str, Any] | str) -> dict[str, Any]:
    """The config as today's schema resolves it (a config saved by an older version may list fields
    that no longer apply, e.g. the ExGRPO fields of a GRPO run); as saved if it no longer validates."""
    from pydantic import ValidationError

    data = json.loads(config) if isinstance(config, str) else config
    try:
        return ExperimentConfig.model_validate(data).model_dump(mode="json")
    except ValidationError:
        return data


def run_identity_diff(saved: dict[str, Any] | str, current: dict[str, Any] | str) -> list[str]:
    """``field (saved -> current)`` for every field that differs, except :data:`SAFE_TO_CHANGE`."""
    a = _flat(_resolved(saved))
    b = _flat(_resolved(current))
    keys = sorted(set(a) | set(b))
    return [f"{k} ({a.get(k)!r} -> {b.get(k)!r})" for k in keys
            if a.get(k) != b.get(k) and k not in SAFE_TO_CHANGE]


class NothingToResume(FileNotFoundError, UserError):
    """--resume of a run directory that holds nothing this backend resumes from."""


class ResumeMismatch(ValueError, UserError):
    """--resume with a config that differs from the checkpoint's."""


def check_resume(saved: dict[str, Any] | str, current: dict[str, Any] | str, where: Path, force: bool = False) -> None:
    diff = run_identity_diff(saved, current)
    if diff and not force:
        raise ResumeMismatch(f"--resume: {where} was made with a different config: {'; '.join(diff)}. "
                             "Resume with the same settings, or pass --force-resume to continue anyway")


def has_checkpoint(run_dir: Path) -> bool:
    """True when ``run_dir/checkpoints`` holds anything (a native ``step_*.pt`` or a veRL
    ``global_step_N``): ``resume`` then continues it; whether it is readable, and the run's own, the
    backend checks when it loads it."""
    ckpts = Path(run_dir) / "checkpoints"
    return ckpts.is_dir() and any(ckpts.iterdir())


def resumable(cfg: Any) -> bool:
    """Whether ``--resume`` of ``cfg``'s run (an ExperimentConfig) continues from a checkpoint. When
    its directory holds none (killed before its first one), one line says so: the run then trains
    from step 1, as a fresh run."""
    run_dir = cfg.run_dir()
    if has_checkpoint(run_dir):
        return True
    every = cfg.train.checkpoint_every
    cadence = f"it checkpoints every {every} steps" if every else "train.checkpoint_every=0 checkpoints only at the end"
    where = f"{run_dir / 'checkpoints'} holds no checkpoint" if run_dir.is_dir() else f"{run_dir} does not exist"
    print(f"note: --resume: {where} ({cadence}); training from step 1", flush=True)
    return False


RECORD_FILE = "mlflow_run.json"
"""The file of a run directory naming its MLflow run and the process training it (``tracking.run_record``)."""


def prepare_run_dir(cfg: Any, resume: bool) -> bool:
    """The one decision of how a run starts, taken by the launcher before anything is written: with
    ``resume``, whether there is a checkpoint to continue (:func:`resumable`); a run that starts
    afresh gets its directory to itself, an earlier run moved aside and said so (:func:`move_aside`).
    Returns whether the run resumes. Taken twice it decides the same (a directory holding only the
    record of the run starting now is not an earlier run)."""
    resume_asked = resume
    resume = resume and resumable(cfg)
    if not resume:
        move_aside(cfg.run_dir(), resume_asked)
    return resume


def holds_earlier_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a run (anything but the MLflow record of the run starting now)."""
    return run_dir.exists() and not all(p.name == RECORD_FILE for p in run_dir.iterdir())


def refuse_earlier_run(run_dir: Path) -> None:
    """What a backend checks when told to start afresh: its directory holds no earlier run, whose
    checkpoints a fresh run would otherwise mix with its own (:func:`prepare_run_dir` moves one aside)."""
    if holds_earlier_run(run_dir):
        raise FileExistsError(f"{run_dir} holds an earlier run: start it through exgrpo.backends.base.train (or "
                              "the CLI), which moves that run aside, or resume it")


def move_aside(run_dir: Path, resume_asked: bool = False) -> Path | None:
    """If ``run_dir`` holds an earlier run, rename it to ``<run_dir>.old-<time>`` and return the new path
    (a directory holding only the MLflow record of the run starting now is not an earlier run).
    ``resume_asked``: ``--resume`` was given but found no checkpoint (:func:`resumable` said so)."""
    if not holds_earlier_run(run_dir):
        return None
    target = run_dir.with_name(f"{run_dir.name}.old-{time.strftime('%Y%m%d-%H%M%S')}")
    n = 1
    while target.exists():
        target = run_dir.with_name(f"{run_dir.name}.old-{time.strftime('%Y%m%d-%H%M%S')}-{n}")
        n += 1
    run_dir.rename(target)
    hint = "it had no checkpoint to resume from" if resume_asked else "use --resume to continue a run"
    print(f"note: {run_dir} held an earlier run; moved it to {target} ({hint})", flush=True)
    return target


def resumed_line(step: int, replay_stats: dict[str, float], where: Path | str) -> str:
    """What a resumed run tells the user, on either backend: the step and the pool it continues with."""
    if "pool/questions" in replay_stats:
        pool = (f"the replay pool restored with {int(replay_stats['pool/questions'])} questions "
                f"({int(replay_stats.get('pool/trajectories', 0))} trajectories, "
                f"{int(replay_stats.get('pool/retired', 0))} retired)")
    elif "notebook/buffer_size" in replay_stats or any(k.startswith("notebook/") for k in replay_stats):
        pool = "the notebook variant's replay buffer restored"
    else:
        pool = "no replay pool (on-policy)"
    return f"resumed at step {step} from {where}: {pool}"


def read_metrics(path: Path, up_to_step: int, warn: Callable[[str], None] = logger.warning) -> list[dict[str, float]]:
    """Metric records with step <= ``up_to_step`` (later ones belong to the killed tail). A line
    that does not parse (a kill during its write) is dropped with a warning."""
    if not path.exists():
        return []
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            warn(f"{path}:{n}: a torn metrics line is dropped ({line[:60]!r})")
    return [r for r in rows if r["step"] <= up_to_step]


def write_metrics(path: Path, rows: list[dict[str, float]]) -> None:
    write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in rows))
