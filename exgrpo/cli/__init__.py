"""The ``exgrpo`` command: train one run, compare algorithms over seeds, list config fields."""

from __future__ import annotations

import argparse
import errno
import json
import sys
import textwrap
from typing import Any

from exgrpo.cli import compare as _compare
from exgrpo.cli import eval as _eval
from exgrpo.cli.common import RAY_ADDRESS_HELP, FlowMissing, load_flow as _load_flow, secrets_by_environment
from exgrpo.cli.signals import Terminated, disarm, install_stop_handlers
from exgrpo.errors import UserError, one_line, redact_uri

# Each command imports what it runs inside its function: `exgrpo --help`, `--version` and a bad config's
# one-line error stay free of torch, Ray, MLflow and Prefect. This package's modules import only the
# standard library and one another, so a Ctrl-C in a command's first second lands in `main`, which ends it
# with one line. `compare` and `eval` have modules of their own (exgrpo.cli.compare, exgrpo.cli.eval).


def _fields_epilog() -> str:
    from exgrpo.config import field_docs, resume_safe_fields

    lines = ["config fields (override any with --set FIELD=VALUE; [resume-safe]: may differ on --resume):"]
    safe = resume_safe_fields()
    for name, default, doc in field_docs():
        lines.append(f"  {name} = {default}" + ("   [resume-safe]" if name in safe else ""))
        lines += textwrap.wrap(doc, 96, initial_indent="      ", subsequent_indent="      ")
    return "\n".join(lines)


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
                     force_resume=args.force_resume, tracked=not args.no_tracking, progress=not args.no_progress,
                     on_start=_say_started(args.tracking_uri))
    if args.no_tracking:
        result, record = run, {}
    else:
        from exgrpo.tracking.mlflow_tracking import run_link

        result, record = run.result, {"mlflow_run_id": run.run_id, **run_link(run.url, args.tracking_uri)}
    final = {k: v for k, v in result.final_metrics.items() if k.startswith(("val/", "train/accuracy", "pool/", "batch/solved"))}
    print(json.dumps({"run_dir": str(result.run_dir), "checkpoint": str(result.checkpoint), **record, **final}, indent=2))
    return 0


def _say_started(tracking_uri: str | None):
    """``on_start`` of ``exgrpo train``: the line naming the MLflow run, its store (the password hidden)
    and its link (or the command that would serve it) as soon as the run exists, so that a run killed
    before its end can be found."""

    def started(run_id: str) -> None:
        from exgrpo.tracking.mlflow_tracking import Tracker, resolve_tracking_uri, run_url, ui_command, ui_note

        uri = resolve_tracking_uri(tracking_uri)
        link = ui_note(uri)  # where nothing serves the store: the command that does, not a dead link
        if ui_command(uri) is None:
            try:
                experiment_id = Tracker(uri, check=False).client.get_run(run_id).info.experiment_id
                link = f": {run_url(experiment_id, run_id, uri)}{link}"
            except Exception:  # noqa: BLE001 - the run and its store are named all the same; the run goes on
                pass
        print(f"MLflow run {run_id} in {redact_uri(uri)}{link}", flush=True)

    return started


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
    from exgrpo.tracking.mlflow_tracking import check_reachable, resolve_tracking_uri

    check_cluster(cluster_address(args.ray_address), args.tracking_uri,
                  resolve_storage(args.storage or sc.study.storage))  # before Prefect starts
    check_reachable(resolve_tracking_uri(args.tracking_uri))  # so is the store, before any trial
    try:
        if args.no_prefect:
            from exgrpo.sweep import run_sweep

            res = run_sweep(sc, storage=args.storage, tracking_uri=args.tracking_uri, ray_address=args.ray_address,
                            n_trials=args.n_trials,
                            on_trial=lambda o: print(f"  trial {o['number']}: {o['state']} {o.get('value')}"
                                                     f" {o.get('error') or ''}",
                                                     flush=True))
            print(res.table())
            print(json.dumps({"study": res.study_name, "storage": redact_uri(res.storage), "best_value": res.best_value,
                              "best_params": res.best_params, "counts": res.counts, "champion": res.champion,
                              "mlflow_parent_run_id": res.parent_run_id}, indent=2, default=str))
            return 0
        flow = _load_flow("sweep", "sweep_flow")
        storage, given = args.storage, args.storage or overrides.get("study.storage")
        with secrets_by_environment() as hide:
            if given is not None and hide(given, "EXGRPO_OPTUNA_STORAGE") is None:
                # a storage with a password: the flow reads it from the environment, where neither the
                # sweep file's storage nor a parameter may take its place
                storage, overrides = None, {**overrides, "study.storage": None}
            out = flow(config=str(args.config), n_trials=args.n_trials, overrides=overrides, storage=storage,
                       tracking_uri=hide(args.tracking_uri, "MLFLOW_TRACKING_URI"), ray_address=args.ray_address)
        print(json.dumps({k: v for k, v in out.items() if k != "trials"}, indent=2, default=str))
        return 0
    except (TrackingError, FlowMissing) as e:
        print(f"error: {redact_uri(str(e))}", file=sys.stderr)
        return 2


