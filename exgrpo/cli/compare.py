"""``exgrpo compare``: train every arm of a comparison over seeds and print its statistics.

Through the Prefect compare flow (MLflow parent and child runs, runs as Ray tasks), or in local
processes with ``--no-prefect``. Standard library only at import time (``exgrpo --help`` stays light):
the command imports what it runs when it runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from exgrpo.atomic import write_text_atomic
from exgrpo.cli.common import RAY_ADDRESS_HELP, FlowMissing, load_flow, secrets_by_environment
from exgrpo.errors import redact_uri

if TYPE_CHECKING:  # annotations only
    from exgrpo.config import CompareConfig


def add_parser(sub: Any, fmt: type[argparse.HelpFormatter]) -> None:
    """The ``compare`` subcommand's arguments."""
    c = sub.add_parser("compare", help="compare algorithms (arms) over seeds",
                       description="Train every arm of a comparison YAML over several seeds and print, per arm, "
                       "the final metric as mean ± 95% CI and the paired difference against the baseline arm. "
                       "Runs the Prefect compare flow (MLflow parent + child runs) unless --no-prefect.")
    c.add_argument("config", help="comparison YAML with base: and arms: (e.g. experiments/toy.yaml)")
    c.add_argument("--seeds", help="use seeds 0..N-1 (N), A..B (A-B) or a,b,c (default: the file's seeds)")
    c.add_argument("--arms", help="run only these arms, a,b,c, the baseline among them (default: every arm of the file)")
    c.add_argument("--resume", action="store_true",
                   help="runs with checkpoints continue from them, finished ones are reused: a killed comparison "
                   "goes on; more --seeds or a larger train.max_steps trains only what is new")
    c.add_argument("--adaptive", action="store_true",
                   help="add seeds in stages until AdaStop's sequential test decides every pair, with the family-wise "
                   "error held (the file's adaptive: section; default: the file's fixed seeds)")
    c.add_argument("--new-test", action="store_true",
                   help="with --adaptive --resume: start a new sequential test over the comparison's runs, with "
                   "other settings (default: a resume keeps the settings the test began with, and refuses others)")
    c.add_argument("--workers", type=int, help="runs trained at once (default: as many as the cores, or the Ray "
                   "cluster, hold at train.threads each)")
    c.add_argument("--set", action="append", metavar="FIELD=VALUE",
                   help="override a base config field (repeatable; default: none, the file's values)")
    c.add_argument("--output-dir", help="root of run directories (default: runs/)")
    c.add_argument("--json", help="also write per-run outcomes to this JSON file (default: not written)")
    c.add_argument("--report", help="also copy the comparison figure here (default: only OUTPUT_DIR/NAME/comparison.png, "
                   "beside comparison-mechanism.png; both on the MLflow parent run too)")
    c.add_argument("--no-progress", action="store_true", help="no progress bar")
    c.add_argument("--tracking-uri", help="MLflow store (default: MLFLOW_TRACKING_URI, else <project>/mlruns/mlflow.db; "
                   "with --no-prefect: none unless given)")
    c.add_argument("--ray-address", help=RAY_ADDRESS_HELP)
    c.add_argument("--no-prefect", action="store_true",
                   help="run in local processes without Prefect, and without MLflow unless --tracking-uri is given "
                        "(default: the Prefect compare flow on its local API, runs as Ray tasks, recorded in MLflow)")
    c.set_defaults(fn=run)


