"""The Optuna study: sampler, pruner, the paper defaults as trial 0, create-or-resume with a space check."""

from __future__ import annotations

import json
import warnings
from typing import Any

from exgrpo.config import ExperimentConfig, flatten
from exgrpo.errors import one_line, redact_uri
from exgrpo.sqlite_wal import ensure_wal, sqlite_file
from exgrpo.sweep.space import StudySpec, SweepConfig, SweepError, base_config, resolve_storage, space_signature


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
    if study.pruner == "wilcoxon":
        with warnings.catch_warnings():  # "experimental" since Optuna 3.6; the interface used here is stable
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.pruners.WilcoxonPruner(p_threshold=study.pruner_p_threshold,
                                                 n_startup_steps=study.pruner_warmup_steps)
    return optuna.pruners.NopPruner()


def paper_defaults(sc: SweepConfig) -> dict[str, Any]:
    """Schema defaults (the reference run) of the space's fields, where they lie in the space."""
    defaults = flatten(ExperimentConfig())
    base = base_config(sc)
    # fields whose default None stands for a value derived from K
    meaning_of_none = {
        "algorithm.bucket_rbound": lambda: base.algorithm.rbound,  # K-1
        "algorithm.bucket_center": lambda: base.algorithm.group_size / 2,
    }
    out = {}
    for name, spec in sc.space.items():
        v = defaults.get(name)
        if v is None and name in meaning_of_none and not spec.contains(None):
            v = meaning_of_none[name]()
        if spec.contains(v):
            out[name] = v
    return out


def open_study(sc: SweepConfig, storage: str | None = None):
    """Create the study, or load it (resume) after checking it was made with the same space."""
    import optuna

    url = resolve_storage(storage or sc.study.storage)
    ensure_wal(url)  # a sqlite file: trials writing at once and the dashboard reading do not lock each other out
    sig = space_signature(sc)
    names = _study_names(url) if _storage_exists(url) else []
    if sc.study.name in names:
        study = optuna.load_study(study_name=sc.study.name, storage=url, sampler=make_sampler(sc),
                                  pruner=make_pruner(sc.study))
        old = study.user_attrs.get("exgrpo_space")
        if old is not None and old != sig:
            diff = _space_diff(json.loads(old), json.loads(sig))
            raise SweepError(
                f"study {sc.study.name!r} in {redact_uri(url)} was created with a different search space "
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


def _study_names(url: str) -> list[str]:
    """The studies in storage ``url``; a database that cannot be reached is a one-line error, before any trial."""
    import optuna
    from sqlalchemy.exc import OperationalError

    try:
        return optuna.study.get_all_study_names(url)
    except OperationalError as e:
        raise SweepError(f"Optuna storage {redact_uri(url)} is not reachable ({one_line(e.orig or e, 200)}); "
                         "start its database, or pass --storage (or EXGRPO_OPTUNA_STORAGE) of one that is") from None


def _storage_exists(url: str) -> bool:
    db = sqlite_file(url)
    return db.is_file() if db is not None else True


def _space_diff(old: dict, new: dict) -> list[str]:
    out = [k for k in ("direction", "metric") if old.get(k) != new.get(k)]
    o, n = old.get("space", {}), new.get("space", {})
    out += [k for k in sorted(set(o) | set(n)) if o.get(k) != n.get(k)]
    return out or ["<unknown>"]
