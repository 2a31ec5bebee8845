"""The sweep file: search space over any config field, study settings, validation, storage URLs."""

from __future__ import annotations

import difflib
import json
import math
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from exgrpo.config import (
    ConfigError,
    ExperimentConfig,
    apply_overrides,
    config_fields,
    load_experiment,
    read_yaml,
    validate_config,
)
from exgrpo.sqlite_wal import sqlite_file, with_sqlite_file
from exgrpo.tracking import project_root


class SweepError(ConfigError):
    """A sweep definition or study problem, phrased for the user."""


# --------------------------------------------------------------------------------------------
# The sweep file
# --------------------------------------------------------------------------------------------
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ParamSpec(_Strict):
    """One search-space dimension over a dotted config field."""

    type: Literal["float", "int", "categorical"]
    """float / int range, or a list of choices."""
    low: float | None = None
    """Lower bound (float/int)."""
    high: float | None = None
    """Upper bound, inclusive (float/int)."""
    log: bool = False
    """Sample on a log scale (float/int; low must be > 0)."""
    step: float | None = None
    """Discretisation step (float/int; needed for a grid over a range)."""
    choices: list[Any] | None = None
    """Choices (categorical)."""

    @model_validator(mode="after")
    def _check(self) -> ParamSpec:
        if self.type == "categorical":
            if not self.choices:
                raise ValueError("categorical needs a non-empty `choices` list")
            if any(v is not None for v in (self.low, self.high, self.step)) or self.log:
                raise ValueError("categorical takes only `choices` (no low/high/step/log)")
            return self
        if self.choices is not None:
            raise ValueError(f"{self.type} takes low/high (and log or step), not choices")
        if self.low is None or self.high is None:
            raise ValueError(f"{self.type} needs both `low` and `high`")
        if not self.low < self.high:
            raise ValueError(f"low={self.low} must be < high={self.high}")
        if self.log and self.low <= 0:
            raise ValueError(f"log scale needs low > 0 (got low={self.low})")
        if self.log and self.step is not None:
            raise ValueError("use either log or step, not both")
        if self.type == "int":
            for name in ("low", "high", "step"):
                v = getattr(self, name)
                if v is not None and float(v) != int(v):
                    raise ValueError(f"int range: {name}={v} is not an integer")
        if self.step is not None and self.step <= 0:
            raise ValueError(f"step={self.step} must be > 0")
        return self

    def distribution(self):
        import optuna.distributions as d

        if self.type == "categorical":
            return d.CategoricalDistribution(self.choices)
        if self.type == "int":
            return d.IntDistribution(int(self.low), int(self.high), log=self.log, step=int(self.step or 1))
        return d.FloatDistribution(float(self.low), float(self.high), log=self.log, step=self.step)

    def grid(self) -> list[Any]:
        if self.type == "categorical":
            return list(self.choices)
        step = self.step if self.step is not None else (1 if self.type == "int" else None)
        if step is None:
            raise ValueError("a grid over a float range needs `step` (or use type: categorical)")
        n = int(math.floor((self.high - self.low) / step + 1e-9)) + 1
        vals = [self.low + i * step for i in range(n)]
        return [int(v) for v in vals] if self.type == "int" else [round(v, 12) for v in vals]

    def contains(self, value: Any) -> bool:
        if self.type == "categorical":
            return value in self.choices
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        return self.low <= value <= self.high and (self.type == "float" or float(value) == int(value))


class StudySpec(_Strict):
    """The Optuna study."""

    name: str
    """Study name (resume key)."""
    storage: str | None = None
    """Optuna storage URL; None: sqlite:///<project>/studies/optuna.db (a DB URL on a cluster)."""
    direction: Literal["maximize", "minimize"] = "maximize"
    metric: str = "val/accuracy"
    """Objective: the trial's final value of this metric; intermediate values are reported at eval steps."""
    n_trials: int = Field(20, ge=1)
    """Total finished trials of the study (a re-run adds only the missing ones)."""
    parallel: int = Field(2, ge=1)
    """Trials in flight (Ray tasks of ``train.threads`` CPUs each: Ray runs as many as the cores allow)."""
    sampler: Literal["tpe", "grid", "random"] = "tpe"
    """tpe: multivariate TPE (constant liar for parallel trials); grid: every combination of the space."""
    n_startup_trials: int = Field(5, ge=0)
    """Random trials before TPE starts modelling."""
    pruner: Literal["median", "successive_halving", "wilcoxon", "none"] = "median"
    """median: against the median of finished trials at the same step; wilcoxon: a paired signed-rank test of
    the held-out result per question against the best trial (the one for LM tiers; native backend)."""
    pruner_startup_trials: int = Field(3, ge=0)
    """median: trials that finish before pruning starts."""
    pruner_warmup_steps: int = Field(0, ge=0)
    """median: steps of a trial before it can be pruned; wilcoxon: per-question results before it can be."""
    pruner_p_threshold: float = Field(0.1, gt=0.0, lt=1.0)
    """wilcoxon: prune when the one-sided p-value of 'worse than the best trial' is below this."""
    seed: int | None = 0
    """Sampler seed."""
    enqueue_defaults: bool = True
    """Make the paper's defaults (the schema defaults, rbound = K-1) the first trial of a new study."""
    enqueue: list[dict[str, Any]] = []
    """Further fixed trials to run first (dotted field -> value)."""


