"""A comparison logged to MLflow: one parent run with the statistics, one child run per (arm, seed).

No Prefect import: ``flows/compare.py`` calls :func:`run_tracked_compare` and publishes its table.
Runs go to Ray tasks (``train.threads`` CPUs each; ``ray.init(num_cpus=2)`` locally or a cluster
address) or to the spawned process pool of :func:`exgrpo.compare.run_local`.
"""

from __future__ import annotations

import contextlib

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Literal

from exgrpo.batch import ParentSummary, finish_parent, start_on_ray
from exgrpo.cluster import cluster_address, on_cluster, require_shared_stores, task_cpus
from exgrpo.compare import (
    ArmSummary,
    RunOutcome,
    continues,
    format_table,
    jobs,
    eval_compute,
    outcome_extras,
    prepare_warm_starts,
    run_description,
    run_local,
    split_params,
    summarize,
)
from exgrpo.compare import adaptive_record
from exgrpo.compare.figures import draw_figures
from exgrpo.disk import while_room
from exgrpo.compare.adaptive import SequentialState, StageIncomplete, format_decisions, run_adaptive
from exgrpo.config import CompareConfig, ExperimentConfig
from exgrpo.launch import tracked_train
from exgrpo.slots import launch_slots, run_as_slots_free
from exgrpo.errors import one_line
from exgrpo.live_progress import ProgressReporter, progress_display
from exgrpo.tracking.mlflow_tracking import Tracker, curated_params, model_tag, run_url
from exgrpo.tracking.run_record import end_if_orphaned, write_record


def tracked_run_one(cfg: ExperimentConfig, arm: str, metric: str = "val/accuracy", *, tracking_uri: str,
                    experiment: str, parent_run_id: str | None, study: str | None = None,
                    progress_board: Any = None, resume: bool = False) -> RunOutcome:
    """:func:`exgrpo.compare.run_one` with an MLflow child run (a ``compare.Runner``); with a
    ``progress_board`` (a Ray actor, :mod:`exgrpo.live_progress`) the run reports its steps to it.
    ``resume`` (:func:`exgrpo.compare.continues`): a run with checkpoints continues from them, and its
    new child run holds its whole history (the steps before the resume logged from metrics.jsonl)."""
    callbacks = []
    if progress_board is not None:
        callbacks.append(ProgressReporter(progress_board, f"{arm} seed {cfg.seed}", cfg.train.max_steps))
    run = tracked_train(cfg, tracking_uri=tracking_uri, experiment=experiment, parent_run_id=parent_run_id,
                        arm=arm, study=study, run_name=f"{arm}-seed{cfg.seed}", check=False, callbacks=callbacks,
                        resume=continues(cfg, resume), defer_if_unreachable=True)  # an outage never costs a run
    evals = [h for h in run.result.history if metric in h]
    return RunOutcome(arm, cfg.seed, float(run.result.final_metrics[metric]),
                      [h["step"] for h in evals], [h[metric] for h in evals], run_id=run.run_id or None,
                      run_dir=str(run.result.run_dir) if run.result.run_dir else None,
                      records_pending=not run.synced, **outcome_extras(run.result.history),
                      **eval_compute(run.result.history, metric))


