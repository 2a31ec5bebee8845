"""Side-by-side comparison: every (arm, seed) trained on the same environment, then statistics.

Orchestration-free (no Prefect, no MLflow import): runs go through a ``runner`` callable so the
CLI can use local processes and the Prefect flow can use Ray tasks with MLflow callbacks.
"""

from __future__ import annotations

import functools
import itertools
import math
import os
import statistics
import time
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, BrokenExecutor, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
import multiprocessing as mp

from exgrpo.disk import while_room
from exgrpo.config import CompareConfig, ExperimentConfig
from exgrpo.errors import one_line
from exgrpo.stats import (Estimate, iqm_ci, mean_ci, paired_difference, probability_of_improvement, steps_to_target,
                          value_at)
from exgrpo.backends.base import train
from exgrpo.runs import has_checkpoint, holds_earlier_run
from exgrpo.policies.build import prepare_warm_starts  # noqa: F401 - where callers find it too


@dataclass
class RunOutcome:
    """The part of a finished run a comparison needs."""

    arm: str
    seed: int
    final: float
    curve_steps: list[float] = field(default_factory=list)
    curve_values: list[float] = field(default_factory=list)
    run_id: str | None = None
    run_dir: str | None = None
    final_train: float | None = None
    """``train/accuracy`` at the run's last evaluation (None where the backend does not measure it)."""
    rollout_tokens: float | None = None
    """Response tokens sampled over the whole run (``compute/rollout_tokens`` summed)."""
    grad_tokens: float | None = None
    """Response tokens that entered the loss over the whole run (``compute/grad_tokens`` summed)."""
    fresh_questions: float | None = None
    """Questions drawn fresh from the training set over the whole run (``compute/fresh_questions`` summed)."""
    train_seconds: float | None = None
    """Wall time of the run's training steps (``time/step_seconds`` summed; evaluations excluded)."""
    curve_tokens: list[float] = field(default_factory=list)
    """Sampled response tokens so far (``compute/rollout_tokens`` summed) at each of ``curve_steps``."""
    curve_seconds: list[float] = field(default_factory=list)
    """Training wall time so far (``time/step_seconds`` summed) at each of ``curve_steps``."""
    records_pending: bool = False
    """MLflow could not take the run's record (down at its start or end): it waits in ``run_dir`` for
    ``exgrpo sync``."""


def outcome_extras(history: Iterable[dict[str, float]]) -> dict[str, float | None]:
    """What a comparison keeps of a run's step rows beside its final metric: rollout and gradient
    tokens (a replay term's included), fresh questions and step seconds summed, the last
    ``train/accuracy`` (None for what was not logged)."""
    history = list(history)
    train = [h["train/accuracy"] for h in history if "train/accuracy" in h]

    def total(key: str) -> float | None:
        values = [h[key] for h in history if key in h]
        return float(sum(values)) if values else None

    grad, replay_term = total("compute/grad_tokens"), total("compute/replay_term_tokens")
    return {"rollout_tokens": total("compute/rollout_tokens"),
            "grad_tokens": None if grad is None else grad + (replay_term or 0.0),
            "fresh_questions": total("compute/fresh_questions"), "train_seconds": total("time/step_seconds"),
            "final_train": float(train[-1]) if train else None}


def eval_compute(history: Iterable[dict[str, float]], metric: str) -> dict[str, list[float]]:
    """The compute a run had spent at each evaluation of ``metric``: sampled response tokens and
    training seconds summed over the step rows up to it (``curve_tokens``, ``curve_seconds``; empty
    where the run does not log them)."""
    tokens, seconds, spent, took, logged = [], [], 0.0, 0.0, False
    for h in history:
        logged = logged or "compute/rollout_tokens" in h
        spent += h.get("compute/rollout_tokens", 0.0)
        took += h.get("time/step_seconds", 0.0)
        if metric in h:
            tokens.append(spent)
            seconds.append(took)
    return {"curve_tokens": tokens, "curve_seconds": seconds} if logged else {}