class SweepConfig(_Strict):
    """A sweep file (e.g. experiments/toy-sweep.yaml)."""

    study: StudySpec
    base: str | dict[str, Any] = "experiments/toy.yaml"
    """Experiment YAML (its `base:` if it is a comparison file; relative to the sweep file, then cwd) or an inline config."""
    base_overrides: dict[str, Any] = {}
    """Dotted overrides of the base shared by all trials."""
    budget_steps: int = Field(..., ge=1)
    """train.max_steps of every trial: the fixed compute budget."""
    space: dict[str, ParamSpec]
    """Dotted config field -> distribution."""
    mlflow_experiment: str | None = None
    """MLflow experiment of the parent and trial runs; None: the base config's name."""


# --------------------------------------------------------------------------------------------
# Loading and validation
# --------------------------------------------------------------------------------------------
def validate_space(space: dict[str, Any]) -> None:
    """Unknown fields (with close matches) and an empty space are errors, before any work."""
    if not space:
        raise SweepError("search space is empty; add at least one field under `space:`, e.g.\n"
                         "  space:\n    algorithm.experience_ratio: {type: float, low: 0.1, high: 0.9}")
    fields = config_fields()
    bad = []
    for name in space:
        if name not in fields:
            close = difflib.get_close_matches(name, fields, n=3, cutoff=0.5)
            if not close:  # also match on the last component (e.g. `is_clip` -> algorithm.is_clip)
                close = [f for f in fields if f.rsplit(".", 1)[-1] == name.rsplit(".", 1)[-1]][:3]
            hint = f"; did you mean {', '.join(close)}?" if close else "; run `exgrpo config` to list the fields"
            bad.append(f"  {name}: unknown config field{hint}")
    if bad:
        raise SweepError("search space:\n" + "\n".join(bad))


def load_sweep(path: str | Path | dict[str, Any], overrides: dict[str, Any] | None = None) -> SweepConfig:
    """Parse and validate a sweep file; ``overrides`` are dotted keys into the file itself
    (e.g. ``{"study.n_trials": 4, "budget_steps": 12}``)."""
    data = dict(path) if isinstance(path, dict) else read_yaml(path)
    data = _apply_sweep_overrides(data, overrides or {})
    validate_space(data.get("space") or {})
    try:
        sc = SweepConfig.model_validate(data)
    except ValidationError as err:
        lines = [f"invalid sweep ({path if not isinstance(path, dict) else 'mapping'}):"]
        for e in err.errors():
            loc = ".".join(str(x) for x in e["loc"])
            msg = e["msg"].removeprefix("Value error, ")
            if e["type"] == "extra_forbidden":
                msg = "unknown key"
            lines.append(f"  {loc}: {msg}")
        raise SweepError("\n".join(lines)) from None
    if isinstance(sc.base, str) and not isinstance(path, dict):
        rel = Path(path).parent / sc.base
        if not Path(sc.base).is_file() and rel.is_file():
            sc = sc.model_copy(update={"base": str(rel)})
    if sc.study.sampler == "grid":
        for name, spec in sc.space.items():
            try:
                spec.grid()
            except ValueError as e:
                raise SweepError(f"space.{name}: {e}") from None
    for i, fixed in enumerate(sc.study.enqueue):
        unknown = sorted(set(fixed) - set(sc.space))
        if unknown:
            raise SweepError(f"study.enqueue[{i}]: {unknown} not in the search space {sorted(sc.space)}")
    check_bounds(sc)  # the shared base, and each bound of each field, must be valid on its own
    if sc.study.pruner == "wilcoxon" and base_config(sc).backend.name != "native":
        raise SweepError("study.pruner: wilcoxon needs per-question held-out results, which only the native backend "
                         "reports; use pruner: median (or none) for a veRL sweep")
    sized = sorted(k for k in sc.space if k in JOB_SIZE_FIELDS)
    if sized and base_config(sc).backend.name == "verl":
        raise SweepError(f"space.{sized[0]}: a sweep plans its veRL trials' room on the cluster from the base "
                         f"config, so a trial's job size cannot be searched; run one sweep per size "
                         f"(--set base.{sized[0]}=N) and compare their best trials")
    if str(getattr(base_config(sc).task, "held_out", "tuning")) == "test":
        raise SweepError("task.held_out: a sweep chooses on what it reads, so it reads the tuning split; remove "
                         "task.held_out=test from the sweep (report the chosen trial with exgrpo compare on test)")
    return sc


