"""One run of a config file, as ``exgrpo train``, ``doctor``, ``config`` and the train flow take it: an
experiment file's run, or one arm of a comparison file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from exgrpo.config.experiment import ExperimentConfig, load_compare, load_experiment, read_yaml
from exgrpo.config.fields import _flatten_into, flatten, resume_safe_fields
from exgrpo.config.options import ConfigError


def load_run(path: str | Path | None, overrides: dict[str, Any] | None = None, arm: str | None = None,
             option: str = "arm") -> tuple[ExperimentConfig, str | None]:
    """The config of one run of ``path``: an experiment file's, or one arm of a comparison file (``arm``,
    else its first) with the seed given in ``overrides``, else the comparison's first; ``overrides``
    apply to a comparison's base, as in ``exgrpo compare``. Returns it with the line that says which arm
    of a comparison it is (None for an experiment file), for the command or flow to show. ``option``:
    how the caller's user names ``arm`` (``--arm`` on the command line)."""
    overrides = dict(overrides or {})
    if path is None or "arms" not in read_yaml(path):
        if arm is not None:
            raise ConfigError(f"{option} {arm}: {path or 'the default config'} is not a comparison file (it has no "
                              f"`arms:`); drop {option}")
        return load_experiment(path, overrides), None
    seed = overrides.pop("seed", None)
    cc = load_compare(path, overrides)
    arms = list(cc.arms)
    if arm is None:
        arm = arms[0]
    elif arm not in cc.arms:
        raise ConfigError(f"{option} {arm}: {path} has no such arm; its arms are {', '.join(arms)}")
    cfg = cc.arm_config(arm, cc.seeds[0] if seed is None else seed)
    note = (f"{path} is a comparison of {', '.join(arms)}: training its arm {arm}, seed {cfg.seed} "
            f"(another arm: {option} NAME; every arm and seed: exgrpo compare {path})")
    if {k for k in overrides if k != "output_dir"} and (differ := _differs_from_run_there(cfg)):
        raise ConfigError(
            f"{cfg.run_dir()} holds the comparison's run of arm {arm}, seed {cfg.seed}, made with another config "
            f"({', '.join(differ[:3])}{', ...' if len(differ) > 3 else ''}); training these overrides there would move "
            f"it aside: give this run its own name (--set name=NAME) or --output-dir")
    return cfg, note


def _differs_from_run_there(cfg: ExperimentConfig) -> list[str]:
    """The fields (not resume-safe) in which ``cfg`` differs from the run its directory already holds
    (``config.json``); empty when there is none, or it is this config's run."""
    try:
        saved = json.loads((cfg.run_dir() / "config.json").read_text())
    except (OSError, ValueError):
        return []
    before: dict[str, Any] = {}
    _flatten_into(before, "", saved)
    before = {k.lstrip("."): v for k, v in before.items()}
    now, safe = flatten(cfg), resume_safe_fields()
    return sorted(k for k in set(before) | set(now) if k not in safe and before.get(k) != now.get(k))