@dataclass
class TrackedComparison:
    parent_run_id: str
    experiment_id: str
    tracking_uri: str
    metric: str
    baseline: str
    outcomes: list[RunOutcome]
    rows: list[ArmSummary]
    table: str
    failures: list[str] = field(default_factory=list)
    summary_error: str | None = None
    """Why the statistics are not on the parent run (MLflow unreachable at the end), else None."""
    adaptive: SequentialState | None = None
    """The sequential test's decisions of an adaptive comparison, else None."""
    figures: dict[str, str] = field(default_factory=dict)
    """name -> path of each figure (:data:`exgrpo.compare.figures.FIGURES`), drawn into the comparison's
    directory and logged on the parent run."""

    @property
    def url(self) -> str:
        return run_url(self.experiment_id, self.parent_run_id, self.tracking_uri)

    @property
    def description(self) -> str:
        """The parent run's description in MLflow's UI (:func:`exgrpo.compare.run_description`)."""
        return run_description(self.rows, self.metric, self.baseline, self.parent_run_id) + pending_note(self.outcomes)

    def child_url(self, o: RunOutcome) -> str:
        return run_url(self.experiment_id, o.run_id or "", self.tracking_uri)

    def table_rows(self) -> list[dict[str, object]]:
        """One dict per arm (for a Prefect table artifact)."""
        out = []
        for r in self.rows:
            d = r.diff_vs_baseline
            out.append({
                "arm": r.arm, "seeds": r.final.n, f"final {self.metric}": round(r.final.mean, 4),
                "ci95 low": round(r.final.low, 4), "ci95 high": round(r.final.high, 4),
                f"diff vs {self.baseline}": None if d is None else round(d.mean, 4),
                "diff ci95": None if d is None else f"[{d.low:+.4f}, {d.high:+.4f}]",
                f"step reaching {self.baseline}'s final": r.steps_to_baseline_final,
                "tokens sampled then (M)": None if r.tokens_to_baseline_final is None or r.steps_to_baseline_final is None
                else round(r.tokens_to_baseline_final / 1e6, 3),
                f"diff vs {self.baseline} at equal tokens": None if r.diff_at_equal_tokens is None
                else round(r.diff_at_equal_tokens.mean, 4),
                "equal-token diff ci95": None if r.diff_at_equal_tokens is None
                else f"[{r.diff_at_equal_tokens.low:+.4f}, {r.diff_at_equal_tokens.high:+.4f}]",
                "equal tokens (M)": None if r.equal_tokens is None else round(r.equal_tokens / 1e6, 3),
                "final train accuracy": None if r.train_final is None else round(r.train_final, 4),
                "rollout tokens (M)": None if r.rollout_tokens is None else round(r.rollout_tokens / 1e6, 3),
                "loss tokens (M)": None if r.grad_tokens is None else round(r.grad_tokens / 1e6, 3),
            })
        return out


def pending_note(outcomes: list[RunOutcome]) -> str:
    """The runs whose MLflow records wait on disk (MLflow was down), with the command that delivers them."""
    pending = sorted((o for o in outcomes if o.records_pending), key=lambda o: (o.arm, o.seed))
    if not pending:
        return ""
    names = ", ".join(f"{o.arm} seed {o.seed}" for o in pending)
    roots = sorted({str(Path(o.run_dir).parent.parent) for o in pending if o.run_dir})
    return (f"\n\nMLflow records pending for {len(pending)} run(s): {names}; trained and complete on disk, "
            f"delivered by `exgrpo sync {' '.join(roots)}` once MLflow is back.")


def _finite(x: float | None) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