JOB_SIZE_FIELDS = ("backend.verl.nnodes", "backend.verl.workers_per_node")
"""The fields a veRL job's size on the cluster follows (exgrpo.backends.verl.resources.needs)."""


def check_bounds(sc: SweepConfig) -> None:
    """Each bound (low, high) or choice of each searched field must be a valid value of that field,
    checked on the sweep's base config before any trial runs; SweepError naming the bound if not."""
    base = base_config(sc).model_dump(mode="json")
    for name, spec in sc.space.items():
        values = list(spec.choices or []) if spec.type == "categorical" else [spec.low, spec.high]
        for value in values:
            if spec.type == "int":
                value = int(value)
            try:
                _from_mapping(apply_overrides(base, {name: value}), {}, source=f"space.{name}")
            except ConfigError as e:
                why = next((ln.strip() for ln in str(e).splitlines() if ln.strip().startswith(name)), str(e).splitlines()[-1])
                raise SweepError(f"space.{name}: {value!r} is not a valid value of the field ({why})") from None


def _apply_sweep_overrides(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``study.n_trials=4``, ``budget_steps=12``, ``base.<config field>=v`` (-> base_overrides) and
    ``space.<config field>.<low|high|log|step|choices>=v``."""
    import copy

    data = copy.deepcopy(data)
    plain = {}
    for key, value in overrides.items():
        if key.startswith("base."):
            data.setdefault("base_overrides", {})[key.removeprefix("base.")] = value
        elif key.startswith("space."):
            fld, attr = key.removeprefix("space.").rsplit(".", 1)
            data.setdefault("space", {}).setdefault(fld, {})[attr] = value
        else:
            plain[key] = value
    return apply_overrides(data, plain)


def base_config(sc: SweepConfig) -> ExperimentConfig:
    overrides = {**sc.base_overrides, "train.max_steps": sc.budget_steps}
    if isinstance(sc.base, dict):
        return _from_mapping(sc.base, overrides)
    return load_experiment(sc.base, overrides)


def _from_mapping(data: dict[str, Any], overrides: dict[str, Any], source: str = "sweep base") -> ExperimentConfig:
    return validate_config(ExperimentConfig, apply_overrides(data, overrides), source=source)


def trial_config(sc: SweepConfig, params: dict[str, Any], number: int) -> ExperimentConfig:
    """The validated config of one trial (raises ConfigError for an invalid combination)."""
    base = base_config(sc)
    out = Path(base.output_dir).resolve() / "sweeps" / sc.study.name / f"trial{number:04d}"
    data = apply_overrides(base.model_dump(mode="json"), {**params, "output_dir": str(out)})
    return _from_mapping(data, {}, source=f"trial {number}: {params}")


def space_signature(sc: SweepConfig) -> str:
    """What a study is keyed on besides its name: space, direction, metric."""
    return json.dumps({
        "space": {k: v.model_dump(exclude_defaults=True) for k, v in sorted(sc.space.items())},
        "direction": sc.study.direction, "metric": sc.study.metric,
    }, sort_keys=True, default=str)


def default_storage() -> str:
    return f"sqlite:///{project_root() / 'studies' / 'optuna.db'}"


def resolve_storage(url: str | None) -> str:
    """The argument, else ``EXGRPO_OPTUNA_STORAGE``, else :func:`default_storage`; a sqlite file's
    path made absolute (Ray workers run elsewhere) and its directory created."""
    url = url or os.environ.get("EXGRPO_OPTUNA_STORAGE") or default_storage()
    db = sqlite_file(url)
    if db is not None:
        db = db.resolve()
        db.parent.mkdir(parents=True, exist_ok=True)
        url = with_sqlite_file(url, db)
    return url

