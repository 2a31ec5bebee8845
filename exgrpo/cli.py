"""The ``exgrpo`` command: train one run, compare algorithms over seeds, list config fields."""

from __future__ import annotations

import argparse
import errno
import json
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the module imports the standard library alone (see below)
    from exgrpo.config import CompareConfig

# Each command imports what it runs inside its function: `exgrpo --help`, `--version` and a bad config's
# one-line error stay free of torch, Ray, MLflow and Prefect. This module itself imports only the standard
# library, so a Ctrl-C in a command's first second lands in `main`, which ends it with one line.


def _fields_epilog() -> str:
    from exgrpo.config import field_docs, resume_safe_fields

    lines = ["config fields (override any with --set FIELD=VALUE; [resume-safe]: may differ on --resume):"]
    safe = resume_safe_fields()
    for name, default, doc in field_docs():
        lines.append(f"  {name} = {default}" + ("   [resume-safe]" if name in safe else ""))
        lines += textwrap.wrap(doc, 96, initial_indent="      ", subsequent_indent="      ")
    return "\n".join(lines)


def _load_flow(module: str, name: str):
    """Flow ``name`` of the installed ``flows`` package (``flows/<module>.py``), to run on the project's
    Prefect home and API (:mod:`exgrpo.prefect_home`: what ``exgrpo ui`` shows) with the settings it
    needs on these machines unless the environment already sets them. A missing flow is a one-line
    error, never a silent fallback."""
    import importlib

    from exgrpo.prefect_home import use_prefect_home

    use_prefect_home()  # before Prefect is imported: it reads its settings then
    try:
        return getattr(importlib.import_module(f"flows.{module}"), name)
    except (ImportError, AttributeError) as e:
        raise FlowMissing(
            f"the Prefect flow flows/{module}.py:{name} cannot be loaded ({e}); reinstall with `make venv`, "
            "or pass --no-prefect to run without Prefect"
        ) from e


RAY_ADDRESS_HELP = ("Ray cluster to run on, e.g. 10.0.0.5:6379 (default: RAY_ADDRESS, else a private local Ray); "
                    "needs RAY_AUTH_TOKEN for a token-auth cluster and an MLflow server every node reaches")


class FlowMissing(RuntimeError):
    """A Prefect flow of the ``flows`` package cannot be imported."""


def _run_config(path: str | None, overrides: dict, arm: str | None):
    """The config ``exgrpo train`` (or ``config``, ``doctor``) runs: an experiment file's, or one arm of a
    comparison file, whose arm is said in one line on stderr (:func:`exgrpo.config.load_run`)."""
    from exgrpo.config import load_run

    cfg, note = load_run(path, overrides, arm, option="--arm")
    if note is not None:
        print(note, file=sys.stderr, flush=True)
    return cfg


