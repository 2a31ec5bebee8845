"""Hyper-parameter sweeps: an Optuna study over any config field, trials as Ray tasks.

Orchestration-free (no Prefect import); ``flows/sweep.py`` and ``exgrpo sweep`` call :func:`run_sweep`.

Design (ask-and-tell):
- The driver owns the study: it asks for a trial (params sampled there, from the sampler's view of
  every finished trial), submits it as a Ray task (1 CPU, ``study.parallel`` in flight) and tells
  the outcome (COMPLETE with the final metric, PRUNED, or FAIL with the error in the user attr
  ``error``). A failed trial never stops the study.
- Pruning happens inside the Ray task: it loads the study by name from the shared storage (sqlite
  by default) with the same pruner, wraps its trial with ``optuna.trial.Trial(study, trial_id)``
  and, at every evaluation step, calls ``trial.report`` / ``trial.should_prune`` from a trainer
  callback that raises ``optuna.TrialPruned``. This needs storage every worker can reach: a sqlite
  file on this machine, or a database URL on a cluster (never in-memory storage).
- Every trial is an MLflow child run under one parent run per study (its id is kept in the study's
  user attr ``mlflow_parent_run_id``, so a resumed study keeps logging under the same parent).
- Resume: run again with the same ``study.name`` and storage; ``study.n_trials`` is the study's
  total, so a re-run adds only what is missing. A study of that name with a different search space
  (or direction/metric) is an error, not a silent mix.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from exgrpo.config import ConfigError, ExperimentConfig, apply_overrides, flatten, load_experiment, read_yaml


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
    """Trials in flight (Ray tasks with 1 CPU each)."""
    sampler: Literal["tpe", "grid", "random"] = "tpe"
    """tpe: multivariate TPE (constant liar for parallel trials); grid: every combination of the space."""
    n_startup_trials: int = Field(5, ge=0)
    """Random trials before TPE starts modelling."""
    pruner: Literal["median", "successive_halving", "none"] = "median"
    pruner_startup_trials: int = Field(3, ge=0)
    """median: trials that finish before pruning starts."""
    pruner_warmup_steps: int = Field(0, ge=0)
    """median: steps of a trial before it can be pruned."""
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
def config_fields() -> list[str]:
    return sorted(flatten(ExperimentConfig()))


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
    base_config(sc)  # the shared base must be valid on its own
    return sc


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
    from exgrpo.config import _validate

    return _validate(ExperimentConfig, apply_overrides(data, overrides), source=source)


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
    from exgrpo.tracking import project_root

    return f"sqlite:///{project_root() / 'studies' / 'optuna.db'}"


def resolve_storage(url: str | None) -> str:
    url = url or os.environ.get("EXGRPO_OPTUNA_STORAGE") or default_storage()
    if url.startswith("sqlite:///"):
        p = Path(url.removeprefix("sqlite:///"))
        p = p if p.is_absolute() else p.resolve()
        p.parent.mkdir(parents=True, exist_ok=True)
        url = f"sqlite:///{p}"
    return url


def make_sampler(sc: SweepConfig):
    import optuna

    s = sc.study
    if s.sampler == "grid":
        return optuna.samplers.GridSampler({k: v.grid() for k, v in sc.space.items()}, seed=s.seed)
    if s.sampler == "random":
        return optuna.samplers.RandomSampler(seed=s.seed)
    return optuna.samplers.TPESampler(multivariate=True, constant_liar=True, seed=s.seed,
                                      n_startup_trials=s.n_startup_trials)


def make_pruner(study: StudySpec):
    import optuna

    if study.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=study.pruner_startup_trials,
                                           n_warmup_steps=study.pruner_warmup_steps)
    if study.pruner == "successive_halving":
        return optuna.pruners.SuccessiveHalvingPruner()
    return optuna.pruners.NopPruner()


def paper_defaults(sc: SweepConfig) -> dict[str, Any]:
    """Schema defaults (the reference run) of the space's fields, where they lie in the space."""
    defaults = flatten(ExperimentConfig())
    base = base_config(sc)
    out = {}
    for name, spec in sc.space.items():
        v = defaults.get(name)
        if v is None and name == "algorithm.bucket_rbound" and not spec.contains(None):
            v = base.algorithm.rbound  # None means K-1
        if spec.contains(v):
            out[name] = v
    return out