def run_tracked_compare(
    cc: CompareConfig,
    *,
    tracking_uri: str | None = None,
    executor: Literal["ray", "process"] = "ray",
    workers: int | None = None,
    ray_address: str | None = None,
    run_name: str | None = None,
    on_done: Callable[[RunOutcome], None] | None = None,
    on_parent: Callable[[str, str], None] | None = None,
    on_progress: Callable[[float], None] | None = None,
    on_failed: Callable[[str, int, str], None] | None = None,
    on_started: Callable[[str, int], None] | None = None,
    resume: bool = False,
    adaptive: bool = False,
    on_stage: Callable[[SequentialState], None] | None = None,
    new_test: bool = False,
) -> TrackedComparison:
    """Train every (arm, seed) as an MLflow child run, then log the statistics on the parent.
    ``resume``: a run whose directory holds checkpoints continues from them (a finished one ends at
    once), so a killed comparison goes on, and one with more seeds or steps trains only what is new.
    ``adaptive``: seeds run in stages (``cc.adaptive``, :mod:`exgrpo.compare.adaptive`) for the arms
    still undecided; each stage's decisions go on the parent run and to ``on_stage(state)``. A resumed
    adaptive comparison keeps the settings its test began with (:mod:`exgrpo.compare.adaptive_record`);
    ``new_test`` starts a new test over its runs instead.

    A failed child marks its run FAILED; the others finish, the statistics cover them, and the
    call then raises listing the failures (the parent run ends FAILED; an adaptive comparison runs
    no further stage). ``on_parent(run_id, url)`` runs as soon as the parent run exists;
    ``on_done(outcome)`` as each child finishes; with Ray, ``on_progress(fraction)`` as steps advance
    (finished runs 1, running ones step/total); ``on_failed(arm, seed, error)`` as a run fails; with
    Ray, ``on_started(arm, seed)`` once a run reports its first step (so a record of it can span its
    own training), at the latest just before its ``on_done`` or ``on_failed``."""
    ray_address = cluster_address(ray_address) if executor == "ray" else None
    require_shared_stores(ray_address, tracking_uri)  # before any work
    if adaptive:
        adaptive_record.check_settings(cc, resume, new_test)
    tracker = Tracker(tracking_uri)  # unreachable store: an error here, before any training
    if ray_address is None:  # the runs share this machine's cache: its warm starts first, said in a line
        prepare_warm_starts(cfg for cfg, _ in jobs(cc))
    base = cc.base_config()
    exp_id = tracker.experiment_id(base.name)
    if adaptive and (note := adaptive_record.begin(cc, resume, new_test)) is not None:
        print(f"note: {note}", flush=True)
    parent = _start_parent(tracker, cc, base, run_name, resume, adaptive)
    if on_parent is not None:
        on_parent(parent, run_url(exp_id, parent, tracker.uri))
    ended = False
    try:
        _log_setup(tracker, parent, cc, adaptive)
        failures: list[str] = []

        def failed_run(arm: str, seed: int, error: str) -> None:
            failures.append(f"{arm} seed {seed}: {error}")
            on_failed and on_failed(arm, seed, error)

        train_stage = _StageTrainer(cc, tracker, parent, base.name, executor, workers, ray_address, resume,
                                    on_done, on_progress, failed_run, on_started)
        outcomes, state = _train_all(cc, train_stage, tracker, parent, adaptive, on_stage)
        result = _comparison(cc, tracker, parent, exp_id, outcomes, state, failures)
        if outcomes:
            result.figures = draw_figures(outcomes, list(cc.arms), cc.metric, Path(base.output_dir) / base.name)
        result.summary_error = finish_parent(tracker, parent, _parent_summary(result, failures),
                                             Path(base.output_dir) / base.name, "comparison")
        ended = True
        if failures:
            raise RuntimeError(f"{len(failures)} of {train_stage.launched} runs failed: " + "; ".join(failures))
        return result
    except BaseException as e:
        if not ended:
            stopped = not isinstance(e, Exception)  # Ctrl-C, SIGTERM (the CLI's, Prefect's), an exit
            # never hides the error on its way out, MLflow down too included
            with contextlib.suppress(Exception):
                if stopped:
                    tracker.end_running_children(parent, "KILLED")
            with contextlib.suppress(Exception):
                tracker.end_run(parent, "KILLED" if stopped else "FAILED")
        raise


def _start_parent(tracker: Tracker, cc: CompareConfig, base: ExperimentConfig, run_name: str | None, resume: bool,
                  adaptive: bool) -> str:
    """The comparison's parent run, started, its id recorded in the comparison's directory (where a
    killed comparison's parent, left RUNNING, is ended first)."""
    where = Path(base.output_dir).resolve() / base.name  # the comparison's directory: its parent run's record
    if (killed := end_if_orphaned(where, tracker.client)) is not None:
        print(f"note: {killed}", flush=True)
    parent = tracker.start_run(base.name, run_name or f"compare-{base.name}", {
        "kind": "compare", "arms": ",".join(cc.arms), "baseline": cc.baseline, "tier": str(base.tier.value),
        "task": str(getattr(base.task, "kind", "")), "model": model_tag(base), "metric": cc.metric,
        "resumed": str(resume).lower(), "adaptive": str(adaptive).lower(),
    })
    write_record(where, tracker.uri, parent)
    return parent