def _cmd_train(args: argparse.Namespace) -> int:
    from exgrpo.config import parse_set

    overrides = parse_set(args.set)
    if args.seed is not None:
        overrides["seed"] = args.seed
    if args.max_steps is not None:
        overrides["train.max_steps"] = args.max_steps
    if args.output_dir is not None:
        overrides["output_dir"] = args.output_dir
    cfg = _run_config(args.config, overrides, args.arm)  # fails here, before any work, on bad input
    from exgrpo.launch import launch_run

    run = launch_run(cfg, tracking_uri=args.tracking_uri, ray_address=args.ray_address, resume=args.resume,
                     force_resume=args.force_resume, tracked=not args.no_tracking, progress=not args.no_progress)
    if args.no_tracking:
        result, record = run, {}
    else:
        result, record = run.result, {"mlflow_run_id": run.run_id, "mlflow_url": run.url}
    final = {k: v for k, v in result.final_metrics.items() if k.startswith(("val/", "train/accuracy", "pool/", "batch/solved"))}
    print(json.dumps({"run_dir": str(result.run_dir), "checkpoint": str(result.checkpoint), **record, **final}, indent=2))
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    from exgrpo.config import ConfigError, load_compare, parse_set

    overrides = parse_set(args.set)
    if args.output_dir is not None:
        overrides["output_dir"] = str(Path(args.output_dir).resolve())
    cc = load_compare(args.config, overrides)  # fails here, before any work, on bad input
    if args.adaptive and args.seeds is not None:
        raise ConfigError(f"--seeds {args.seeds}: an adaptive comparison chooses its seeds stage by stage; set the "
                          "first with --set adaptive.first_seed=N (and adaptive.seeds_per_stage, adaptive.max_stages)")
    cc = cc.select(args.arms, args.seeds)
    from exgrpo.cluster import check_cluster, cluster_address
    from exgrpo.compare import RunOutcome, format_table, summarize
    from exgrpo.report import comparison_figure, mechanism_figure
    from exgrpo.tracking import TrackingError

    if args.no_prefect and cluster_address(args.ray_address) is not None:
        raise ConfigError("--ray-address (or RAY_ADDRESS) runs on Ray, --no-prefect in local processes: drop one")
    check_cluster(cluster_address(args.ray_address), args.tracking_uri)  # before Prefect starts
    decisions, failed = None, []
    if args.no_prefect:
        outcomes, failed, decisions = _compare_locally(cc, args)
    else:
        try:
            flow = _load_flow("compare", "compare_flow")
            out = flow(config=str(args.config), seeds=args.seeds, arms=args.arms, overrides=overrides,
                       tracking_uri=args.tracking_uri, executor="ray", workers=args.workers, resume=args.resume,
                       ray_address=args.ray_address, adaptive=args.adaptive)
        except (TrackingError, FlowMissing) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        outcomes = [RunOutcome(**o) for o in out["outcomes"]]
        if out.get("adaptive") is not None:
            from exgrpo.compare.adaptive import decide, finals_of, format_decisions

            decisions = format_decisions(decide(cc, finals_of(outcomes)), cc)
        from exgrpo.tracking.mlflow_tracking import run_url, ui_note

        print(f"MLflow parent run: {run_url(out['experiment_id'], out['parent_run_id'], args.tracking_uri)}"
              f"{ui_note(args.tracking_uri)}\nits report: `exgrpo dashboard --run-id {out['parent_run_id']}`")
    rows = summarize(outcomes, list(cc.arms), cc.baseline)
    horizon = max((o.curve_steps[-1] for o in outcomes if o.curve_steps), default=None)
    print(format_table(rows, cc.metric, cc.baseline, horizon))
    if decisions is not None:
        print(f"\nSequential test (adaptive seeds):\n{decisions}")
    report = Path(args.report or cc.base_config().output_dir / cc.name / "comparison.png")
    print(f"report: {comparison_figure(outcomes, list(cc.arms), cc.metric, report)}")
    print(f"why: {mechanism_figure(outcomes, list(cc.arms), report.with_name(report.stem + '-mechanism.png'))}")
    if args.json:
        Path(args.json).write_text(json.dumps([o.__dict__ for o in outcomes], indent=2))
    if failed:
        print(f"error: {len(failed)} run(s) failed, the statistics cover the others: {'; '.join(failed)}", file=sys.stderr)
        return 1
    return 0


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

        def stage(state):
            bar.console.print(f"stage {state.stages_done}: " + "; ".join(
                f"{p.arm} vs {p.other} {p.decision}" for p in state.pairs))

        try:
            outcomes, state = run_adaptive(cc, run_stage, on_stage=stage)
        except StageIncomplete as e:  # the failed runs are listed by the caller
            outcomes, state = e.outcomes, e.state
        return outcomes, failed, format_decisions(state, cc)


