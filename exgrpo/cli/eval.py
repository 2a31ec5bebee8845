"""``exgrpo eval``: score a checkpoint on benchmarks and log the scores to its run's MLflow record.

Standard library only at import time (``exgrpo --help`` stays light): the command imports what it
runs when it runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def add_parser(sub: Any, fmt: type[argparse.HelpFormatter]) -> None:
    """The ``eval`` subcommand's arguments."""
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
    e.set_defaults(fn=run)


def run(args: argparse.Namespace) -> int:
    """``exgrpo eval``: the checkpoint's scores printed, written with ``--json``, logged to its run."""
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