def _train_all(cc: CompareConfig, train_stage: _StageTrainer, tracker: Tracker, parent: str, adaptive: bool,
               on_stage: Callable[[SequentialState], None] | None,
               ) -> tuple[list[RunOutcome], SequentialState | None]:
    """Every run of the comparison, or, adaptive, stage after stage until the test decides (each
    stage's decisions on the parent run and to ``on_stage``): the outcomes and the test's state."""
    if not adaptive:
        return train_stage(cc), None

    def stage_done(st: SequentialState) -> None:
        _log_stage(tracker, parent, st, cc)
        on_stage and on_stage(st)

    try:
        return run_adaptive(cc, train_stage, on_stage=stage_done)
    except StageIncomplete as e:  # the failures are listed by the caller; the statistics cover what finished
        return e.outcomes, e.state


def _comparison(cc: CompareConfig, tracker: Tracker, parent: str, exp_id: str, outcomes: list[RunOutcome],
                state: SequentialState | None, failures: list[str]) -> TrackedComparison:
    """The statistics of the outcomes, and their table (with the sequential test's decisions)."""
    rows = summarize(outcomes, list(cc.arms), cc.baseline) if outcomes else []
    horizon = max((o.curve_steps[-1] for o in outcomes if o.curve_steps), default=None)
    table = format_table(rows, cc.metric, cc.baseline, horizon) + pending_note(outcomes)
    if state is not None:
        table += "\n\n## Sequential test (adaptive seeds)\n\n" + format_decisions(state, cc)
    return TrackedComparison(parent, exp_id, tracker.uri, cc.metric, cc.baseline, outcomes, rows, table, failures,
                             adaptive=state)


def _parent_summary(result: TrackedComparison, failures: list[str]) -> ParentSummary:
    """What the parent run holds at the end: the statistics as metrics, the table, the description,
    the outcomes, the figures, the failures."""
    tags = {"mlflow.note.content": result.description}  # the run's description in the MLflow UI
    if failures:
        tags["error"] = "; ".join(failures)[:5000]
    return ParentSummary(
        "FAILED" if failures else "FINISHED",
        {k: v for k, v in _summary_metrics(result.rows, result.baseline).items() if _finite(v)},
        tags=tags,
        texts={"comparison.md": result.table + "\n",
               "outcomes.json": json.dumps([o.__dict__ for o in result.outcomes], indent=1, default=str)},
        files=list(result.figures.values()))


def _log_setup(tracker: Tracker, parent: str, cc: CompareConfig, adaptive: bool) -> None:
    """The parent run's params: what every arm shares, what differs (one tag per arm), the seeds or
    the adaptive settings, and the comparison's config."""
    by_arm = {arm: {k: str(v) for k, v in curated_params(cc.arm_config(arm, cc.seeds[0])).items() if k != "seed"}
              for arm in cc.arms}
    common, differ = split_params(by_arm)  # the parent holds what every arm shares, not one arm's settings
    seeds = ({f"compare.adaptive.{k}": str(v) for k, v in cc.adaptive.model_dump().items()} if adaptive
             else {"compare.seeds": ",".join(map(str, cc.seeds))})
    tracker.log_params(parent, {**common, **seeds, "compare.metric": cc.metric, "compare.baseline": cc.baseline,
                                "compare.differs_by_arm": ", ".join(differ) or "nothing"})
    for arm, params in by_arm.items():  # each arm's own values of those fields, one tag per arm
        tracker.client.set_tag(parent, f"arm.{arm}", "; ".join(f"{k}={params.get(k, '—')}" for k in differ)[:5000])
    tracker.client.log_dict(parent, cc.model_dump(mode="json"), "config/compare.json")


