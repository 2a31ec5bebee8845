"""Running a study: trials as Ray tasks (ask-and-tell), pruning inside the task, MLflow child runs."""

from __future__ import annotations

import contextlib
import functools
import json
import math
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Iterator
from typing import Any

from exgrpo.batch import ParentSummary, finish_parent, start_on_ray
from exgrpo.cluster import cluster_address, require_shared_stores, task_cpus
from exgrpo.disk import while_room
from exgrpo.errors import one_line, redact_uri
from exgrpo.slots import launch_slots, run_as_slots_free
from exgrpo.sweep.space import SweepConfig, base_config, resolve_storage, space_signature, trial_config
from exgrpo.sweep.study import make_pruner, open_study
from exgrpo.live_progress import ProgressReporter, progress_display
from exgrpo.tracking import Tracker, run_tags
from exgrpo.tracking.registry import CHAMPION, register_champion


# --------------------------------------------------------------------------------------------
# One trial (runs in a Ray worker)
# --------------------------------------------------------------------------------------------
INSTANCE_STRIDE = 1_000_000
"""Instance steps per training step in the wilcoxon pruner's reports (more than any validation set)."""


@functools.lru_cache(maxsize=4)
def worker_storage(url: str) -> Any:
    """The study's Optuna storage in this process, built once: Ray runs many trials in one worker.
    The driver has created the tables and checked their schema (:func:`open_study`), so the worker
    skips both (Optuna's check loads alembic's revision scripts, ~30 ms a trial); ``pool_pre_ping``
    replaces a pooled connection that a restarted database dropped."""
    import optuna

    return optuna.storages.RDBStorage(url, engine_kwargs={"pool_pre_ping": True}, skip_compatibility_check=True,
                                      skip_table_creation=True)


def _load_trial(payload: dict[str, Any], sc: SweepConfig) -> Any:
    """The trial the driver asked for, in this worker's connection to the study's storage."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=sc.study.name, storage=worker_storage(payload["storage"]),
                              pruner=make_pruner(sc.study))
    return optuna.trial.Trial(study, payload["trial_id"])


def _pruning(trial: Any, sc: SweepConfig) -> Any:
    """The step callback that reports to the trial and prunes it: the study's metric at each
    evaluation, or (the wilcoxon pruner) each evaluation's held-out result per question."""
    import optuna

    metric = sc.study.metric

    def prune_cb(step: int, metrics: dict[str, float]) -> None:
        if metric in metrics:
            trial.report(float(metrics[metric]), step)
            if trial.should_prune():
                raise optuna.TrialPruned(f"pruned at step {step}: {metric}={metrics[metric]:.4f}")

    class PerQuestion:
        """The wilcoxon pruner's reports: each evaluation's held-out result per question, at
        instance step ``train step * INSTANCE_STRIDE + question position`` (the same instances in every
        trial of the study: same task, same evaluation schedule), then a paired test against the best trial."""

        def __call__(self, step: int, metrics: dict[str, float]) -> None:
            pass

        def on_evaluation(self, step: int, correct: list[float]) -> None:
            for i, value in enumerate(correct):
                trial.report(float(value), step * INSTANCE_STRIDE + i)
            if correct and trial.should_prune():
                raise optuna.TrialPruned(f"pruned at step {step}: held-out results per question are worse than "
                                         f"the best trial's (Wilcoxon signed-rank, p < {sc.study.pruner_p_threshold})")

    return PerQuestion() if sc.study.pruner == "wilcoxon" else prune_cb


def _record_unstarted(payload: dict[str, Any], sc: SweepConfig, tags: dict[str, Any], error: str) -> str:
    """A FAILED MLflow run for a trial that failed before training (e.g. an invalid combination), so
    every trial is one run: its params and its error."""
    number = payload["number"]
    tr = Tracker(payload["tracking_uri"], check=False)
    rid = tr.start_run(payload["experiment"], f"trial-{number:04d}",
                       run_tags(base_config(sc), f"trial-{number:04d}", sc.study.name, tags), payload["parent_run_id"])
    tr.log_params(rid, {k: v for k, v in payload["params"].items()})
    tr.client.set_tag(rid, "error", error[:5000])
    tr.end_run(rid, "FAILED")
    return rid