def mean_along(runs: Iterable[RunOutcome], curve: str) -> list[float] | None:
    """Mean over ``runs`` of their ``curve`` (``curve_tokens`` or ``curve_seconds``) at the
    evaluation steps every run has (the x of a metric drawn against compute); None if a run lacks it."""
    runs = list(runs)
    if not runs or any(len(getattr(o, curve)) != len(o.curve_steps) or not o.curve_steps for o in runs):
        return None
    common = sorted(set.intersection(*(set(o.curve_steps) for o in runs)))
    at = [dict(zip(o.curve_steps, getattr(o, curve), strict=True)) for o in runs]
    return [sum(a[t] for a in at) / len(at) for t in common]


def median_reach(reach: Iterable[float | None]) -> float | None:
    """The median over every seed of when it reached a target, a seed that never did counted as
    beyond the horizon; None when the median itself lies beyond it (half the seeds or more never
    reached the target). The median of the seeds that reached it alone would flatter an arm that
    often does not."""
    values = sorted(math.inf if r is None else float(r) for r in reach)
    if not values:
        return None
    n = len(values)
    mid = values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2
    return None if math.isinf(mid) else mid


def equal_token_budget(runs: Iterable[RunOutcome]) -> float | None:
    """The largest sampled-token count every one of ``runs`` reached: the smallest last point of
    their token curves (each run's metric is then read inside its own evaluation grid, never past
    its end); None when a run has no token curve or none was spent."""
    ends = [o.curve_tokens[-1] if o.curve_tokens and len(o.curve_tokens) == len(o.curve_values) else None
            for o in runs]
    if not ends or any(e is None for e in ends):
        return None
    budget = min(ends)
    return budget if budget > 0 else None


def diff_at_equal_tokens(arm: dict[int, RunOutcome], base: dict[int, RunOutcome]) -> tuple[float, Estimate] | None:
    """Per seed both arms share, the arm's metric minus the baseline's at the sampled-token budget both
    runs of that seed reached (:func:`equal_token_budget` of the pair), each curve interpolated on its
    evaluation grid; the median of those budgets and the paired difference with its 95% CI. None where a
    pair has no budget.

    Each pair is read at its own budget: seeds whose runs sample far more than another seed's (response
    lengths vary several-fold between seeds on a pretrained model) are not cut to the shortest run of all,
    where every arm is near its start and the reading says nothing."""
    common = sorted(set(arm) & set(base))
    budgets = [equal_token_budget([arm[s], base[s]]) for s in common]
    if not budgets or any(b is None for b in budgets):
        return None
    a = [value_at(t, arm[s].curve_tokens, arm[s].curve_values) for s, t in zip(common, budgets, strict=True)]
    b = [value_at(t, base[s].curve_tokens, base[s].curve_values) for s, t in zip(common, budgets, strict=True)]
    if any(v is None for v in a + b):
        return None
    return float(statistics.median(budgets)), paired_difference(a, b)


def _first_reach(o: RunOutcome, target: float, along: list[float]) -> float | None:
    """``along`` (a run's step, tokens or seconds curve) at the first evaluation reaching ``target``."""
    if len(along) != len(o.curve_values):
        return None
    return next((x for x, v in zip(along, o.curve_values, strict=True) if v >= target), None)


@dataclass
class ArmSummary:
    arm: str
    final: Estimate
    diff_vs_baseline: Estimate | None
    steps_to_baseline_final: float | None
    """Median over seeds of the first eval step at which the arm reaches the baseline's mean final
    (:func:`median_reach`: a seed that never reaches it counts as beyond the horizon)."""
    iqm: Estimate | None = None
    """Interquartile mean of the final metric over seeds, percentile-bootstrap 95% CI."""
    p_improve: Estimate | None = None
    """P(a run of this arm beats a run of the baseline), percentile-bootstrap 95% CI."""
    rollout_tokens: float | None = None
    """Mean over seeds of the run's sampled response tokens."""
    grad_tokens: float | None = None
    """Mean over seeds of the run's response tokens in the loss."""
    train_final: float | None = None
    """Mean over seeds of the final ``train/accuracy`` (training questions), where measured."""
    fresh_questions: float | None = None
    """Mean over seeds of the questions drawn fresh over a run."""
    train_seconds: float | None = None
    """Mean over seeds of a run's training wall time (step seconds summed)."""
    tokens_to_baseline_final: float | None = None
    """Median over seeds of the sampled response tokens spent when the arm first reaches the
    baseline's mean final (:func:`median_reach`): the comparison at equal generation compute."""
    seconds_to_baseline_final: float | None = None
    """The same in training wall time (seconds)."""
    equal_tokens: float | None = None
    """The median over seeds of the sampled-token count at which a seed's run of this arm and of the
    baseline are read side by side: the fewer that either of the two spent in all
    (:func:`diff_at_equal_tokens`); None for the baseline itself."""
    diff_at_equal_tokens: Estimate | None = None
    """The arm minus the baseline in the metric, each seed's pair at its own equal budget (each run's curve
    interpolated on its evaluation grid, :func:`exgrpo.stats.value_at`), paired by seed, with a
    Student-t 95% CI: the comparison at equal generation compute."""