def run(args: argparse.Namespace) -> int:
    """``exgrpo compare``: the arms over seeds, through the Prefect flow or (``--no-prefect``) here; the
    table, the sequential test's decisions, the figures. Exit 1 when a run failed, the others reported."""
    from exgrpo.config import ConfigError, load_compare, parse_set

    overrides = parse_set(args.set)
    if args.output_dir is not None:
        overrides["output_dir"] = str(Path(args.output_dir).resolve())
    cc = load_compare(args.config, overrides)  # fails here, before any work, on bad input
    if args.adaptive and args.seeds is not None:
        raise ConfigError(f"--seeds {args.seeds}: an adaptive comparison chooses its seeds stage by stage; set the "
                          "first with --set adaptive.first_seed=N (and adaptive.seeds_per_stage, adaptive.max_stages)")
    cc = cc.select(args.arms, args.seeds)
    if args.new_test and not args.adaptive:
        raise ConfigError("--new-test starts a new sequential test: it goes with --adaptive --resume")
    if args.adaptive:
        from exgrpo.compare.adaptive_record import check_settings

        check_settings(cc, args.resume, args.new_test)
    from exgrpo.cluster import check_cluster, cluster_address
    from exgrpo.compare import RunOutcome, format_table, summarize
    from exgrpo.tracking import TrackingError

    if args.no_prefect and cluster_address(args.ray_address) is not None:
        raise ConfigError("--ray-address (or RAY_ADDRESS) runs on Ray, --no-prefect in local processes: drop one")
    check_cluster(cluster_address(args.ray_address), args.tracking_uri)  # before Prefect starts
    tracked = not args.no_prefect or args.tracking_uri is not None
    if tracked:  # so is the store, before any run
        from exgrpo.tracking.mlflow_tracking import check_reachable, resolve_tracking_uri

        check_reachable(resolve_tracking_uri(args.tracking_uri))
    failed: list[str] = []
    if args.no_prefect and tracked:
        outcomes, failed, table, figures = _compare_tracked_locally(cc, args)
    elif args.no_prefect:
        from exgrpo.compare.figures import draw_figures

        outcomes, failed, decisions = _compare_locally(cc, args)
        table = format_table(summarize(outcomes, list(cc.arms), cc.baseline), cc.metric, cc.baseline,
                             max((o.curve_steps[-1] for o in outcomes if o.curve_steps), default=None))
        if decisions is not None:
            table += f"\n\nSequential test (adaptive seeds):\n{decisions}"
        base = cc.base_config()
        figures = draw_figures(outcomes, list(cc.arms), cc.metric, Path(base.output_dir) / base.name) if outcomes else {}
    else:
        try:
            flow = load_flow("compare", "compare_flow")
            with secrets_by_environment() as hide:
                out = flow(config=str(args.config), seeds=args.seeds, arms=args.arms, overrides=overrides,
                           tracking_uri=hide(args.tracking_uri, "MLFLOW_TRACKING_URI"), executor="ray",
                           workers=args.workers, resume=args.resume, ray_address=args.ray_address,
                           adaptive=args.adaptive, new_test=args.new_test)
        except (TrackingError, FlowMissing) as e:
            print(f"error: {redact_uri(str(e))}", file=sys.stderr)
            return 2
        # what the flow computed, drew and recorded: the same a Prefect deployment run of it leaves
        outcomes, table, figures = [RunOutcome(**o) for o in out["outcomes"]], out["table"], out["figures"]
        from exgrpo.tracking.mlflow_tracking import run_url, ui_note

        print(f"MLflow parent run: {run_url(out['experiment_id'], out['parent_run_id'], args.tracking_uri)}"
              f"{ui_note(args.tracking_uri)}\nits report: `exgrpo dashboard --run-id {out['parent_run_id']}`")
    print(table)
    if args.report and figures:
        import shutil

        Path(args.report).parent.mkdir(parents=True, exist_ok=True)
        figures = {**figures, "comparison": shutil.copyfile(figures["comparison"], args.report)}
    if figures:
        print(f"report: {figures['comparison']}\nwhy: {figures['mechanism']}")
    if args.json:  # whole or not at all: a stop while writing leaves the file of an earlier comparison intact
        write_text_atomic(args.json, json.dumps([o.__dict__ for o in outcomes], indent=2))
    if failed:
        print(f"error: {len(failed)} run(s) failed, the statistics cover the others: {'; '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def _compare_tracked_locally(cc: CompareConfig, args: argparse.Namespace) -> tuple[list, list[str], str, dict]:
    """``exgrpo compare --no-prefect --tracking-uri URI``: the runs in local processes, recorded in MLflow as
    the Prefect flow records them (a parent run, a child run per (arm, seed)). Returns the outcomes, the
    failed runs (one line each), the table (with the sequential test's decisions) and the figures."""
    from exgrpo.compare import RunOutcome, format_table, summarize
    from exgrpo.compare.figures import draw_figures
    from exgrpo.compare.tracked import run_tracked_compare
    from exgrpo.tracking.mlflow_tracking import ui_note

    outcomes: list[RunOutcome] = []
    failed: list[str] = []

    def done(o: RunOutcome) -> None:
        outcomes.append(o)
        print(f"  {o.arm:>12s} seed {o.seed}: final {cc.metric} = {o.final:.4f}", flush=True)

    def parent(run_id: str, url: str) -> None:  # from the first minute: a killed comparison can be found
        print(f"MLflow parent run: {url}{ui_note(args.tracking_uri)}\nits report: `exgrpo dashboard --run-id {run_id}`",
              flush=True)

    try:
        res = run_tracked_compare(cc, tracking_uri=args.tracking_uri, executor="process", workers=args.workers,
                                  resume=args.resume, adaptive=args.adaptive, new_test=args.new_test,
                                  on_done=done, on_parent=parent,
                                  on_failed=lambda arm, seed, error: failed.append(f"{arm} seed {seed}: {error}"),
                                  on_stage=lambda state: print(f"stage {state.stages_done}: " + "; ".join(
                                      f"{p.arm} vs {p.other} {p.decision}" for p in state.pairs), flush=True))
    except RuntimeError:
        if not failed:
            raise
        # some run failed: the statistics (on the parent run already) cover the others, as without MLflow
        table = format_table(summarize(outcomes, list(cc.arms), cc.baseline), cc.metric, cc.baseline,
                             max((o.curve_steps[-1] for o in outcomes if o.curve_steps), default=None))
        base = cc.base_config()
        figures = draw_figures(outcomes, list(cc.arms), cc.metric, Path(base.output_dir) / base.name) if outcomes else {}
        return outcomes, failed, table, figures
    return res.outcomes, failed, res.table, res.figures


def _compare_locally(cc: CompareConfig, args: argparse.Namespace) -> tuple[list, list[str], str | None]:
    """``exgrpo compare --no-prefect``: the runs in local processes (all seeds, or stages of them with
    ``--adaptive``) under a progress bar. Returns the outcomes, the failed runs (one line each) and
    the sequential test's table (None without ``--adaptive``)."""
    from rich.progress import Progress

    from exgrpo.compare import jobs, prepare_warm_starts, run_local
    from exgrpo.compare.adaptive import StageIncomplete, format_decisions, run_adaptive
    from exgrpo.progress import console

    each = cc.adaptive.seeds_per_stage * cc.adaptive.max_stages if args.adaptive else len(cc.seeds)
    failed: list[str] = []
    with Progress(console=console, disable=args.no_progress) as bar:
        task = bar.add_task(f"{len(cc.arms)} arms x {'at most ' if args.adaptive else ''}{each} seeds",
                            total=len(cc.arms) * each)

        def done(o):
            bar.console.print(f"  {o.arm:>12s} seed {o.seed}: final {cc.metric} = {o.final:.4f}")
            bar.advance(task)

        def run_stage(sub):
            return run_local(sub, workers=args.workers, on_done=done, resume=args.resume,
                             on_failed=lambda arm, seed, error: failed.append(f"{arm} seed {seed}: {error}"))

        prepare_warm_starts((cfg for cfg, _ in jobs(cc)), say=bar.console.print, progress=not args.no_progress)
        if not args.adaptive:
            return run_stage(cc), failed, None

        from exgrpo.compare.adaptive_record import begin

        if (note := begin(cc, args.resume, args.new_test)) is not None:
            bar.console.print(f"note: {note}")

        def stage(state):
            bar.console.print(f"stage {state.stages_done}: " + "; ".join(
                f"{p.arm} vs {p.other} {p.decision}" for p in state.pairs))

        try:
            outcomes, state = run_adaptive(cc, run_stage, on_stage=stage)
        except StageIncomplete as e:  # the failed runs are listed by the caller
            outcomes, state = e.outcomes, e.state
        return outcomes, failed, format_decisions(state, cc)