def run_trial(payload: dict[str, Any]) -> dict[str, Any]:
    """Train one trial with MLflow logging and Optuna pruning; never raises (the outcome says)."""
    import optuna

    t0 = time.perf_counter()
    sc = SweepConfig.model_validate(payload["sweep"])
    number, params = payload["number"], payload["params"]
    out: dict[str, Any] = {"number": number, "state": "FAIL", "value": None, "error": None, "run_id": None}
    metric = sc.study.metric
    try:
        trial = _load_trial(payload, sc)
    except Exception as e:  # storage unreachable from the worker
        out["error"] = one_line(e, None)
        out["traceback"] = traceback.format_exc()
        return out

    def on_start(run_id: str) -> None:
        out["run_id"] = run_id
        trial.set_user_attr("mlflow_run_id", run_id)

    from exgrpo.launch import tracked_train  # torch: the sweep package stays light (dashboards, `exgrpo ui` read it)

    tags = {"trial_number": number, "kind": "trial"}
    try:
        cfg = trial_config(sc, params, number)
        callbacks = [_pruning(trial, sc)]
        if payload.get("progress_board") is not None:
            callbacks.append(ProgressReporter(payload["progress_board"], f"trial {number}", cfg.train.max_steps))
        run = tracked_train(cfg, tracking_uri=payload["tracking_uri"], experiment=payload["experiment"],
                            run_name=f"trial-{number:04d}", parent_run_id=payload["parent_run_id"],
                            arm=f"trial-{number:04d}", study=sc.study.name, tags=tags, extra_params=list(sc.space),
                            callbacks=callbacks, check=False, on_start=on_start,
                            log_model=False)  # the champion is registered from its checkpoint (an MLflow
        #                                       model per trial cost ~0.45 s, half of a toy trial)
        value = float(run.result.final_metrics[metric])
        if not math.isfinite(value):
            raise ValueError(f"{metric} is {value}")
        out.update(state="COMPLETE", value=value)
    except optuna.TrialPruned as e:
        out.update(state="PRUNED", error=str(e))
    except Exception as e:
        out.update(state="FAIL", error=one_line(e, None), traceback=traceback.format_exc())
        if out["run_id"] is None:  # failed before training (e.g. an invalid combination): still one run
            try:
                out["run_id"] = _record_unstarted(payload, sc, tags, out["error"])
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
    champion: str | None = None
    """``models:/exgrpo-<study>@champion``: the best trial's checkpoint in the MLflow Model Registry."""
    best_params: dict[str, Any] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    """Trial states over the whole study."""
    summary_error: str | None = None
    """Why the summary could not be written to the parent run (MLflow unreachable), else None."""
    not_launched: str | None = None
    """How many trials this call did not launch, and why (no room on disk: :mod:`exgrpo.disk`), else None;
    they were never asked of the study, so running the sweep again asks for them."""

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
        note = self.degenerate()
        return "\n".join(lines + ([f"\n{note}"] if note else []))

    def degenerate(self) -> str | None:
        """A warning when every completed trial scored the same: the searched fields changed nothing
        at this budget (on the toy, replay that never starts does this), so "best" means nothing."""
        values = [o["value"] for o in self.outcomes if o.get("state") == "COMPLETE" and o.get("value") is not None]
        if len(values) >= 2 and max(values) - min(values) <= 1e-12:
            return (f"degenerate: all {len(values)} completed trials scored {values[0]:.4f}; the searched fields "
                    "had no effect at this budget (check that replay started: replay/started in the trial runs)")
        return None


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
    from optuna.trial import TrialState

    ray_address = cluster_address(ray_address)
    require_shared_stores(ray_address, tracking_uri, resolve_storage(storage or sc.study.storage))  # before any work
    tracker = Tracker(tracking_uri)  # unreachable store: an error here, before any trial
    base = base_config(sc)
    experiment = sc.mlflow_experiment or base.name
    exp_id = tracker.experiment_id(experiment)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study, url, _ = open_study(sc, storage)
    parent = _parent_run(tracker, sc, base, study, experiment, url)
    _fail_interrupted(study)

    finished = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
    target = n_trials or sc.study.n_trials
    if sc.study.sampler == "grid":
        target = min(target, math.prod(len(v.grid()) for v in sc.space.values()))
    todo = max(0, target - len(study.get_trials(deepcopy=False, states=finished)))
    result = SweepResult(sc.study.name, url, parent, exp_id, tracker.uri)
    if todo:
        try:
            _run_trials(sc, base, study, todo, tracker, parent, experiment, url, ray_address, result, on_trial)
        except BaseException:  # Ray refused, the driver interrupted: the parent run never stays RUNNING
            with contextlib.suppress(Exception):  # MLflow gone too: the error raised is the one to see
                tracker.end_run(parent, "FAILED")
            raise

    # the study's outcome (from Optuna's storage), then its summary on the parent run
    trials = study.get_trials(deepcopy=False)
    result.counts = {s.name: sum(t.state == s for t in trials) for s in (TrialState.COMPLETE, TrialState.PRUNED,
                                                                       TrialState.FAIL)}
    if any(t.state == TrialState.COMPLETE for t in trials):
        best = study.best_trial
        result.best_value, result.best_params = best.value, dict(best.params)
    result.summary_error = finish_parent(tracker, parent, _parent_summary(tracker, parent, study, result, len(trials)),
                                         Path(base.output_dir).resolve() / "sweeps" / sc.study.name, "study")
    return result