def _log_stage(tracker: Tracker, parent: str, state: SequentialState, cc: CompareConfig) -> None:
    """One stage of the sequential test on the parent run: the decisions so far (``adaptive.json``
    and ``adaptive.md``), a tag per pair, and the undecided pairs as a metric over stages."""
    tracker.client.log_dict(parent, state.to_dict(), "adaptive.json")
    tracker.client.log_text(parent, format_decisions(state, cc) + "\n", "adaptive.md")
    for p in state.pairs:
        where = "" if p.stage is None else f" at stage {p.stage}"
        tracker.client.set_tag(parent, f"adaptive.{p.arm}_vs_{p.other}", f"{p.decision}{where} ({p.seeds} seeds each)")
    tracker.log_metrics(parent, {"adaptive/undecided_pairs": float(sum(p.decision == "undecided" for p in state.pairs)),
                                 "adaptive/stages": float(state.stages_done)}, step=state.stages_done)


def _summary_metrics(rows: list[ArmSummary], baseline: str) -> dict[str, float]:
    """The parent run's metrics: per arm, its final mean and CI, the paired difference and the compute."""
    metrics: dict[str, float] = {}
    for r in rows:
        metrics[f"{r.arm}/final_mean"] = r.final.mean
        metrics[f"{r.arm}/final_ci_low"] = r.final.low
        metrics[f"{r.arm}/final_ci_high"] = r.final.high
        if r.diff_vs_baseline is not None:
            metrics[f"{r.arm}/diff_vs_{baseline}"] = r.diff_vs_baseline.mean
            metrics[f"{r.arm}/diff_vs_{baseline}_ci_low"] = r.diff_vs_baseline.low
            metrics[f"{r.arm}/diff_vs_{baseline}_ci_high"] = r.diff_vs_baseline.high
        if r.steps_to_baseline_final is not None:
            metrics[f"{r.arm}/steps_to_baseline_final"] = float(r.steps_to_baseline_final)
        if r.steps_to_baseline_final is not None and r.tokens_to_baseline_final is not None:
            metrics[f"{r.arm}/tokens_to_baseline_final"] = r.tokens_to_baseline_final
        if r.steps_to_baseline_final is not None and r.seconds_to_baseline_final is not None:
            metrics[f"{r.arm}/seconds_to_baseline_final"] = r.seconds_to_baseline_final
        if r.diff_at_equal_tokens is not None and r.equal_tokens is not None:
            metrics[f"{r.arm}/equal_tokens"] = r.equal_tokens
            metrics[f"{r.arm}/diff_vs_{baseline}_at_equal_tokens"] = r.diff_at_equal_tokens.mean
            metrics[f"{r.arm}/diff_vs_{baseline}_at_equal_tokens_ci_low"] = r.diff_at_equal_tokens.low
            metrics[f"{r.arm}/diff_vs_{baseline}_at_equal_tokens_ci_high"] = r.diff_at_equal_tokens.high
        if r.train_final is not None:
            metrics[f"{r.arm}/train_final_mean"] = r.train_final
        if r.rollout_tokens is not None:
            metrics[f"{r.arm}/rollout_tokens"] = r.rollout_tokens
            metrics[f"{r.arm}/grad_tokens"] = r.grad_tokens or 0.0
    return metrics