def open_study(sc: SweepConfig, storage: str | None = None):
    """Create the study, or load it (resume) after checking it was made with the same space."""
    import optuna

    url = resolve_storage(storage or sc.study.storage)
    sig = space_signature(sc)
    names = optuna.study.get_all_study_names(url) if _storage_exists(url) else []
    if sc.study.name in names:
        study = optuna.load_study(study_name=sc.study.name, storage=url, sampler=make_sampler(sc),
                                  pruner=make_pruner(sc.study))
        old = study.user_attrs.get("exgrpo_space")
        if old is not None and old != sig:
            diff = _space_diff(json.loads(old), json.loads(sig))
            raise SweepError(
                f"study {sc.study.name!r} in {url} was created with a different search space "
                f"(differs in: {', '.join(diff)}); use a new study.name, or restore the original space to resume it"
            )
        return study, url, False
    study = optuna.create_study(study_name=sc.study.name, storage=url, direction=sc.study.direction,
                                sampler=make_sampler(sc), pruner=make_pruner(sc.study))
    study.set_user_attr("exgrpo_space", sig)
    study.set_user_attr("budget_steps", sc.budget_steps)
    if sc.study.enqueue_defaults:
        d = paper_defaults(sc)
        if d:
            study.enqueue_trial(d, user_attrs={"enqueued": "paper-defaults"})
    for fixed in sc.study.enqueue:
        study.enqueue_trial(fixed, user_attrs={"enqueued": "sweep-file"})
    return study, url, True


def _storage_exists(url: str) -> bool:
    if url.startswith("sqlite:///"):
        return Path(url.removeprefix("sqlite:///")).is_file()
    return True


def _space_diff(old: dict, new: dict) -> list[str]:
    out = [k for k in ("direction", "metric") if old.get(k) != new.get(k)]
    o, n = old.get("space", {}), new.get("space", {})
    out += [k for k in sorted(set(o) | set(n)) if o.get(k) != n.get(k)]
    return out or ["<unknown>"]


# --------------------------------------------------------------------------------------------
# Ray
# --------------------------------------------------------------------------------------------
def ensure_ray(address: str | None = None, num_cpus: int = 2) -> None:
    """``ray.init`` once per process: local with ``num_cpus`` and no dashboard, or ``address``."""
    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": True}
    tmp = os.environ.get("RAY_TMPDIR")
    if address:
        kwargs["address"] = address
    else:
        kwargs["num_cpus"] = num_cpus
        if tmp:
            kwargs["_temp_dir"] = str(Path(tmp).resolve())
    kwargs["runtime_env"] = {"env_vars": {"OMP_NUM_THREADS": "1", "RAY_AUTH_MODE": "disabled"}}
    ray.init(**kwargs)


# --------------------------------------------------------------------------------------------
# One trial (runs in a Ray worker)
# --------------------------------------------------------------------------------------------
def run_trial(payload: dict[str, Any]) -> dict[str, Any]:
    """Train one trial with MLflow logging and Optuna pruning; never raises (the outcome says)."""
    import optuna

    t0 = time.perf_counter()
    sc = SweepConfig.model_validate(payload["sweep"])
    number, params = payload["number"], payload["params"]
    out: dict[str, Any] = {"number": number, "state": "FAIL", "value": None, "error": None, "run_id": None}
    metric = sc.study.metric
    try:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = optuna.load_study(study_name=sc.study.name, storage=payload["storage"], pruner=make_pruner(sc.study))
        trial = optuna.trial.Trial(study, payload["trial_id"])
    except Exception as e:  # storage unreachable from the worker
        out["error"] = f"{type(e).__name__}: {e}"
        out["traceback"] = traceback.format_exc()
        return out

    def prune_cb(step: int, metrics: dict[str, float]) -> None:
        if metric in metrics:
            trial.report(float(metrics[metric]), step)
            if trial.should_prune():
                raise optuna.TrialPruned(f"pruned at step {step}: {metric}={metrics[metric]:.4f}")

    def on_start(run_id: str) -> None:
        out["run_id"] = run_id
        trial.set_user_attr("mlflow_run_id", run_id)

    from exgrpo.tracking import Tracker, run_tags, tracked_train

    tags = {"trial_number": number, "kind": "trial"}
    try:
        cfg = trial_config(sc, params, number)
        run = tracked_train(cfg, tracking_uri=payload["tracking_uri"], experiment=payload["experiment"],
                            run_name=f"trial-{number:04d}", parent_run_id=payload["parent_run_id"],
                            arm=f"trial-{number:04d}", study=sc.study.name, tags=tags, extra_params=list(sc.space),
                            callbacks=[prune_cb], check=False, on_start=on_start)
        value = float(run.result.final_metrics[metric])
        if not math.isfinite(value):
            raise ValueError(f"{metric} is {value}")
        out.update(state="COMPLETE", value=value)
    except optuna.TrialPruned as e:
        out.update(state="PRUNED", error=str(e))
    except Exception as e:
        out.update(state="FAIL", error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc())
        if out["run_id"] is None:  # failed before training (e.g. an invalid combination): still one run
            try:
                tr = Tracker(payload["tracking_uri"], check=False)
                base = base_config(sc)
                rid = tr.start_run(payload["experiment"], f"trial-{number:04d}",
                                   run_tags(base, f"trial-{number:04d}", sc.study.name, tags),
                                   payload["parent_run_id"])
                tr.log_params(rid, {k: v for k, v in params.items()})
                tr.client.set_tag(rid, "error", out["error"][:5000])
                tr.end_run(rid, "FAILED")
                out["run_id"] = rid
            except Exception:
                pass
    out["seconds"] = time.perf_counter() - t0
    return out


