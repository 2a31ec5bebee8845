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
                       "vLLM. The scores are printed (and written with --json) first, then logged to the run's MLflow "
                       "record: as eval/<benchmark>/<metric> with the run's own settings (greedy, one sample, the "
                       "policy's budget, whole sets), else under names that carry the settings, e.g. "
                       "eval/val/pass_at_1/n4-t0.7-seed0; each evaluation a record of its own. A log that fails "
                       "(the store down, or without the run) waits on disk for `exgrpo sync`.")
    e.add_argument("--checkpoint", required=True,
                   help="a runs/<name>/seed<k>/checkpoints/step_*.pt file, a veRL run's checkpoints/global_step_N "
                        "directory, or a registered one: "
                        "models:/exgrpo-<study>@champion (a sweep's best) or models:/<name>/<version>")
    e.add_argument("--tracking-uri", help="MLflow store to log into and to fetch models:/ checkpoints from (default: "
                                          "the store the checkpoint's run directory records, else MLFLOW_TRACKING_URI, "
                                          "else <project>/mlruns/mlflow.db)")
    e.add_argument("--benchmarks", help="comma list, NAME[:N] for an N-problem subset, drawn by --seed (the first N "
                                        "of a seeded permutation, in the set's order: N:32 is within N:64); val and "
                                        "train are the run's held-out split and training probe (default: as the run "
                                        "evaluates: val,train, or val for an external HF model)")
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
    e.add_argument("--no-tracking", action="store_true", help="only print (and write) the scores: nothing to MLflow")
    e.set_defaults(fn=run)


def run(args: argparse.Namespace) -> int:
    """``exgrpo eval``: the checkpoint's scores printed, written with ``--json``, then logged to its run."""
    from exgrpo.evaluation.metrics import EvalSettings
    from exgrpo.evaluation.runner import format_scores

    settings = EvalSettings(n=args.n, temperature=args.temperature, top_p=args.top_p,
                            max_tokens=args.max_tokens, seed=args.seed)
    from exgrpo.errors import UserError, redact_uri

    try:
        from exgrpo.recorded_eval import score_named

        done, found = score_named(args.checkpoint, args.benchmarks, settings, tracking_uri=args.tracking_uri,
                                  workers=args.workers, python=args.python)
    except (FileNotFoundError, ValueError, KeyError, UserError) as e:  # a store that cannot serve models:/ too
        print(f"error: {redact_uri(str(e))}", file=sys.stderr)
        return 2
    except RuntimeError as e:  # the job environment's vLLM failed
        print(f"error: {redact_uri(str(e))}", file=sys.stderr)
        return 1
    # the scores are the user's before MLflow is asked: a store that is down or lost the run cannot take them
    print(format_scores(done.scores), flush=True)
    if args.json:
        from exgrpo.atomic import write_text_atomic

        write_text_atomic(args.json, json.dumps([s.to_dict() for s in done.scores], indent=2))
    if args.no_tracking:
        return 0
    from exgrpo.recorded_eval import record_evaluation

    recorded = record_evaluation(done, args.checkpoint, found, run_id=args.run_id, tracking_uri=args.tracking_uri)
    if recorded.note:
        print(redact_uri(recorded.note), file=sys.stderr)
    print(redact_uri(_logged_line(recorded)), file=sys.stderr if recorded.pending else sys.stdout)
    return 0


def _logged_line(recorded) -> str:
    """Where the scores went: logged, held already, or waiting for ``exgrpo sync``."""
    step, uri = recorded.evaluation.step, recorded.tracking_uri
    if recorded.pending is not None:
        into = f"run {recorded.run_id}" if recorded.run_id else "a new run of its own"
        return (f"note: the scores are not in MLflow ({recorded.error}); `exgrpo sync {recorded.pending}` logs "
                f"them into {into} of {uri} once it can (--no-tracking: score without logging)")
    if recorded.new_run:
        return f"logged {len(recorded.logged)} eval/* metrics at step {step} to a new run of its own {recorded.run_id} ({uri})"
    where = f"MLflow run {recorded.run_id} ({uri})"
    if not recorded.logged:
        return f"{where} already holds these {len(recorded.held)} eval/* metrics at step {step}: nothing logged again"
    line = f"logged {len(recorded.logged)} eval/* metrics at step {step} to {where}"
    return line + (f"; it already held the other {len(recorded.held)}" if recorded.held else "")
