"""Hyper-parameter sweeps: an Optuna study over any config field, trials as Ray tasks.

Orchestration-free (no Prefect import); ``flows/sweep.py`` and ``exgrpo sweep`` call :func:`run_sweep`.
``space`` (the sweep file and its validation), ``study`` (sampler, pruner, create-or-resume) and
``runner`` (ask-and-tell over Ray, pruning inside the trial, MLflow child runs).

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

from typing import TYPE_CHECKING

from exgrpo.sweep.space import (
    ParamSpec,
    StudySpec,
    SweepConfig,
    SweepError,
    base_config,
    config_fields,
    default_storage,
    load_sweep,
    resolve_storage,
    space_signature,
    trial_config,
    validate_space,
)
from exgrpo.sweep.study import make_pruner, make_sampler, open_study, paper_defaults

if TYPE_CHECKING:
    from exgrpo.sweep.runner import SweepResult, run_sweep, run_trial, safe_tell

_RUNNER = ("SweepResult", "run_sweep", "run_trial", "safe_tell")
"""Loaded on first use: the runner imports training (torch), which reading a sweep file, resolving its
storage or building the ``exgrpo`` parser does not need."""


def __getattr__(name: str):
    if name in _RUNNER:
        from exgrpo.sweep import runner

        return getattr(runner, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ParamSpec", "StudySpec", "SweepConfig", "SweepError", "SweepResult", "base_config", "config_fields",
    "default_storage", "load_sweep", "make_pruner", "make_sampler", "open_study", "paper_defaults",
    "resolve_storage", "run_sweep", "run_trial", "safe_tell", "space_signature", "trial_config",
    "validate_space",
]
