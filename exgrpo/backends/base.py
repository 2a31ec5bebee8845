"""The backend seam: what a training backend offers, and the registry that picks one by name.

A backend turns an :class:`~exgrpo.config.ExperimentConfig` into a finished run. It owns the
model, the rollouts and the optimiser; the algorithm (replay strategy, batch building, loss) comes
from :mod:`exgrpo.core`. ``native`` trains in-process on CPU; ``verl`` runs veRL's RayPPOTrainer.
It also says how to read the checkpoints it writes and how to build the policy they hold: evaluation
and recording read any registered backend's checkpoint through :func:`read_checkpoint`,
:func:`policy_file` and :func:`build_policy`, without naming one.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

if TYPE_CHECKING:
    from exgrpo.config import ExperimentConfig

StepCallback = Callable[[int, dict[str, float]], None]
"""(step, metrics) -> None; called after every step and every evaluation. A callback with an
``on_start(total_steps)`` method is told the run's planned step count first (e.g. a progress ETA);
one with ``on_evaluation(step, correct)`` gets each evaluation's held-out result per question
(a list of 0/1 in the fixed order of the task's validation ids; e.g. a paired pruning test)."""


@dataclass
class TrainResult:
    """What a finished run returns, whatever its backend."""

    final_metrics: dict[str, float]
    history: list[dict[str, float]] = field(default_factory=list)
    run_dir: Path | None = None
    checkpoint: Path | None = None
    task: Any = None
    """The task the run trained on (its train/val question ids and texts, for dataset records)."""
    policy: Any = None
    """The trained policy (for model records)."""


@dataclass
class HFCheckpoint:
    """A checkpoint of an HF model exgrpo does not rebuild as one of its policies (a veRL run of
    ``policy.path`` or ``backend.verl.model_path``): evaluated from an HF model directory with vLLM."""

    config: str
    """The config of the run that wrote it, as JSON."""
    step: int
    val_file: Path | None
    """The run's validation split (veRL's RLHFDataset layout), if it is at hand."""
    grade: Callable[[str, str, str], float]
    """(data_source, response text, ground truth) -> reward: the run's own grader."""
    export: Callable[[], Path]
    """Makes (once) and returns the HF model directory: the weights merged, with config and tokenizer."""


class MLflowRun(NamedTuple):
    """An MLflow run created by the caller, for a backend whose job reports to it by itself."""

    tracking_uri: str
    run_id: str


class Backend(Protocol):
    """Runs one experiment to completion (or resumes it) and returns its result."""

    name: str
    reports_to_mlflow: bool
    """True: given ``mlflow_run``, the training job logs each step to it live by itself (veRL, a
    job that may run on another machine), and ``callbacks`` see the steps only after the run. False:
    ``callbacks`` see each step as it ends, in the caller's process (native)."""

    def train(
        self,
        cfg: ExperimentConfig,
        callbacks: list[StepCallback] | None = None,
        resume: bool = False,
        progress: bool = True,
        force_resume: bool = False,
        mlflow_run: MLflowRun | None = None,
    ) -> TrainResult: ...

    def check_resumable(self, cfg: ExperimentConfig, force_resume: bool = False) -> None:
        """Raise, before anything is built or recorded, what :meth:`train` with ``resume`` would refuse
        (a checkpoint made with another config, ...): a run's record is opened only for a resume that
        goes on. Optional: a backend without it refuses when it trains."""

    def read_checkpoint(self, path: Path) -> dict[str, Any] | None:
        """The policy entries (``config``: the run's config as JSON, ``model``: the policy's state
        dict, ``step``) of ``path`` if it is a checkpoint this backend writes, else None. Loads weights
        only: never code."""

    def policy_file(self, checkpoint: Path) -> Path | None:
        """``checkpoint``'s policy as one file holding those entries (made once beside it if the
        checkpoint is not one already), if it is a checkpoint this backend writes; else None."""

    def build_policy(self, cfg: ExperimentConfig) -> tuple[Any, Any]:
        """``(task, policy)`` of a run of ``cfg``: a checkpoint's ``model`` entries load into the policy."""


BACKENDS: dict[str, str] = {
    "native": "exgrpo.backends.native.trainer:NATIVE",
    "verl": "exgrpo.backends.verl.runner:VERL",
}
"""Backend name -> "module:attribute" (imported on first use: veRL is heavy)."""


def get_backend(name: str) -> Backend:
    """The registered backend called ``name``; a clear error lists the others."""
    try:
        target = BACKENDS[name]
    except KeyError:
        raise ValueError(f"backend.name={name!r} is not a backend; choose one of {sorted(BACKENDS)}") from None
    module, attr = target.split(":")
    return getattr(importlib.import_module(module), attr)


def train(cfg: ExperimentConfig, callbacks: list[StepCallback] | None = None, resume: bool = False,
          progress: bool = True, force_resume: bool = False, mlflow_run: MLflowRun | None = None) -> TrainResult:
    """Train ``cfg`` on the backend its ``backend.name`` selects: the one entry point of the CLI and flows.
    ``resume`` continues the run from its own latest checkpoint (refused if the config differs in a
    field that changes its meaning, unless ``force_resume``); without a checkpoint it says so and trains
    from step 1. A fresh run moves an earlier one aside."""
    from exgrpo.runs import prepare_run_dir

    resume = prepare_run_dir(cfg, resume)  # the backends never move a run aside themselves
    return get_backend(cfg.backend.name).train(cfg, callbacks=callbacks, resume=resume, progress=progress,
                                               force_resume=force_resume, mlflow_run=mlflow_run)


def check_resumable(cfg: ExperimentConfig, force_resume: bool = False) -> None:
    """What a resume of ``cfg`` would be refused with, raised now (:meth:`Backend.check_resumable`; a backend
    without that method refuses when it trains)."""
    check = getattr(get_backend(cfg.backend.name), "check_resumable", None)
    if check is not None:
        check(cfg, force_resume=force_resume)


def read_checkpoint(path: Path) -> dict[str, Any] | None:
    """The policy entries of checkpoint ``path``, read by the registered backend that writes such
    checkpoints (:meth:`Backend.read_checkpoint`); None if none does."""
    return next((state for name in BACKENDS if (state := get_backend(name).read_checkpoint(path)) is not None), None)


def policy_file(checkpoint: Path) -> Path | None:
    """``checkpoint``'s policy as one file (:meth:`Backend.policy_file`); None if no backend writes such checkpoints."""
    return next((file for name in BACKENDS if (file := get_backend(name).policy_file(checkpoint)) is not None), None)


def hf_checkpoint(path: Path) -> HFCheckpoint | None:
    """``path`` as a checkpoint of an external HF model (``Backend.hf_checkpoint``, for the backends that
    train such models), None if it is not one. Nothing is merged until ``export()`` is called."""
    for name in BACKENDS:
        read = getattr(get_backend(name), "hf_checkpoint", None)
        if read is not None and (found := read(Path(path))) is not None:
            return found
    return None


def build_policy(cfg: ExperimentConfig) -> tuple[Any, Any]:
    """``(task, policy)`` of a run of ``cfg``, as its backend builds them (:meth:`Backend.build_policy`)."""
    return get_backend(cfg.backend.name).build_policy(cfg)


def register_backend(name: str, target: str) -> Callable[[], None]:
    """Add a backend ("module:attribute"); returns a function that removes it again."""
    BACKENDS[name] = target
    return lambda: BACKENDS.pop(name, None)