# --------------------------------------------------------------------------------------------
# The study loop (driver)
# --------------------------------------------------------------------------------------------
@dataclass
class SweepResult:
    study_name: str
    storage: str
    parent_run_id: str
    experiment_id: str
    tracking_uri: str
    outcomes: list[dict[str, Any]] = field(default_factory=list)
    """Outcomes of the trials run by this call, in finishing order."""
    best_value: float | None = None
    best_params: dict[str, Any] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    """Trial states over the whole study."""

    def table(self) -> str:
        """Markdown table of this call's trials."""
        keys = sorted({k for o in self.outcomes for k in o.get("params", {})})
        lines = ["| trial | state | value | " + " | ".join(keys) + " | error |",
                 "|---|---|---|" + "---|" * len(keys) + "---|"]
        for o in sorted(self.outcomes, key=lambda o: o["number"]):
            v = "" if o.get("value") is None else f"{o['value']:.4f}"
            ps = " | ".join(_fmt(o.get("params", {}).get(k)) for k in keys)
            err = " ".join((o.get("error") or "").split())[:160] if o["state"] == "FAIL" else ""
            lines.append(f"| {o['number']} | {o['state']} | {v} | {ps} | {err} |")
        return "\n".join(lines)


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def run_sweep(
    sc: SweepConfig,
    *,
    storage: str | None = None,
    tracking_uri: str | None = None,
    ray_address: str | None = None,
    n_trials: int | None = None,
    on_trial: Any = None,
) -> SweepResult:
    """Run (or resume) the study until it has ``n_trials`` (default ``study.n_trials``) finished trials."""
    import optuna
    import ray
    from optuna.trial import TrialState

    from exgrpo.tracking import Tracker

    tracker = Tracker(tracking_uri)  # unreachable store: an error here, before any trial
    base = base_config(sc)
    experiment = sc.mlflow_experiment or base.name
    exp_id = tracker.experiment_id(experiment)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study, url, _ = open_study(sc, storage)

    # the parent run of the study (reused on resume)
    parent = study.user_attrs.get("mlflow_parent_run_id")
    if parent is not None:
        try:
            tracker.client.get_run(parent)
            tracker.client.update_run(parent, status="RUNNING")
        except Exception:
            parent = None
    if parent is None:
        parent = tracker.start_run(experiment, f"study-{sc.study.name}", {
            "kind": "sweep", "study": sc.study.name, "tier": str(base.tier.value),
            "budget_steps": str(sc.budget_steps), "sampler": sc.study.sampler, "pruner": sc.study.pruner,
        })
        tracker.log_params(parent, {"study.name": sc.study.name, "study.direction": sc.study.direction,
                                    "study.metric": sc.study.metric, "study.sampler": sc.study.sampler,
                                    "study.pruner": sc.study.pruner, "budget_steps": sc.budget_steps,
                                    "optuna.storage": url})
        tracker.client.log_dict(parent, json.loads(space_signature(sc)), "sweep/space.json")
        study.set_user_attr("mlflow_parent_run_id", parent)

    # trials left RUNNING by a killed driver are failed (one driver per study)
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        optuna.trial.Trial(study, t._trial_id).set_user_attr("error", "interrupted: the sweep process ended first")
        safe_tell(study, t.number, state=TrialState.FAIL)

    finished = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
    target = n_trials or sc.study.n_trials
    if sc.study.sampler == "grid":
        target = min(target, math.prod(len(v.grid()) for v in sc.space.values()))
    todo = max(0, target - len(study.get_trials(deepcopy=False, states=finished)))
    result = SweepResult(sc.study.name, url, parent, exp_id, tracker.uri)
    dists = {k: v.distribution() for k, v in sc.space.items()}
    if todo:
        ensure_ray(ray_address)
        remote = ray.remote(num_cpus=1, max_retries=0)(run_trial)
        sweep_json = sc.model_dump(mode="json")
        if isinstance(sc.base, str):
            sweep_json["base"] = str(Path(sc.base).resolve())
        inflight: dict[Any, Any] = {}
        launched = 0
        while launched < todo or inflight:
            while launched < todo and len(inflight) < sc.study.parallel:
                trial = study.ask(dists)
                payload = {"sweep": sweep_json, "number": trial.number, "trial_id": trial._trial_id,
                           "params": dict(trial.params), "storage": url, "tracking_uri": tracker.uri,
                           "experiment": experiment, "parent_run_id": parent}
                inflight[remote.remote(payload)] = trial
                launched += 1
            done, _ = ray.wait(list(inflight), num_returns=1)
            for ref in done:
                trial = inflight.pop(ref)
                try:
                    out = ray.get(ref)
                except Exception as e:  # the worker died (OOM, killed): still a FAIL, the study goes on
                    out = {"number": trial.number, "state": "FAIL", "value": None, "run_id": None,
                           "error": f"{type(e).__name__}: {e}"}
                out["params"] = dict(trial.params)
                _tell(study, trial, out)
                result.outcomes.append(out)
                if on_trial is not None:
                    on_trial(out)

    # summary on the parent run
    trials = study.get_trials(deepcopy=False)
    result.counts = {s.name: sum(t.state == s for t in trials) for s in (TrialState.COMPLETE, TrialState.PRUNED,
                                                                       TrialState.FAIL)}
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    metrics: dict[str, float] = {f"trials_{k.lower()}": float(v) for k, v in result.counts.items()}
    if complete:
        best = study.best_trial
        result.best_value, result.best_params = best.value, dict(best.params)
        metrics["best_value"] = float(best.value)
        metrics["best_trial"] = float(best.number)
        for k, v in best.params.items():
            tracker.client.set_tag(parent, f"best/{k}", str(v))
    tracker.log_metrics(parent, metrics, step=len(trials))
    try:
        df = study.trials_dataframe(attrs=("number", "value", "state", "params", "user_attrs", "duration"))
        tracker.client.log_text(parent, df.to_csv(index=False), "sweep/trials.csv")
    except Exception:
        pass
    tracker.end_run(parent, "FINISHED")
    return result


def safe_tell(study, trial, *args, **kwargs) -> None:
    """``study.tell`` outside ``optimize``: GridSampler calls ``study.stop()`` once the grid is
    exhausted, which raises there; the trial's state is stored before that (Optuna stores it in a
    ``finally``), and the driver stops on its own count."""
    try:
        study.tell(trial, *args, **kwargs)
    except RuntimeError as e:
        if "Study.stop" not in str(e):
            raise


def _tell(study, trial, out: dict[str, Any]) -> None:
    from optuna.trial import TrialState

    if out.get("run_id"):
        trial.set_user_attr("mlflow_run_id", out["run_id"])
    if out["state"] == "COMPLETE":
        safe_tell(study, trial, out["value"])
        return
    if out["state"] == "PRUNED":
        safe_tell(study, trial, state=TrialState.PRUNED)
        return
    trial.set_user_attr("error", (out.get("error") or "unknown error")[:2000])
    if out.get("traceback"):
        trial.set_user_attr("traceback", out["traceback"][-4000:])
    safe_tell(study, trial, state=TrialState.FAIL)

