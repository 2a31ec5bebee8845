"""Running one tracked run: a backend trains the config, MLflow records it, its checkpoint is evaluated.

The one place that starts training and records it: ``exgrpo train``, the train flow, a comparison's
and a sweep's runs all call :func:`tracked_train` (on a Ray cluster: :func:`train_on_cluster`). The
backend comes from the registry (:func:`exgrpo.backends.base.get_backend`); recording is
:mod:`exgrpo.tracking`'s, evaluating the final checkpoint :mod:`exgrpo.evaluation`'s.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exgrpo.backends.base import MLflowRun, TrainResult, check_resumable, get_backend, train
from exgrpo.cluster import (
    check_cluster,
    cluster_address,
    describe,
    ensure_ray,
    on_cluster,
    probe,
    task_cpus,
)
from exgrpo.config import ConfigError, ExperimentConfig
from exgrpo.config.fields import at_default
from exgrpo.errors import UserError, redact_uri
from exgrpo.policies.build import prepare_warm_starts
from exgrpo.policies.inputs import check_inputs
from exgrpo.evaluation.metrics import Score
from exgrpo.evaluation.runner import CheckpointPolicy, load_checkpoint_policy, score_checkpoint
from exgrpo.tracking.code_version import code_version_tags
from exgrpo.tracking.finished_run import log_finished_run
from exgrpo.tracking.mlflow_tracking import (
    TrackedRun,
    Tracker,
    algo_tag,
    backfill_steps,
    check_reachable,
    is_reachable,
    curated_params,
    param_values,
    resolve_tracking_uri,
    run_tags,
)
from exgrpo.runs import prepare_run_dir
from exgrpo.tracking.run_record import continuable, end_if_orphaned, finished_before, write_record
from exgrpo.tracking.step_logger import MLflowStepLogger
from exgrpo.tracking.sync import sync_run, write_pending


def _final_metrics(result: Any) -> dict[str, float]:
    """``final/*``: a finished run's last validation and batch metrics (finite ones)."""
    return {f"final/{k}": v for k, v in result.final_metrics.items()
            if k.startswith(("val/", "batch/solved")) and isinstance(v, float) and math.isfinite(v)}


def record_finished(tracker: Tracker, run_id: str, cfg: ExperimentConfig, result: Any, step: int, *,
                    log_checkpoint: bool = True, log_model: bool = True) -> None:
    """What every finished run records at its end (:func:`exgrpo.tracking.finished_run.log_finished_run`
    with this module's evaluation): the checkpoint artifact, ``eval/*``, the model. A run recorded as it
    trained calls it at once; a run whose end MLflow missed, when ``exgrpo sync`` delivers it
    (:func:`sync_pending`)."""
    log_finished_run(tracker, run_id, cfg, result, step, load_policy=load_checkpoint_policy, evaluate=_final_evaluation,
                     log_checkpoint=log_checkpoint, log_model=log_model)


def finish_record(cfg: ExperimentConfig, result: Any, *, log_checkpoint: bool = True,
                  log_model: bool = True) -> dict[str, Any]:
    """The marker's ``finish`` of a finished run (:func:`exgrpo.tracking.sync.write_pending`): what
    :func:`record_finished` needs later. The checkpoint is kept relative to the run directory, so a
    run directory moved before ``exgrpo sync`` still finds it."""
    checkpoint = Path(result.checkpoint) if result.checkpoint is not None else None
    if checkpoint is not None and result.run_dir is not None and checkpoint.is_relative_to(Path(result.run_dir)):
        checkpoint = checkpoint.relative_to(Path(result.run_dir))
    return {"config": cfg.model_dump(mode="json"), "checkpoint": str(checkpoint) if checkpoint else None,
            "step": int(result.final_metrics.get("step", 0)), "log_checkpoint": log_checkpoint, "log_model": log_model}


def _finish_synced(tracker: Tracker, run_id: str, run_dir: Path, finish: dict[str, Any]) -> None:
    """:func:`record_finished` of a run that ``exgrpo sync`` delivers, from its marker's ``finish``."""
    cfg = ExperimentConfig.model_validate(finish["config"])
    checkpoint = Path(run_dir) / finish["checkpoint"] if finish.get("checkpoint") else None
    result = TrainResult({"step": float(finish["step"])}, run_dir=Path(run_dir), checkpoint=checkpoint)
    record_finished(tracker, run_id, cfg, result, int(finish["step"]), log_checkpoint=finish.get("log_checkpoint", True),
                    log_model=finish.get("log_model", True))


def sync_pending(run_dir: str | Path) -> Any:
    """``exgrpo sync`` of one run directory: :func:`exgrpo.tracking.sync.sync_run`, a finished training
    run's end recorded as any run's (:func:`record_finished`)."""
    return sync_run(run_dir, finish=_finish_synced)


def _train_unrecorded(cfg: ExperimentConfig, uri: str, creation: dict[str, Any], callbacks: list[Any], *,
                      resume: bool, force_resume: bool, progress: bool, log_checkpoint: bool = True,
                      log_model: bool = True) -> TrackedRun:
    """Train while the store cannot take a new run. ``metrics.jsonl`` holds every step; the marker
    :func:`exgrpo.tracking.sync.write_pending` leaves carries what creates the run later (experiment,
    name, parent, tags, params, config). If the store is back at the end the run is delivered now,
    else by ``exgrpo sync``. A failed run is marked FAILED the same way, and the error re-raised."""
    print(f"note: MLflow ({redact_uri(uri)}) cannot take run {creation['run_name']} now; it trains anyway and its "
          "record waits on disk for the store", flush=True)
    def deliver(run_dir: Path, status: str, **record: Any) -> Any:
        """Leave the marker, then deliver it now if the store is back (its ``Synced``), else say how."""
        write_pending(run_dir, uri, None, status, create=creation, **record)
        try:
            return sync_pending(run_dir)
        except Exception:  # noqa: BLE001 - still down
            print(f"note: run {creation['run_name']} ended {status} while MLflow is unreachable; it is on disk, "
                  f"record it with `exgrpo sync {run_dir}`", flush=True)
            return None

    try:
        result = train(cfg, callbacks=callbacks, resume=resume, force_resume=force_resume, progress=progress)
    except BaseException as e:
        if cfg.run_dir().is_dir():
            deliver(cfg.run_dir(), _status_for(e), error=f"{type(e).__name__}: {e}")
        raise
    synced = deliver(Path(result.run_dir), "FINISHED", final_metrics=_final_metrics(result),
                     finish=finish_record(cfg, result, log_checkpoint=log_checkpoint, log_model=log_model))
    if synced is None:
        return TrackedRun(result, "", "", uri, synced=False)
    return TrackedRun(result, synced.run_id, synced.experiment_id, uri)


def _final_evaluation(final: CheckpointPolicy | Path) -> list[Score]:
    """``eval/*``: the final policy (or an external HF model's merged directory) scored as the run evaluates
    (:func:`exgrpo.evaluation.runner.score_checkpoint`, as ``exgrpo eval`` and the evaluate flow score it)."""
    return score_checkpoint(final).scores


def _pruned(exc: BaseException) -> bool:
    return type(exc).__name__ == "TrialPruned"  # by name: optuna is not imported where no sweep runs


def _status_for(exc: BaseException) -> str:
    """KILLED for a pruned trial and for a stopped command (Ctrl-C, or SIGTERM as the CLI raises it: a
    KeyboardInterrupt of its own class), FAILED for anything else."""
    return "KILLED" if _pruned(exc) or isinstance(exc, KeyboardInterrupt) else "FAILED"


def _log_steps_before_resume(logger: MLflowStepLogger, history: list[dict[str, float]], seen: set[int],
                             arrived: set[int] = frozenset()) -> None:
    """A resumed run's MLflow run gets the steps trained before the resume that it lacks (from
    metrics.jsonl, as ``history`` holds them; ``arrived``: the steps it has), so it shows the whole
    run."""
    for row in history:
        if int(row["step"]) not in seen and int(row["step"]) not in arrived:
            logger(int(row["step"]), row)


@dataclass
class _Record:
    """The MLflow run a tracked run writes into, filled in as :func:`_open_record` gets it: ``resume``
    is the launcher's decision once taken (the caller's request until then)."""

    resume: bool
    exp_id: str = ""
    run_id: str = ""
    continued: str | None = None
    """The run continued (a resumed run whose record is still good), else None."""
    reopened: bool = False
    """``continued`` had finished before (a run resumed past its end)."""


def _open_record(rec: _Record, cfg: ExperimentConfig, tracker: Tracker, exp_name: str, run_name: str,
                 tags: dict[str, str], parent_run_id: str | None, extra_params: Iterable[str],
                 force_resume: bool = False) -> None:
    """Start or continue the run's record, in this order: the experiment, the orphan a killed run left
    RUNNING ended, the run directory decided (resume, or an earlier run moved aside) before this run's
    record goes in, a resume the backend would refuse refused (no run is opened for it, and the directory
    keeps naming its own), the run continued or started, its id written beside the run."""
    run_dir = cfg.run_dir()
    rec.exp_id = tracker.experiment_id(exp_name)
    if (killed := end_if_orphaned(run_dir, tracker.client)) is not None:
        print(f"note: {killed}", flush=True)
    rec.resume = prepare_run_dir(cfg, rec.resume)
    if rec.resume:
        check_resumable(cfg, force_resume)
        params = curated_params(cfg, extra_params)
        rec.continued = continuable(run_dir, tracker.client, tracker.uri, param_values(params),
                                    at_default={k for k in params if at_default(cfg, k)})
        rec.reopened = rec.continued is not None and finished_before(tracker.client, rec.continued)
    if rec.continued is not None:
        rec.run_id = tracker.continue_run(rec.continued, tags, parent_run_id)
    else:
        rec.run_id = tracker.start_run(exp_name, run_name, tags, parent_run_id)
    write_record(run_dir, tracker.uri, rec.run_id)


def _system_metrics_monitor(run_id: str, uri: str) -> Any:
    """MLflow's sampler of CPU and memory (``system/*``) into the run, started."""
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    monitor = SystemMetricsMonitor(run_id, sampling_interval=2, tracking_uri=uri)
    monitor.start()
    return monitor


def _train_logged(cfg: ExperimentConfig, tracker: Tracker, rec: _Record, callbacks: list[Any], *,
                  force_resume: bool, progress: bool) -> tuple[Any, set[int], bool]:
    """Train with every step in the run: logged from here, or by the job itself (a backend that reports
    to MLflow), those that did not arrive logged after, loudly; a resumed run also gets the steps
    trained before the resume that it lacks. Returns the backend's result, the steps trained in this
    call, and whether the logged steps reached the store."""
    client, run_id, resume = tracker.client, rec.run_id, rec.resume
    logger = MLflowStepLogger(client, run_id, every=cfg.train.log_every_steps)
    live = get_backend(cfg.backend.name).reports_to_mlflow  # the job logs its steps by itself
    seen: set[int] = set()  # steps trained in this call (a resumed run's earlier steps are not)

    def saw(step: int, _row: dict[str, float]) -> None:
        seen.add(int(step))

    try:
        result = train(cfg, callbacks=[*callbacks, saw] if live else [logger, saw, *callbacks], resume=resume,
                       force_resume=force_resume, progress=progress, mlflow_run=MLflowRun(tracker.uri, run_id) if live else None)
        if live:  # the job logged its steps; those that did not arrive are logged now, loudly
            trained = [r for r in result.history if not resume or int(r["step"]) in seen]
            backfill_steps(client, run_id, trained, logger)
        if resume:
            arrived = {m.step for m in client.get_metric_history(run_id, "batch/solved")} if rec.continued else set()
            _log_steps_before_resume(logger, result.history, seen, arrived)
    finally:
        delivered = logger.flush(force=True)
    return result, seen, delivered


def _end_failed(tracker: Tracker, cfg: ExperimentConfig, run_id: str, e: BaseException, monitor: Any) -> None:
    """End the run of a training that raised ``e``: KILLED (pruned, tag ``pruned=true``; or stopped) or
    FAILED (tag ``error``); when the store is down too, a marker beside the run lets ``exgrpo sync`` end it."""
    status = _status_for(e)
    try:
        if _pruned(e):
            tracker.client.set_tag(run_id, "pruned", "true")
        elif status == "FAILED":
            tracker.client.set_tag(run_id, "error", f"{type(e).__name__}: {e}"[:5000])
        tracker.end_run(run_id, status)
    except Exception:  # noqa: BLE001 - the store is down too: the run is ended by `exgrpo sync`
        run_dir = cfg.run_dir()
        if run_dir.is_dir():
            write_pending(run_dir, tracker.uri, run_id, status, error=f"{type(e).__name__}: {e}")
    finally:
        if monitor is not None:
            monitor.finish()


def _end_finished(tracker: Tracker, run: TrackedRun, monitor: Any) -> TrackedRun:
    if monitor is not None:
        monitor.finish()
    tracker.end_run(run.run_id, "FINISHED")
    return run


def tracked_train(
    cfg: ExperimentConfig,
    *,
    tracking_uri: str | None = None,
    experiment: str | None = None,
    run_name: str | None = None,
    parent_run_id: str | None = None,
    arm: str | None = None,
    study: str | None = None,
    tags: Mapping[str, Any] | None = None,
    extra_params: Iterable[str] = (),
    callbacks: Iterable[Callable[[int, dict[str, float]], None]] = (),
    system_metrics: bool | None = None,
    log_checkpoint: bool = True,
    log_model: bool = True,
    resume: bool = False,
    force_resume: bool = False,
    progress: bool = False,
    check: bool = True,
    on_start: Callable[[str], None] | None = None,
    defer_if_unreachable: bool = False,
) -> TrackedRun:
    """Train ``cfg`` into one MLflow run of experiment ``experiment`` (default ``cfg.name``):
    tags, curated params, the resolved config, per-step metrics, the final checkpoint.

    The run ends FINISHED, FAILED (tag ``error``) or KILLED (pruned, tag ``pruned=true``; or stopped); the
    exception is re-raised. ``on_start(run_id)`` is called once the run exists. System metrics
    (CPU, memory; ``system/*``) are sampled when ``system_metrics`` is true, or when it is None and
    ``MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING=true``. ``defer_if_unreachable`` (a comparison's runs): when
    the store cannot take a new run, train anyway and leave the whole record to ``exgrpo sync``
    (:func:`_train_unrecorded`)."""
    tracker = Tracker(tracking_uri, check=check)
    exp_name = experiment or cfg.name
    run_name = run_name or f"{arm or algo_tag(cfg)}-seed{cfg.seed}"
    tags = run_tags(cfg, arm, study, tags)
    rec = _Record(resume)
    try:
        _open_record(rec, cfg, tracker, exp_name, run_name, tags, parent_run_id, extra_params, force_resume)
    except Exception as e:
        if isinstance(e, UserError) or not defer_if_unreachable or is_reachable(tracker.uri):
            raise  # a refused resume is refused whether or not the store answers
        creation = {"experiment": exp_name, "run_name": run_name, "parent_run_id": parent_run_id,
                    "tags": {**code_version_tags(), **tags},
                    "params": curated_params(cfg, extra_params), "config": cfg.model_dump(mode="json")}
        return _train_unrecorded(cfg, tracker.uri, creation, list(callbacks), resume=rec.resume,
                                 force_resume=force_resume, progress=progress, log_checkpoint=log_checkpoint,
                                 log_model=log_model)
    run_id, monitor = rec.run_id, None
    if system_metrics is None:
        system_metrics = os.environ.get("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING", "").lower() in ("true", "1")
    try:
        if on_start is not None:
            on_start(run_id)
        tracker.log_identity(run_id, curated_params(cfg, extra_params), cfg.model_dump(mode="json"))
        if system_metrics:
            monitor = _system_metrics_monitor(run_id, tracker.uri)
        result, seen, delivered = _train_logged(cfg, tracker, rec, list(callbacks), force_resume=force_resume,
                                                progress=progress)
        run = TrackedRun(result, run_id, rec.exp_id, tracker.uri)
        if rec.reopened and not seen:  # a finished run reused as it is: its record is whole already
            return _end_finished(tracker, run, monitor)
        final = _final_metrics(result)
        if not delivered and result.run_dir:  # the server is down at the end: leave it to `exgrpo sync`
            marker = write_pending(result.run_dir, tracker.uri, run_id, "FINISHED", final, finish=finish_record(
                cfg, result, log_checkpoint=log_checkpoint, log_model=log_model))
            print(f"note: MLflow is unreachable; run {run_id} is complete on disk, finish it in MLflow with "
                  f"`exgrpo sync {marker.parent}`", flush=True)
            if monitor is not None:
                monitor.finish()
            return TrackedRun(result, run_id, rec.exp_id, tracker.uri, synced=False)
        step = int(result.final_metrics.get("step", 0))
        tracker.log_metrics(run_id, final, step=step)
        record_finished(tracker, run_id, cfg, result, step, log_checkpoint=log_checkpoint, log_model=log_model)
    except BaseException as e:
        _end_failed(tracker, cfg, run_id, e, monitor)
        raise
    return _end_finished(tracker, run, monitor)


def launch_run(cfg: ExperimentConfig, *, tracking_uri: str | None = None, ray_address: str | None = None,
               resume: bool = False, force_resume: bool = False, tracked: bool = True, progress: bool = False,
               tags: Mapping[str, Any] | None = None,
               on_start: Callable[[str], None] | None = None) -> TrackedRun | TrainResult:
    """One run of ``cfg``, as ``exgrpo train`` and the train flow start it, checked in this order before
    any of its record exists: the local files it reads (a model directory, a question file: every
    row), the cluster (``ray_address``, else ``RAY_ADDRESS``; stores every node reaches, a cluster that
    answers), the MLflow store (one that takes runs, reachable), a veRL job's interpreter, its model's
    context and its own cluster, the tiny LM's warm start on this machine (said in a line, trained now if
    not cached). Then trained: on the cluster as a Ray task, or here; recorded in MLflow (a
    :class:`TrackedRun`; ``on_start(run_id)`` once its MLflow run exists), or with ``tracked=False`` not
    (the backend's ``TrainResult``)."""
    address = cluster_address(ray_address)
    if address is not None and not tracked:
        raise ConfigError("--no-tracking with --ray-address: a run on a cluster is recorded in MLflow; "
                          "drop --no-tracking and pass --tracking-uri of a server every node reaches")
    if address is None:  # on a cluster the node that runs it reads the files, and checks them as it builds the run
        check_inputs(cfg)
    cfg = on_cluster(cfg, address)
    check_cluster(address, tracking_uri)
    if tracked:
        check_reachable(resolve_tracking_uri(tracking_uri))
    if cfg.backend.name == "verl":  # the job's interpreter and model, before the run's record or assets exist
        from exgrpo.backends.verl.assets import check_model_context
        from exgrpo.backends.verl.runner import job_python

        job_python(cfg.backend.verl)
        check_model_context(cfg)
        if address is None and cfg.backend.verl.ray_address is not None:
            probe(cfg.backend.verl.ray_address)  # the config's own cluster: before the run's assets are built
    if address is None:  # on a cluster, the node that runs it loads or trains its own
        prepare_warm_starts([cfg], progress=progress)
    resume = resume or force_resume
    if not tracked:
        return train(cfg, resume=resume, progress=progress, force_resume=force_resume)
    if address is not None and cfg.backend.name == "native":  # the run itself goes to the cluster
        return train_on_cluster(cfg, address, tracking_uri=tracking_uri, resume=resume, force_resume=force_resume,
                                tags=tags, on_start=on_start)
    return tracked_train(cfg, tracking_uri=tracking_uri, resume=resume, force_resume=force_resume, progress=progress,
                         tags=tags, on_start=on_start)


def train_on_cluster(cfg: Any, address: str, **tracked: Any) -> Any:
    """One tracked native run (:func:`tracked_train`) as a Ray task on the cluster; its
    run directory is ``output_dir`` made absolute (a path every node shares)."""
    import ray

    ensure_ray(address)
    print(f"running on {describe(address)}", flush=True)
    cfg = cfg.model_copy(update={"output_dir": Path(cfg.output_dir).resolve()})
    task = ray.remote(max_retries=0)(tracked_train).options(num_cpus=task_cpus(cfg))
    try:
        return ray.get(task.remote(cfg, progress=False, **tracked))
    except ray.exceptions.RayTaskError as e:
        raise e.as_instanceof_cause() from None