def _cmd_sync(args: argparse.Namespace) -> int:
    from exgrpo.tracking.run_record import end_if_orphaned, recorded_runs
    from exgrpo.launch import sync_pending
    from exgrpo.tracking.sync import pending_runs

    dirs = [d for p in args.paths for d in pending_runs(p)]
    recorded = [d for p in args.paths for d in recorded_runs(p) if d not in dirs]
    failed = done = 0
    for d in dirs:
        try:
            print(f"{d}: {sync_pending(d)}")
            done += 1
        except Exception as e:  # noqa: BLE001 - one line per run; the others still sync
            failed += 1
            print(f"error: {d}: {one_line(e)}", file=sys.stderr)
    for d in recorded:  # runs MLflow shows RUNNING whose process is gone (killed)
        try:
            line = end_if_orphaned(d)
        except Exception as e:  # noqa: BLE001
            failed += 1
            print(f"error: {d}: {one_line(e)}", file=sys.stderr)
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
        print(f"error: {redact_uri(str(e))}", file=sys.stderr)
        return 2
    return 0


def _cmd_ui(args: argparse.Namespace) -> int:
    from exgrpo.ui import main as ui_main

    try:
        return ui_main(args.host, args.prefect_port, args.mlflow_port, args.optuna_port, args.tracking_uri,
                       args.storage)
    except RuntimeError as e:  # a missing tool or app, a port in use, a service that would not start
        print(f"error: {e}", file=sys.stderr)
        return 2


def _cmd_dashboard(args: argparse.Namespace) -> int:
    from exgrpo.dashboard.cli import run

    return run(args)


