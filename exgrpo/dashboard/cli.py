"""``exgrpo dashboard``: build a comparison or sweep report, log it on its MLflow parent run, and
serve it on 127.0.0.1 (or write it with --out). Kept import-light: exgrpo.cli builds its parser
from :func:`add_arguments` at start-up."""

from __future__ import annotations

import argparse
import signal
import sys

from exgrpo.dashboard import DashboardError, build_report
from exgrpo.dashboard.server import serve


def add_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_argument_group("what to report (one of)")
    src.add_argument("--run-id", help="a compare or sweep parent run (a child run's id selects its parent) "
                     "(default: none; give one of the three)")
    src.add_argument("--experiment", help="MLflow experiment: its most recent parent run of --kind "
                     "(default: none; give one of the three)")
    src.add_argument("--study", help="Optuna study name (sweep report from the study's storage) "
                     "(default: none; give one of the three)")
    p.add_argument("--kind", choices=("compare", "sweep"), default="compare",
                   help="with --experiment (default compare)")
    p.add_argument("--storage", help="Optuna storage URL (with --study: default sqlite:///<project>/studies/optuna.db; "
                   "with a sweep run: overrides the storage recorded on the run)")
    p.add_argument("--tracking-uri",
                   help="MLflow store (default: MLFLOW_TRACKING_URI, else <project>/mlruns/mlflow.db)")
    p.add_argument("--out", metavar="FILE", help="write the HTML to FILE and exit (no server) (default: serve it)")
    p.add_argument("--port", type=int, default=8090, help="port to serve on (default 8090; 0: any free port)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1, loopback only)")
    p.add_argument("--no-log", action="store_true",
                   help="do not log the HTML on the parent run (default: dashboards/<comparison|sweep>.html artifact)")
    p.add_argument("--live", action="store_true",
                   help="rebuild the report on every page load (watch a compare or sweep in progress)")


def run(args: argparse.Namespace) -> int:
    def build():
        return build_report(args.run_id, tracking_uri=args.tracking_uri, experiment=args.experiment, kind=args.kind,
                            study=args.study, storage=args.storage)

    try:
        report = build()
    except DashboardError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not args.no_log and report.run_id:
        try:
            report.log()
            print(f"logged {report.artifact_path} on MLflow run {report.run_id}", flush=True)
        except Exception as e:  # a read-only store must not stop the report
            print(f"warning: could not log {report.artifact_path} on run {report.run_id}: {e}", file=sys.stderr)
    if args.out:
        print(f"wrote {report.write(args.out)}", flush=True)
        return 0

    page = (lambda: build().html) if args.live else report.html
    name = "/" + report.artifact_path.rsplit("/", 1)[-1]
    pages = {"/": page, "/index.html": page, name: page}

    def _interrupt(signum, frame):  # SIGTERM, and SIGINT even when started in the background
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        serve(pages, args.host, args.port,
              on_ready=lambda url: print(f"{report.title}: serving {url} (Ctrl-C stops)", flush=True))
    except OSError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print("stopped.", flush=True)
    return 0