def _parent_run(tracker: Tracker, sc: SweepConfig, base: Any, study: Any, experiment: str, url: str) -> str:
    """The study's parent run: the one the study names, RUNNING again (a resumed study), or a new one
    with the study's settings and space, named in the study."""
    parent = study.user_attrs.get("mlflow_parent_run_id")
    if parent is not None:
        try:
            tracker.client.get_run(parent)
            tracker.client.update_run(parent, status="RUNNING")
            return parent
        except Exception:
            pass
    parent = tracker.start_run(experiment, f"study-{sc.study.name}", {
        "kind": "sweep", "study": sc.study.name, "tier": str(base.tier.value),
        "budget_steps": str(sc.budget_steps), "sampler": sc.study.sampler, "pruner": sc.study.pruner,
    })
    tracker.log_params(parent, {"study.name": sc.study.name, "study.direction": sc.study.direction,
                                "study.metric": sc.study.metric, "study.sampler": sc.study.sampler,
                                "study.pruner": sc.study.pruner, "budget_steps": sc.budget_steps,
                                "optuna.storage": redact_uri(url)})  # anyone who reaches the UI reads it
    tracker.client.log_dict(parent, json.loads(space_signature(sc)), "sweep/space.json")
    study.set_user_attr("mlflow_parent_run_id", parent)
    return parent


def _fail_interrupted(study: Any) -> None:
    """Trials left RUNNING by a killed driver are failed (one driver per study)."""
    import optuna
    from optuna.trial import TrialState

    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        optuna.trial.Trial(study, t._trial_id).set_user_attr("error", "interrupted: the sweep process ended first")
        safe_tell(study, t.number, state=TrialState.FAIL)