def build_parser() -> argparse.ArgumentParser:
    from exgrpo import __version__

    p = argparse.ArgumentParser(prog="exgrpo", description="ExGRPO Lab: GRPO with experience replay.")
    p.add_argument("--version", action="version", version=f"exgrpo {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    fmt = argparse.RawDescriptionHelpFormatter
    for add in (_add_train, _compare.add_parser, _add_sweep, _add_ui, _add_dashboard, _eval.add_parser, _add_sync,
                _add_runs, _add_doctor, _add_gpu_smoke, _add_config):  # the order of `exgrpo --help`
        add(sub, fmt)
    return p


def _add_train(sub: Any, fmt: type[argparse.HelpFormatter]) -> None:
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


def _add_sweep(sub: Any, fmt: type[argparse.HelpFormatter]) -> None:
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


def _add_ui(sub: Any, fmt: type[argparse.HelpFormatter]) -> None:
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


def _add_dashboard(sub: Any, fmt: type[argparse.HelpFormatter]) -> None:
    from exgrpo.dashboard.cli import add_arguments as _dashboard_arguments

    d = sub.add_parser("dashboard", help="HTML report of a compare or sweep run, served on 127.0.0.1 (or --out FILE)",
                       description="Build the comparison report of a compare parent run (learning curves with 95% CI "
                       "bands, final table, pool dynamics) or the sweep report of a study (trials, importances, best "
                       "configuration, history) from MLflow, log it on the parent run as dashboards/<kind>.html, and "
                       "serve it on 127.0.0.1 (Ctrl-C stops) or write it with --out.")
    _dashboard_arguments(d)
    d.set_defaults(fn=_cmd_dashboard)


def _add_sync(sub: Any, fmt: type[argparse.HelpFormatter]) -> None:
    y = sub.add_parser("sync", help="finish in MLflow the runs an outage or a kill left behind",
                       description="Replays what MLflow lacks from each run's metrics.jsonl and sets its final "
                       "status, for every run directory holding mlflow_pending.json under PATH; ends KILLED every "
                       "run MLflow still shows RUNNING whose process is gone (mlflow_run.json names it).")
    y.add_argument("paths", nargs="*", default=["runs"], help="run directories or roots to search (default: runs/)")
    y.set_defaults(fn=_cmd_sync)


def _add_runs(sub: Any, fmt: type[argparse.HelpFormatter]) -> None:
    r = sub.add_parser("runs", help="list recent runs, comparisons and sweeps from MLflow (newest first)",
                       description="One line per top-level MLflow run: start time, experiment, name, kind "
                       "(run | compare | sweep), status, run id and the headline result.")
    r.add_argument("--experiment", help="only this MLflow experiment (default: every experiment)")
    r.add_argument("-n", "--limit", type=int, default=20, help="how many (default 20)")
    r.add_argument("--tracking-uri", help="MLflow store (default: MLFLOW_TRACKING_URI, else <project>/mlruns/mlflow.db)")
    r.set_defaults(fn=_cmd_runs)


def _add_doctor(sub: Any, fmt: type[argparse.HelpFormatter]) -> None:
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


def _add_gpu_smoke(sub: Any, fmt: type[argparse.HelpFormatter]) -> None:
    what = ("Train a random Qwen2 (or --model) with experiments/gpu-smoke.yaml for 2 steps, resume to step 3, "
            "score the checkpoint with exgrpo eval, and print one line per path only CUDA takes (vLLM's sleep mode, "
            "the CUDA IPC weight sync, FSDP in bf16, NCCL) and for the checkpoint, the resume and the evaluation. "
            "Exit 1 when a path did not run as it should (docs/gpu.md, \"First contact\").")
    s = sub.add_parser("gpu-smoke", help="a GPU node's first contact: 2 veRL steps on vLLM, a resume, an eval",
                       description=what)
    s.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cuda (default), or cpu: the same on the CPU job environment, each path in its CPU form")
    s.add_argument("--model", help="an HF model directory to train (default: a random Qwen2 written under --output-dir; e.g. your Qwen2.5-0.5B)")
    s.add_argument("--python", help="the job environment's interpreter (default: .venv-gpu/bin/python on cuda, "
                   ".venv-job/bin/python on cpu)")
    s.add_argument("--output-dir", help="where the model, questions, runs and smoke.log go (default: runs/gpu-smoke)")
    s.set_defaults(fn=_cmd_gpu_smoke)


def _cmd_gpu_smoke(args: argparse.Namespace) -> int:
    from pathlib import Path

    from exgrpo.gpu_smoke import smoke

    return smoke(args.device, Path(args.model).resolve() if args.model else None, args.python,
                 Path(args.output_dir).resolve() if args.output_dir else None, echo=lambda x: print(x, flush=True))


def _add_config(sub: Any, fmt: type[argparse.HelpFormatter]) -> None:
    g = sub.add_parser("config", help="print every config field with its doc, or a resolved config",
                       description="Without CONFIG, list every config field with its default and doc (as `exgrpo "
                       "train --help` does). With CONFIG, print the config it resolves to, as JSON, after --set.")
    g.add_argument("config", nargs="?", help="experiment YAML, or comparison YAML (one arm, see --arm), to resolve "
                   "(default: list the fields instead)")
    g.add_argument("--arm", help="with a comparison YAML: the arm to resolve (default: its first arm, named on stderr)")
    g.add_argument("--set", action="append", metavar="FIELD=VALUE",
                   help="override a config field (repeatable; default: none, the file's values)")
    g.set_defaults(fn=_cmd_config)


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
    with status 130 and one line, "interrupted", on stderr; SIGTERM, with 143 and "terminated" (Ray,
    once a command starts it, handles SIGTERM itself and stops its cluster)."""
    install_stop_handlers()
    try:
        return _main(argv)
    except Terminated:
        print("terminated", file=sys.stderr, flush=True)
        return 143
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr, flush=True)
        return 130
    except Exception:  # unexpected: the traceback as Python prints it, but a store's password hidden in it
        import traceback

        print(redact_uri(traceback.format_exc()), file=sys.stderr, end="", flush=True)
        return 1
    finally:
        disarm()


def _main(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    from exgrpo.runs import ResumeMismatch

    try:
        return args.fn(args)
    except (UserError, ResumeMismatch) as e:  # a config, a cluster, a store, ...: the message is the whole story
        print(f"error: {redact_uri(str(e))}", file=sys.stderr)
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