def continues(cfg: ExperimentConfig, resume: bool) -> bool:
    """Whether a comparison's run of ``cfg`` is started with ``--resume``: when its run directory holds a
    run. With checkpoints it continues from them (a finished run then ends at once with its record; a
    killed one goes on); one killed before its first checkpoint is moved aside and trained afresh, saying
    so (:func:`exgrpo.runs.prepare_run_dir`). A seed new to the comparison is trained, without a note."""
    return resume and (has_checkpoint(cfg.run_dir()) or holds_earlier_run(cfg.run_dir()))


def run_one(cfg: ExperimentConfig, arm: str, metric: str = "val/accuracy", resume: bool = False) -> RunOutcome:
    """Train one (arm, seed) in this process and reduce it to a :class:`RunOutcome` (``resume``:
    see :func:`continues`)."""
    result = train(cfg, progress=False, resume=continues(cfg, resume))
    evals = [h for h in result.history if metric in h]
    return RunOutcome(
        arm, cfg.seed, float(result.final_metrics[metric]),
        [h["step"] for h in evals], [h[metric] for h in evals], run_dir=str(result.run_dir),
        **outcome_extras(result.history), **eval_compute(result.history, metric),
    )


Runner = Callable[..., RunOutcome]
"""(config, arm, metric, resume=...) -> RunOutcome: trains one (arm, seed); default :func:`run_one`.
A runner given to :func:`run_local` with workers > 1 must be picklable (a module-level function or a
``functools.partial`` of one), e.g. one that also logs to MLflow."""


def _run_one_job(args: tuple) -> RunOutcome:
    cfg, arm, metric, runner, resume = args
    return (runner or run_one)(cfg, arm, metric, resume=resume)


def jobs(cc: CompareConfig) -> list[tuple[ExperimentConfig, str]]:
    """All (config, arm) pairs, seeds interleaved so partial results cover every arm."""
    return [(cc.arm_config(arm, seed), arm) for seed in cc.seeds for arm in cc.arms]


def split_params(by_arm: dict[str, dict[str, str]]) -> tuple[dict[str, str], list[str]]:
    """The params every arm shares (a comparison's parent run records these) and the names of those
    that differ between arms (or that some arm lacks), sorted."""
    names = set().union(*by_arm.values()) if by_arm else set()
    differ = sorted(n for n in names if len({arm.get(n) for arm in by_arm.values()}) > 1)
    first = next(iter(by_arm.values()), {})
    return {n: v for n, v in first.items() if n not in differ}, differ


class RunsFailed(RuntimeError):
    """Some runs of a comparison failed; the others finished (``outcomes``)."""

    def __init__(self, failures: list[str], outcomes: list[RunOutcome]) -> None:
        super().__init__(f"{len(failures)} run(s) failed: " + "; ".join(failures))
        self.failures, self.outcomes = failures, outcomes