def _cmd_eval(args: argparse.Namespace) -> int:
    from exgrpo.evaluation.runner import EvalSettings, format_scores, score_checkpoint

    settings = EvalSettings(n=args.n, temperature=args.temperature, top_p=args.top_p,
                            max_tokens=args.max_tokens, seed=args.seed)
    try:
        from exgrpo.tracking.registry import checkpoint_at

        with checkpoint_at(args.checkpoint, args.tracking_uri) as checkpoint:  # a models:/ download: removed after
            done = score_checkpoint(checkpoint, args.benchmarks, settings, workers=args.workers, python=args.python)
            record = None if args.no_tracking else _eval_record(Path(checkpoint), args)
    except (FileNotFoundError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:  # the job environment's vLLM failed
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(format_scores(done.scores))
    if args.json:
        from exgrpo.atomic import write_text_atomic

        write_text_atomic(args.json, json.dumps([s.to_dict() for s in done.scores], indent=2))
    if record is not None:
        from exgrpo.tracking import Tracker
        from exgrpo.tracking.eval_record import log_scores

        uri, run_id = record
        logged = log_scores(Tracker(uri), run_id, done.scores, done.step)
        print(f"logged {len(logged)} eval/* metrics at step {done.step} to MLflow run {run_id} ({uri})")
    return 0


def _eval_record(checkpoint: Path, args: argparse.Namespace) -> tuple[str, str] | None:
    """(tracking URI, run id) the scores of ``checkpoint`` go to: ``--run-id``, else the record of the run
    whose checkpoints/ holds it (a tracked run's directory names its MLflow run); None: not recorded."""
    from exgrpo.tracking.mlflow_tracking import resolve_tracking_uri
    from exgrpo.tracking.run_record import read_record

    if args.run_id:
        return resolve_tracking_uri(args.tracking_uri), args.run_id
    found = read_record(checkpoint.resolve().parent.parent)
    if found is None:
        print(f"note: {checkpoint} is not in a tracked run's directory; the scores are not logged to MLflow "
              "(give --run-id to log them)", file=sys.stderr)
        return None
    return found.tracking_uri, found.run_id


def _cmd_config(args: argparse.Namespace) -> int:
    from exgrpo.config import parse_set

    if args.config:
        print(_run_config(args.config, parse_set(args.set), args.arm).model_dump_json(indent=2))
    else:
        print(_fields_epilog())
    return 0


def _cmd_doctor(args: argparse.Namespace) -> int:
    from exgrpo.config import parse_set
    from exgrpo.doctor import run

    return run(_run_config(args.config, parse_set(args.set), args.arm), args.tracking_uri)


def _cmd_sweep(args: argparse.Namespace) -> int:
    from exgrpo.config import parse_set
    from exgrpo.sweep import load_sweep
    from exgrpo.tracking import TrackingError

    overrides = parse_set(args.set)
    if args.study_name:
        overrides["study.name"] = args.study_name
    sc = load_sweep(args.config, overrides)  # fails here, before any work, on a bad space
    from exgrpo.cluster import check_cluster, cluster_address
    from exgrpo.sweep.space import resolve_storage

    check_cluster(cluster_address(args.ray_address), args.tracking_uri,
                  resolve_storage(args.storage or sc.study.storage))  # before Prefect starts
    try:
        if args.no_prefect:
            from exgrpo.sweep import run_sweep

            res = run_sweep(sc, storage=args.storage, tracking_uri=args.tracking_uri, ray_address=args.ray_address,
                            n_trials=args.n_trials,
                            on_trial=lambda o: print(f"  trial {o['number']}: {o['state']} {o.get('value')}"
                                                     f" {(o.get('error') or '').splitlines()[0] if o.get('error') else ''}",
                                                     flush=True))
            print(res.table())
            print(json.dumps({"study": res.study_name, "storage": res.storage, "best_value": res.best_value,
                              "best_params": res.best_params, "counts": res.counts, "champion": res.champion,
                              "mlflow_parent_run_id": res.parent_run_id}, indent=2, default=str))
            return 0
        flow = _load_flow("sweep", "sweep_flow")
        out = flow(config=str(args.config), n_trials=args.n_trials, overrides=overrides, storage=args.storage,
                   tracking_uri=args.tracking_uri, ray_address=args.ray_address)
        print(json.dumps({k: v for k, v in out.items() if k != "trials"}, indent=2, default=str))
        return 0
    except (TrackingError, FlowMissing) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _cmd_sync(args: argparse.Namespace) -> int:
    from exgrpo.tracking.run_record import end_if_orphaned, recorded_runs
    from exgrpo.tracking.sync import pending_runs, sync_run

    dirs = [d for p in args.paths for d in pending_runs(p)]
    recorded = [d for p in args.paths for d in recorded_runs(p) if d not in dirs]
    failed = done = 0
    for d in dirs:
        try:
            print(f"{d}: {sync_run(d)}")
            done += 1
        except Exception as e:  # noqa: BLE001 - one line per run; the others still sync
            failed += 1
            print(f"error: {d}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", file=sys.stderr)
    for d in recorded:  # runs MLflow shows RUNNING whose process is gone (killed)
        try:
            line = end_if_orphaned(d)
        except Exception as e:  # noqa: BLE001
            failed += 1
            print(f"error: {d}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", file=sys.stderr)
            continue
        if line is not None:
            print(f"{d}: {line}")
            done += 1
    if not done and not failed:
        print(f"nothing to sync under {', '.join(args.paths)}")
    return 1 if failed else 0


def _cmd_runs(args: argparse.Namespace) -> int:
    from exgrpo.tracking import TrackingError
    from exgrpo.tracking.listing import format_runs, recent_runs

    try:
        print(format_runs(recent_runs(args.tracking_uri, args.limit, args.experiment)))
    except (TrackingError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def _cmd_ui(args: argparse.Namespace) -> int:
    from exgrpo.ui import main as ui_main

    return ui_main(args.host, args.prefect_port, args.mlflow_port, args.optuna_port, args.tracking_uri, args.storage)


def _cmd_dashboard(args: argparse.Namespace) -> int:
    from exgrpo.dashboard.cli import run

    return run(args)


def build_parser() -> argparse.ArgumentParser:
    from exgrpo import __version__

    p = argparse.ArgumentParser(prog="exgrpo", description="ExGRPO Lab: GRPO with experience replay.")
    p.add_argument("--version", action="version", version=f"exgrpo {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    fmt = argparse.RawDescriptionHelpFormatter

    t = sub.add_parser("train", help="train one run", formatter_class=fmt, epilog=_fields_epilog(),
                       description="Train one (config, seed) run with a progress bar and a per-epoch summary. "
                       "Writes metrics.jsonl and checkpoints under OUTPUT_DIR/NAME/seedSEED.")
    t.add_argument("config", nargs="?", help="experiment YAML (e.g. experiments/toy-exgrpo.yaml), or a comparison "
                   "YAML to train one of its arms (see --arm) (default: the built-in defaults, the toy tier)")
    t.add_argument("--arm", help="with a comparison YAML: the arm to train (default: its first arm, named on stderr)")
    t.add_argument("--seed", type=int, help="run seed (model init, sampling, replay) (default: the config's seed; "
                   "a comparison's first seed)")
    t.add_argument("--set", action="append", metavar="FIELD=VALUE",
                   help="override a config field (repeatable; default: none, the file's values)")
    t.add_argument("--resume", action="store_true",
                   help="continue from the latest checkpoint of this run (only fields marked [resume-safe] may differ)")
    t.add_argument("--force-resume", action="store_true",
                   help="resume even if the config differs from the checkpoint's in fields that change the run")
    t.add_argument("--max-steps", type=int, help="stop after this many steps (same as --set train.max_steps=N; "
                   "default: the config's train.max_steps, else its epochs)")
    t.add_argument("--output-dir", help="root of run directories (default: runs/)")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.add_argument("--tracking-uri", help="MLflow store (default: MLFLOW_TRACKING_URI, else <project>/mlruns/mlflow.db)")
    t.add_argument("--no-tracking", action="store_true", help="record nothing in MLflow (metrics.jsonl only)")
    t.add_argument("--ray-address", help=RAY_ADDRESS_HELP)
    t.set_defaults(fn=_cmd_train)

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
    c.add_argument("--workers", type=int, help="runs trained at once (default: as many as the cores, or the Ray "
                   "cluster, hold at train.threads each)")
    c.add_argument("--set", action="append", metavar="FIELD=VALUE",
                   help="override a base config field (repeatable; default: none, the file's values)")
    c.add_argument("--output-dir", help="root of run directories (default: runs/)")
    c.add_argument("--json", help="also write per-run outcomes to this JSON file (default: not written)")
    c.add_argument("--report", help="comparison figure path (default OUTPUT_DIR/NAME/comparison.png)")
    c.add_argument("--no-progress", action="store_true", help="no progress bar")
    c.add_argument("--tracking-uri", help="MLflow store (default: MLFLOW_TRACKING_URI, else <project>/mlruns/mlflow.db)")
    c.add_argument("--ray-address", help=RAY_ADDRESS_HELP)
    c.add_argument("--no-prefect", action="store_true",
                   help="run in local processes without Prefect and MLflow (default: the Prefect compare flow on "
                        "its local API, runs as Ray tasks, recorded in MLflow)")
    c.set_defaults(fn=_cmd_compare)

    w = sub.add_parser("sweep", help="run or resume an Optuna sweep (trials as Ray tasks, MLflow runs)",
                       description="Run the study of a sweep YAML (e.g. experiments/toy-sweep.yaml) through the "
                       "Prefect sweep flow (on the server of a running `exgrpo ui`, else Prefect's temporary local one, both on "
                       "the project's Prefect home; PREFECT_HOME and PREFECT_API_URL override), or "
                       "directly with --no-prefect. Re-running with the same study name resumes it.")
    w.add_argument("config", help="sweep YAML with study:, base:, budget_steps: and space:")
    w.add_argument("--n-trials", type=int, help="total finished trials of the study (default: the file's)")
    w.add_argument("--study-name", help="same as --set study.name=NAME (default: the file's study.name)")
    w.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override the sweep file: study.*, budget_steps, base.<config field>, space.<field>.<attr> "
                        "(repeatable; default: none, the file's values)")
    w.add_argument("--storage", help="Optuna storage URL (default: the file's, else sqlite:///<project>/studies/optuna.db)")
    w.add_argument("--tracking-uri", help="MLflow tracking URI (default: MLFLOW_TRACKING_URI, else <project>/mlruns/mlflow.db)")
    w.add_argument("--ray-address", help=RAY_ADDRESS_HELP)
    w.add_argument("--no-prefect", action="store_true", help="run the study directly, without a Prefect flow run")
    w.set_defaults(fn=_cmd_sweep)

    u = sub.add_parser("ui", help="start the Prefect, MLflow and Optuna UIs on 127.0.0.1 (Ctrl-C stops all)",
                       description="Serve the three UIs of this project's records until Ctrl-C: Prefect's (flow "
                       "runs, task runs, artifacts), MLflow's (runs, metrics, models) and optuna-dashboard (sweeps). "
                       "Each prints its URL; Ctrl-C stops all three.")
    u.add_argument("--host", default="127.0.0.1", help="address the UIs bind (default 127.0.0.1, loopback only)")
    u.add_argument("--prefect-port", type=int, default=4200, help="port of the Prefect UI and API (default 4200)")
    u.add_argument("--mlflow-port", type=int, default=5000, help="port of the MLflow UI (default 5000)")
    u.add_argument("--optuna-port", type=int, default=8080, help="port of optuna-dashboard (default 8080)")
    u.add_argument("--tracking-uri", help="MLflow store to serve (default: MLFLOW_TRACKING_URI, else <project>/mlruns/mlflow.db)")
    u.add_argument("--storage", help="Optuna storage to serve (default: sqlite:///<project>/studies/optuna.db)")
    u.set_defaults(fn=_cmd_ui)

    from exgrpo.dashboard.cli import add_arguments as _dashboard_arguments

    d = sub.add_parser("dashboard", help="HTML report of a compare or sweep run, served on 127.0.0.1 (or --out FILE)",
                       description="Build the comparison report of a compare parent run (learning curves with 95% CI "
                       "bands, final table, pool dynamics) or the sweep report of a study (trials, importances, best "
                       "configuration, history) from MLflow, log it on the parent run as dashboards/<kind>.html, and "
                       "serve it on 127.0.0.1 (Ctrl-C stops) or write it with --out.")
    _dashboard_arguments(d)
    d.set_defaults(fn=_cmd_dashboard)

    e = sub.add_parser("eval", help="evaluate a checkpoint on benchmarks",
                       description="Score a checkpoint: avg@n and unbiased pass@k per benchmark, each with its "
                       "sampling settings. 'val' is the run's own held-out split; gsm8k, math500, arith, ... come "
                       "from the benchmark registry (LM tiers only). A veRL checkpoint of an external HF model "
                       "(policy.path, or backend.verl.model_path) is merged into an HF directory and scored with the job environment's "
                       "vLLM. The scores go to the run's MLflow record as eval/<benchmark>/<metric>.")
    e.add_argument("--checkpoint", required=True,
                   help="a runs/<name>/seed<k>/checkpoints/step_*.pt file, a veRL run's checkpoints/global_step_N "
                        "directory, or a registered one: "
                        "models:/exgrpo-<study>@champion (a sweep's best) or models:/<name>/<version>")
    e.add_argument("--tracking-uri", help="MLflow store for models:/ checkpoints (default: MLFLOW_TRACKING_URI, "
                                          "else <project>/mlruns/mlflow.db)")
    e.add_argument("--benchmarks", default="val", help="comma list, NAME[:N] for an N-problem subset (default: val)")
    e.add_argument("--n", type=int, default=1, help="samples per problem (default 1)")
    e.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    e.add_argument("--top-p", type=float, default=1.0, help="nucleus mass when sampling (default 1.0: all of it)")
    e.add_argument("--max-tokens", type=int, help="response budget (default: the policy's max_new_tokens)")
    e.add_argument("--seed", type=int, default=0, help="seed of subsets and sampling (default 0)")
    e.add_argument("--workers", type=int, default=2, help="math-verify worker processes (default 2)")
    e.add_argument("--json", help="also write the scores to this JSON file (default: not written)")
    e.add_argument("--python", help="interpreter of the job environment whose vLLM scores an external HF model's "
                                    "checkpoint (default: the run's backend.verl.python, else .venv-job/bin/python)")
    e.add_argument("--run-id", help="MLflow run to log eval/<benchmark>/<metric> into (default: the run whose "
                                    "directory holds the checkpoint)")
    e.add_argument("--no-tracking", action="store_true", help="do not log the scores to MLflow")
    e.set_defaults(fn=_cmd_eval)

    y = sub.add_parser("sync", help="finish in MLflow the runs an outage or a kill left behind",
                       description="Replays what MLflow lacks from each run's metrics.jsonl and sets its final "
                       "status, for every run directory holding mlflow_pending.json under PATH; ends KILLED every "
                       "run MLflow still shows RUNNING whose process is gone (mlflow_run.json names it).")
    y.add_argument("paths", nargs="*", default=["runs"], help="run directories or roots to search (default: runs/)")
    y.set_defaults(fn=_cmd_sync)

    r = sub.add_parser("runs", help="list recent runs, comparisons and sweeps from MLflow (newest first)",
                       description="One line per top-level MLflow run: start time, experiment, name, kind "
                       "(run | compare | sweep), status, run id and the headline result.")
    r.add_argument("--experiment", help="only this MLflow experiment (default: every experiment)")
    r.add_argument("-n", "--limit", type=int, default=20, help="how many (default 20)")
    r.add_argument("--tracking-uri", help="MLflow store (default: MLFLOW_TRACKING_URI, else <project>/mlruns/mlflow.db)")
    r.set_defaults(fn=_cmd_runs)

    h = sub.add_parser("doctor", help="check this machine before a long run: job environment, GPUs, Ray, MLflow",
                       description="One line per finding (ok or PROBLEM) for the run CONFIG describes; exit 1 on a "
                       "problem. Checks the training job's environment (backend.verl.python: veRL, torch, Ray, "
                       "vLLM versions), CUDA GPUs where device=cuda, a configured Ray cluster, the MLflow store.")
    h.add_argument("config", nargs="?", help="experiment or comparison YAML (a comparison: one arm, see --arm) "
                   "(default: the built-in defaults)")
    h.add_argument("--arm", help="with a comparison YAML: the arm to check (default: its first arm, named on stderr)")
    h.add_argument("--set", action="append", metavar="FIELD=VALUE",
                   help="override a config field (repeatable; default: none, the file's values)")
    h.add_argument("--tracking-uri", help="MLflow store (default: MLFLOW_TRACKING_URI, else <project>/mlruns/mlflow.db)")
    h.set_defaults(fn=_cmd_doctor)

    g = sub.add_parser("config", help="print every config field with its doc, or a resolved config",
                       description="Without CONFIG, list every config field with its default and doc (as `exgrpo "
                       "train --help` does). With CONFIG, print the config it resolves to, as JSON, after --set.")
    g.add_argument("config", nargs="?", help="experiment YAML, or comparison YAML (one arm, see --arm), to resolve "
                   "(default: list the fields instead)")
    g.add_argument("--arm", help="with a comparison YAML: the arm to resolve (default: its first arm, named on stderr)")
    g.add_argument("--set", action="append", metavar="FIELD=VALUE",
                   help="override a config field (repeatable; default: none, the file's values)")
    g.set_defaults(fn=_cmd_config)
    return p


_WRITE_ERRORS = {
    errno.ENOSPC: "the disk is full: free space or choose another --output-dir",
    errno.EDQUOT: "the disk quota is used up: free space or choose another --output-dir",
    errno.EFBIG: "a file grew past this system's size limit: choose another --output-dir",
    errno.EACCES: "no permission: choose a writable --output-dir",
    errno.EPERM: "not permitted: choose a writable --output-dir",
    errno.EROFS: "a read-only file system: choose a writable --output-dir",
}
"""Write failures (errno) that end a command with one line instead of a traceback."""


def main(argv: list[str] | None = None) -> int:
    """Run the command of ``argv``; its exit status. Ctrl-C (or a KeyboardInterrupt) at any point ends it
    with status 130 and one line, "interrupted", on stderr."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr, flush=True)
        return 130


def _main(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    from exgrpo.config import ConfigError
    from exgrpo.cluster import ClusterError
    from exgrpo.runs import ResumeMismatch

    try:
        return args.fn(args)
    except (ConfigError, ResumeMismatch, ClusterError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        hint = _WRITE_ERRORS.get(e.errno or 0)
        if hint is None:
            raise
        print(f"error: cannot write {e.filename or 'the run directory'}: {e.strerror} ({hint})", file=sys.stderr)
        return 2
    except RuntimeError as e:  # a failed veRL run: one line with the log path, then its last lines
        if type(e).__name__ != "VerlRunError":
            raise
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