def _run_trials(sc: SweepConfig, base: Any, study: Any, todo: int, tracker: Tracker, parent: str, experiment: str,
                url: str, ray_address: str | None, result: SweepResult, on_trial: Any) -> None:
    """``todo`` trials as Ray tasks, asked of the study as slots free, each told to the study and
    added to ``result.outcomes`` as it ends (then ``on_trial(outcome)``)."""
    import ray

    dists = {k: v.distribution() for k, v in sc.space.items()}
    board = start_on_ray(ray_address, tracker.client, parent)
    remote = ray.remote(num_cpus=task_cpus(base), max_retries=0)(run_trial)
    slots = launch_slots([base], ray_address, config_of=lambda _trial: base)  # veRL jobs on this cluster
    sweep_json = sc.model_dump(mode="json")
    if isinstance(sc.base, str):
        sweep_json["base"] = str(Path(sc.base).resolve())

    in_flight = [0]
    refused: list[str] = []
    root = Path(base.output_dir).resolve() / "sweeps" / sc.study.name

    def trials() -> Iterator[Any]:  # asked of the study only as a slot frees: TPE sees every result so far,
        room = while_room(range(todo), lambda _: root, lambda: in_flight[0],  # and only when the disk has room
                          lambda _, why: refused.append(why), resume=False, root=root,
                          fix="run the sweep again: its study asks for the trials still to run")
        for _ in room:
            yield study.ask(dists)

    def launch(trial: Any, options: dict[str, Any]) -> Any:  # veRL trials: each on the node its plan chose
        in_flight[0] += 1
        payload = {"sweep": sweep_json, "number": trial.number, "trial_id": trial._trial_id,
                   "params": dict(trial.params), "storage": url, "tracking_uri": tracker.uri,
                   "experiment": experiment, "parent_run_id": parent, "progress_board": board}
        return remote.options(**options).remote(payload)

    def ended(trial: Any, out: dict[str, Any] | None, error: BaseException | None) -> None:
        in_flight[0] -= 1
        if error is not None:  # the worker died (OOM, killed): still a FAIL, the study goes on
            out = {"number": trial.number, "state": "FAIL", "value": None, "run_id": None,
                   "error": one_line(error, None)}
        out["params"] = dict(trial.params)
        printer.finished(f"trial {trial.number} ({out['state']})")
        _tell(study, trial, out)
        result.outcomes.append(out)
        if on_trial is not None:
            on_trial(out)

    with progress_display(board, todo) as printer:
        run_as_slots_free(trials(), launch, ended, slots=slots, limit=sc.study.parallel, poll=printer.poll)
    if refused:  # never asked of the study: a later run of the sweep asks for them
        result.not_launched = f"{len(refused)} trial(s) not launched: {refused[0]}"
        print(f"sweep: {result.not_launched}", flush=True)


def _parent_summary(tracker: Any, parent: str, study: Any, result: SweepResult, n_trials: int) -> ParentSummary:
    """What the study's parent run holds at the end: the counts, the best trial (its params as
    ``best/*`` tags, its checkpoint registered as the champion when MLflow takes it) and the trials table."""
    summary = ParentSummary("FINISHED", {f"trials_{k.lower()}": float(v) for k, v in result.counts.items()},
                            step=n_trials)
    if result.best_value is not None:
        best = study.best_trial
        summary.metrics.update(best_value=float(best.value), best_trial=float(best.number))
        summary.tags.update({f"best/{k}": str(v) for k, v in best.params.items()})
        if (champion := _register_best(tracker, study, best, result)) is not None:
            summary.tags["champion_model"] = champion
    try:
        df = study.trials_dataframe(attrs=("number", "value", "state", "params", "user_attrs", "duration"))
    except Exception:  # noqa: BLE001 - the table is a convenience; the trials are in Optuna's storage
        df = None
    if df is not None:
        summary.texts["sweep/trials.csv"] = df.to_csv(index=False)
    return summary


def _register_best(tracker: Any, study: Any, best: Any, result: SweepResult) -> str | None:
    """The best trial's checkpoint as ``models:/exgrpo-<study>@champion``: the parent's ``champion_model``
    tag, or None with a note (a trial without a checkpoint, MLflow unreachable) instead of failing the
    summary; the same sweep command run again registers it."""
    run_id = best.user_attrs.get("mlflow_run_id")
    try:
        checkpoint = tracker.client.get_run(run_id).data.tags.get("checkpoint") if run_id else None
        if not checkpoint or checkpoint == "None":
            raise FileNotFoundError(f"trial {best.number} logged no checkpoint")
        name, version = register_champion(tracker.client, study.study_name, run_id, checkpoint, {
            "study": study.study_name, "trial": str(best.number), "value": f"{best.value:.6g}"})
    except Exception as e:  # noqa: BLE001 - the registry is a convenience on top of the study
        print(f"note: the best trial was not registered as a model ({one_line(e, 300)})", flush=True)
        return None
    result.champion = f"models:/{name}@{CHAMPION}"
    return f"{result.champion} (version {version})"


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