class _StageTrainer:
    """Trains the runs of a comparison (all of it, or one stage of an adaptive one) as MLflow children
    of ``parent``: on Ray (a cluster or ``ray.init`` here) or in a spawned process pool. Called with a
    comparison, returns the outcomes that finished; keeps every outcome in ``outcomes``."""

    def __init__(self, cc: CompareConfig, tracker: Tracker, parent: str, experiment: str, executor: str,
                 workers: int | None, ray_address: str | None, resume: bool,
                 on_done: Callable[[RunOutcome], None] | None, on_progress: Callable[[float], None] | None,
                 on_failed: Callable[[str, int, str], None], on_started: Callable[[str, int], None] | None) -> None:
        if executor not in ("ray", "process"):
            raise ValueError(f"executor={executor!r}: use 'ray' or 'process'")
        self.cc, self.tracker, self.parent, self.experiment = cc, tracker, parent, experiment
        self.executor, self.workers, self.ray_address, self.resume = executor, workers, ray_address, resume
        self.on_done, self.on_progress, self.on_failed, self.on_started = on_done, on_progress, on_failed, on_started
        self.outcomes: list[RunOutcome] = []
        self.launched = 0
        self._board = None

    def _done(self, o: RunOutcome) -> None:
        self.outcomes.append(o)
        self.on_done and self.on_done(o)

    def __call__(self, cc: CompareConfig) -> list[RunOutcome]:
        before = len(self.outcomes)
        todo = []
        for cfg, arm in jobs(cc):  # absolute run dirs: workers may not share the driver's cwd
            todo.append((on_cluster(cfg.model_copy(update={"output_dir": Path(cfg.output_dir).resolve()}),
                                    self.ray_address), arm))
        self.launched += len(todo)
        if self.executor == "ray":
            self._on_ray(todo)
        else:
            base = Path(self.cc.base_config().output_dir).resolve()
            sub = cc.model_copy(update={"base": {**cc.base, "output_dir": str(base)}})
            runner = partial(tracked_run_one, tracking_uri=self.tracker.uri, experiment=self.experiment,
                             parent_run_id=self.parent)
            run_local(sub, workers=self.workers, runner=runner, resume=self.resume, on_done=self._done,
                      on_failed=self.on_failed)
        return self.outcomes[before:]

    def _ray_board(self) -> Any:
        if self._board is None:  # once per comparison: an adaptive one trains stage after stage
            self._board = start_on_ray(self.ray_address, self.tracker.client, self.parent)
        return self._board

    def _on_ray(self, todo: list[tuple[ExperimentConfig, str]]) -> None:
        import ray

        board = self._ray_board()
        remote = ray.remote(max_retries=0)(tracked_run_one)
        # every run at once, or veRL runs as the cluster hosts them whole, or --workers at a time
        slots = launch_slots([cfg for cfg, _ in todo], self.ray_address, config_of=lambda job: job[0])
        running: dict[tuple[str, int], bool] = {}  # (arm, seed) -> whether on_started has heard of it

        def launch(job: tuple[ExperimentConfig, str], options: dict[str, Any]) -> Any:
            cfg, arm = job
            running[(arm, cfg.seed)] = False
            return remote.options(num_cpus=task_cpus(cfg), **options).remote(
                cfg, arm, self.cc.metric, tracking_uri=self.tracker.uri, experiment=self.experiment,
                parent_run_id=self.parent, progress_board=board, resume=self.resume)

        def starts(arm: str, seed: int) -> None:  # once per run
            if not running.get((arm, seed)) and self.on_started is not None:
                self.on_started(arm, seed)
            running[(arm, seed)] = True

        def ended(job: tuple[ExperimentConfig, str], outcome: RunOutcome | None, error: BaseException | None) -> None:
            arm, seed = job[1], job[0].seed
            starts(arm, seed)
            running.pop((arm, seed), None)
            try:
                if error is not None:
                    raise error
                self._done(outcome)
                printer.finished(f"{arm} seed {seed}")
            except Exception as e:
                printer.finished(f"{arm} seed {seed} (FAILED)")
                self.on_failed(arm, seed, one_line(e))

        def poll() -> None:
            printer.poll()
            for arm, seed in [k for k, heard in running.items() if not heard]:
                if f"{arm} seed {seed}" in printer.states:
                    starts(arm, seed)
            if self.on_progress is not None:
                self.on_progress(printer.fraction())

        def refused(job: tuple[ExperimentConfig, str], reason: str) -> None:
            printer.finished(f"{job[1]} seed {job[0].seed} (not launched)")
            self.on_failed(job[1], job[0].seed, reason)

        with progress_display(board, len(todo)) as printer:
            launchable = while_room(todo, lambda job: job[0].run_dir(), lambda: len(running), refused,
                                    resume=self.resume, fix="resume the comparison (--resume) to train this run")
            run_as_slots_free(launchable, launch, ended, slots=slots, limit=self.workers, poll=poll)
