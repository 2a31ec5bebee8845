"""``exgrpo eval``: score a checkpoint on benchmarks and log the scores to its run's MLflow record.

Standard library only at import time (``exgrpo --help`` stays light): the command imports what it
runs when it runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def add_parser(sub: Any, fmt: type[argparse.HelpFormatter]) -> None:
    """The ``eval`` subcommand's arguments."""
    e = sub.add_parser("eval", help="evaluate a checkpoint on benchmarks",
                       description="Score a checkpoint: avg@n and unbiased pass@k per benchmark, each with its "
                       "sampling settings. 'val' is the run's own held-out split and 'train' its training probe; gsm8k, math500, arith, ... come "
                       "from the benchmark registry (LM tiers only). A veRL checkpoint of an external HF model "
                       "(policy.path, or backend.verl.model_path) is merged into an HF directory and scored with the job environment's "
                       "vLLM. The scores go to the run's MLflow record as eval/<benchmark>/<metric>.")
    e.add_argument("--checkpoint", required=True,
                   help="a runs/<name>/seed<k>/checkpoints/step_*.pt file, a veRL run's checkpoints/global_step_N "
                        "directory, or a registered one: "
                        "models:/exgrpo-<study>@champion (a sweep's best) or models:/<name>/<version>")
    e.add_argument("--tracking-uri", help="MLflow store for models:/ checkpoints (default: MLFLOW_TRACKING_URI, "
                                          "else <project>/mlruns/mlflow.db)")
    e.add_argument("--benchmarks", help="comma list, NAME[:N] for an N-problem subset; val and train are the run's "
                                        "held-out split and training probe (default: as the run evaluates: val,train, "
                                        "or val for an external HF model)")
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
                                    "directory holds the checkpoint, else a new run tagged kind=evaluate)")
    e.add_argument("--no-tracking", action="store_true", help="do not log the scores to MLflow")
    e.set_defaults(fn=run)


def run(args: argparse.Namespace) -> int:
    """``exgrpo eval``: the checkpoint's scores printed, written with ``--json``, logged to its run."""
    from exgrpo.evaluation.metrics import EvalSettings
    from exgrpo.evaluation.runner import format_scores

    settings = EvalSettings(n=args.n, temperature=args.temperature, top_p=args.top_p,
                            max_tokens=args.max_tokens, seed=args.seed)
    try:
        from exgrpo.recorded_eval import evaluate_into_run, score_named

        where = dict(tracking_uri=args.tracking_uri, workers=args.workers, python=args.python)
        if args.no_tracking:
            recorded, scores = None, score_named(args.checkpoint, args.benchmarks, settings, **where)[0].scores
        else:
            recorded = evaluate_into_run(args.checkpoint, args.benchmarks, settings, run_id=args.run_id, **where)
            scores = recorded.evaluation.scores
    except (FileNotFoundError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:  # the job environment's vLLM failed
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(format_scores(scores))
    if args.json:
        from exgrpo.atomic import write_text_atomic

        write_text_atomic(args.json, json.dumps([s.to_dict() for s in scores], indent=2))
    if recorded is not None:
        where = "a new run of its own" if recorded.new_run else "MLflow run"
        print(f"logged {len(recorded.logged)} eval/* metrics at step {recorded.evaluation.step} to {where} "
              f"{recorded.run_id} ({recorded.tracking_uri})")
    return 0