def run_local(cc: CompareConfig, workers: int | None = None, on_done: Callable[[RunOutcome], None] | None = None,
              runner: Runner | None = None, resume: bool = False,
              on_failed: Callable[[str, int, str], None] | None = None) -> list[RunOutcome]:
    """Run every (arm, seed) in ``workers`` spawned processes (1: in this process; None: as many as the
    cores hold), each through ``runner`` (default :func:`run_one`; ``resume``: see :func:`continues`).
    Workers x ``train.threads`` never exceeds this process's cores: fewer workers run, and a line says so.

    A run that fails does not stop the others: ``on_failed(arm, seed, error)`` hears of it as it
    fails, and once every run has ended, without ``on_failed`` :class:`RunsFailed` lists them. A run the
    disk has no room for is not launched: it fails so at once (:mod:`exgrpo.disk`)."""
    todo = [(cfg, arm, cc.metric, runner, resume) for cfg, arm in jobs(cc)]
    threads = max((cfg.train.threads for cfg, *_ in todo), default=1)
    cores = len(os.sched_getaffinity(0))
    fit = max(1, cores // threads)
    if workers is None:
        workers = fit
    elif workers > fit:
        print(f"compare: {fit} worker(s) instead of {workers}: each run uses train.threads={threads} "
              f"of {cores} cores", flush=True)
        workers = fit
    out: list[RunOutcome] = []
    failures: list[str] = []

    def ended(job: tuple, run: Callable[[], RunOutcome]) -> None:
        cfg, arm = job[0], job[1]
        try:
            out.append(run())
        except Exception as e:  # noqa: BLE001 - one failed run is reported; the others go on
            error = one_line(e)
            failures.append(f"{arm} seed {cfg.seed}: {error}")
            on_failed and on_failed(arm, cfg.seed, error)
            return
        on_done and on_done(out[-1])

    def refused(job: tuple, reason: str) -> None:
        failures.append(f"{job[1]} seed {job[0].seed}: {reason}")
        on_failed and on_failed(job[1], job[0].seed, reason)

    inflight: dict[Future, tuple] = {}
    launchable = while_room(todo, lambda job: job[0].run_dir(), lambda: len(inflight), refused, resume=resume,
                            fix="resume the comparison (--resume) to train this run")
    if workers <= 1:
        for job in launchable:
            ended(job, lambda job=job: _run_one_job(job))
    else:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as ex:

            def launch(jobs: Iterable[tuple]) -> None:
                for job in jobs:
                    try:
                        inflight[ex.submit(_run_one_job, job)] = job
                    except BrokenExecutor as e:  # a worker was killed (the OOM killer): each run left fails with it
                        ended(job, functools.partial(_raise, e))

            try:  # submitted as workers free up, so each run is launched only when the disk has room for it
                launch(itertools.islice(launchable, workers))
                while inflight:
                    done, _ = wait(inflight, return_when=FIRST_COMPLETED)
                    for f in done:
                        ended(inflight.pop(f), f.result)
                    launch(itertools.islice(launchable, max(workers - len(inflight), 0)))
            except BaseException:  # Ctrl-C, SIGTERM, or a failure here: the runs not started never start,
                _stop_pool(ex)     # the running ones end now
                raise
    if failures and on_failed is None:
        raise RunsFailed(failures, out)
    return out


def _raise(error: BaseException) -> RunOutcome:
    raise error


def _stop_pool(ex: ProcessPoolExecutor, grace: float = 10.0) -> None:
    """Cancel what ``ex`` has not started and end its worker processes, killed after ``grace`` seconds: a
    signal to the command alone (SIGTERM from a scheduler, a ``kill``) does not reach them, and a worker
    left running holds the command's exit until its run ends (Python joins the pool at exit). The workers
    are read before the shutdown, which forgets them. Their exits are read from their sentinels, not by
    reaping: the pool's own thread reaps a worker that dies under it, and a second reaper sees no child
    and takes it for alive."""
    from multiprocessing.connection import wait as ready

    procs = list((getattr(ex, "_processes", None) or {}).values())
    ex.shutdown(wait=False, cancel_futures=True)
    for proc in procs:
        proc.terminate()
    running = {proc.sentinel: proc for proc in procs}
    deadline = time.monotonic() + grace
    while running and (left := deadline - time.monotonic()) > 0:
        for ended in ready(list(running), left):
            running.pop(ended)
    for proc in running.values():
        proc.kill()
    if running:
        ready(list(running))
    ex.shutdown(wait=True)


def summarize(outcomes: Iterable[RunOutcome], arms: list[str], baseline: str) -> list[ArmSummary]:
    """Per arm: final metric mean ± 95% CI, paired difference vs the baseline, steps to reach the
    baseline's mean final value."""
    by_arm: dict[str, dict[int, RunOutcome]] = {a: {} for a in arms}
    for o in outcomes:
        by_arm[o.arm][o.seed] = o
    base = by_arm[baseline]
    base_final = mean_ci([o.final for o in base.values()]).mean if base else float("nan")
    rows = []
    for arm in arms:
        runs = by_arm[arm]
        if not runs:
            continue
        final = mean_ci([o.final for o in runs.values()])
        common = sorted(set(runs) & set(base))
        diff = at_tokens = None
        if arm != baseline and common:
            diff = paired_difference([runs[s].final for s in common], [base[s].final for s in common])
            at_tokens = diff_at_equal_tokens(runs, base)
        median = median_reach(steps_to_target(o.curve_steps, o.curve_values, base_final) for o in runs.values())
        with_tokens = [o for o in runs.values() if o.curve_tokens]
        tokens = median_reach(_first_reach(o, base_final, o.curve_tokens) for o in with_tokens) if with_tokens else None
        seconds = median_reach(_first_reach(o, base_final, o.curve_seconds) for o in with_tokens) if with_tokens else None
        finals = [o.final for o in runs.values()]
        p_improve = None
        if arm != baseline and base:
            p_improve = probability_of_improvement(finals, [o.final for o in base.values()])
        spent = [o for o in runs.values() if o.rollout_tokens is not None]
        rollout = sum(o.rollout_tokens for o in spent) / len(spent) if spent else None
        grad = sum(o.grad_tokens or 0.0 for o in spent) / len(spent) if spent else None
        rows.append(ArmSummary(arm, final, diff, median, iqm_ci(finals), p_improve, rollout, grad,
                               _mean_of([o.final_train for o in runs.values()]),
                               _mean_of([o.fresh_questions for o in runs.values()]),
                               _mean_of([o.train_seconds for o in runs.values()]), tokens, seconds,
                               *(at_tokens or (None, None))))
    return rows


def _mean_of(values: Iterable[float | None]) -> float | None:
    """Mean of the values that are not None; None if there are none."""
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _minutes(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds / 60:.1f}"


def format_table(rows: list[ArmSummary], metric: str, baseline: str, horizon: float | None = None) -> str:
    """The comparison as two Markdown tables, the outcome and the compute each arm spent (read at
    equal steps, equal sampled tokens and equal wall time), a one-line legend per column and a
    verdict in words. ``horizon`` is the last evaluated step (for "not reached within N steps")."""
    lines = [
        f"| arm | seeds | final {metric} (mean ± 95% CI) | train acc. | IQM [95% CI] | diff vs {baseline} (paired, 95% CI) "
        f"| P(> {baseline}) [95% CI] |",
        "|---|---|---|---|---|---|---|",
    ]
    within = f"not reached within {int(horizon)} steps" if horizon else "not reached"
    for r in rows:
        diff = "—" if r.diff_vs_baseline is None else (
            f"{r.diff_vs_baseline.mean:+.4f} [{r.diff_vs_baseline.low:+.4f}, {r.diff_vs_baseline.high:+.4f}]"
        )
        iqm = "—" if r.iqm is None else f"{r.iqm.mean:.4f} [{r.iqm.low:.4f}, {r.iqm.high:.4f}]"
        poi = "—" if r.p_improve is None else f"{r.p_improve.mean:.2f} [{r.p_improve.low:.2f}, {r.p_improve.high:.2f}]"
        train = "—" if r.train_final is None else f"{r.train_final:.4f}"
        lines.append(f"| {r.arm} | {r.final.n} | {r.final} | {train} | {iqm} | {diff} | {poi} |")
    lines += [
        "",
        f"| arm | step reaching {baseline}'s final | tokens sampled (M) then | train min then "
        f"| tokens sampled / in loss (M) | fresh questions | train min | diff vs {baseline} at equal tokens "
        "(each seed's pair at its own budget; paired, 95% CI; median budget) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        reach = within if r.steps_to_baseline_final is None else f"{r.steps_to_baseline_final:g}"
        if r.steps_to_baseline_final is None:
            tokens = then = "—"
        else:
            tokens = "—" if r.tokens_to_baseline_final is None else f"{r.tokens_to_baseline_final / 1e6:.2f}"
            then = _minutes(r.seconds_to_baseline_final)
        compute = "—" if r.rollout_tokens is None else f"{r.rollout_tokens / 1e6:.2f} / {(r.grad_tokens or 0) / 1e6:.2f}"
        fresh = "—" if r.fresh_questions is None else f"{r.fresh_questions:,.0f}"
        e = r.diff_at_equal_tokens
        at = "—" if e is None or r.equal_tokens is None else (
            f"{e.mean:+.4f} {'(one seed, no interval)' if e.n < 2 else f'[{e.low:+.4f}, {e.high:+.4f}]'} "
            f"at {r.equal_tokens / 1e6:.2f} M")
        lines.append(f"| {r.arm} | {reach} | {tokens} | {then} | {compute} | {fresh} | {_minutes(r.train_seconds)} | {at} |")
    n = max((r.final.n for r in rows), default=0)
    lines += [
        "",
        f"- final {metric}: the metric at each run's last step; mean over {n} seeds ± a Student-t 95% CI.",
        "- train acc.: greedy accuracy on a fixed sample of training questions at the last evaluation, mean over "
        "seeds (its gap to held-out accuracy is memorisation; — where the backend does not measure it).",
        "- IQM: the interquartile mean over seeds (middle 50% of runs), a percentile-bootstrap 95% CI "
        "(10,000 resamples of the runs; rliable's convention, built on scipy.stats).",
        f"- diff vs {baseline}: the arm minus {baseline} on the same seed, averaged; a Student-t 95% CI of the paired differences.",
        f"- P(> {baseline}): the probability that a run of the arm ends above a run of {baseline} (ties count "
        "half; the Mann-Whitney U over all run pairs), a percentile-bootstrap 95% CI; 0.5 means no difference.",
        f"- step reaching {baseline}'s final: the median over all seeds of the first evaluation at which the arm "
        f"reaches {baseline}'s mean final value ({baseline} itself included), a seed that never does counted as beyond "
        "the horizon; tokens sampled and train min then: the same median read in the response tokens the run had "
        "sampled and the training minutes it had spent by then (the comparison at equal compute).",
        "- tokens sampled / in loss: response tokens the rollouts generated over a run, and those the "
        "loss saw (a replayed trajectory and a replay term's stored responses are in the loss but were not "
        "sampled again); mean over seeds, millions.",
        "- fresh questions: questions drawn from the training set over a run (replay takes some of a batch's "
        "places); train min: the run's training steps' wall time (evaluations excluded); means over seeds.",
        f"- diff vs {baseline} at equal tokens: each seed's two runs' {metric} read at the same number of sampled "
        f"response tokens (the fewer that either of the two spent in all; the median over seeds shown, M), "
        f"interpolated linearly between evaluations; the arm minus {baseline} on the same seed, averaged, with a "
        f"Student-t 95% CI of the paired differences.",
        "",
        verdict(rows, metric, baseline),
    ]
    return "\n".join(lines)


def run_description(rows: list[ArmSummary], metric: str, baseline: str, run_id: str) -> str:
    """The comparison as an MLflow run's description: four columns, which MLflow's run page (a
    half-width panel) shows whole, the verdict, and where the full table is."""
    lines = [f"| arm | seeds | final {metric} (mean ± 95% CI) | diff vs {baseline} [95% CI] |", "|---|---|---|---|"]
    for r in rows:
        d = r.diff_vs_baseline
        diff = "baseline" if r.arm == baseline else "—" if d is None else f"{d.mean:+.4f} [{d.low:+.4f}, {d.high:+.4f}]"
        lines.append(f"| {r.arm} | {r.final.n} | {r.final} | {diff} |")
    return "\n".join([*lines, "", verdict(rows, metric, baseline), "",
                      "The full table (train accuracy, IQM, P(> baseline), steps, tokens) and its legend: "
                      f"comparison.md under Artifacts; curves: `exgrpo dashboard --run-id {run_id}`."])


def verdict(rows: list[ArmSummary], metric: str, baseline: str) -> str:
    """One sentence per non-baseline arm: ahead or behind, by how much, and whether the CI excludes zero."""
    out = []
    for r in rows:
        d = r.diff_vs_baseline
        if r.arm == baseline or d is None:
            continue
        side = "ahead of" if d.mean > 0 else "behind" if d.mean < 0 else "level with"
        if d.n < 2:
            sure = "one seed gives no interval, so no difference can be claimed (use --seeds 2 or more)"
        elif d.low > 0 or d.high < 0:
            sure = "the 95% CI excludes zero"
        else:
            sure = "the 95% CI includes zero, so no difference can be claimed"
        out.append(f"{r.arm} is {side} {baseline} by {abs(d.mean):.4f} in final {metric} over {d.n} paired seed{'s' if d.n != 1 else ''}; {sure}.")
    return " ".join(out) if out else f"Only {baseline} has results."
