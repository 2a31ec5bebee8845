"""A whole SmolLM2 run, this tree against a baseline revision: wall time, peak memory and the step's phases.

    .venv/bin/python bench/bench_run_cost.py [--baseline 7bbbfc3] [--rounds 1] [--max-steps 12 --eval-every 4]
        [--this-set FIELD=VALUE ...]

Each side runs, as a user does, ``exgrpo train experiments/smollm2-secret.yaml --no-tracking`` in its own
process (the run as the file writes it: 48 steps, 7 evaluations; ``--max-steps 12 --eval-every 4`` is the
short run whose peak memory docs/speed.md follows): the baseline from its own tree (``git
archive`` of ``exgrpo/`` and ``experiments/`` at that revision, imported ahead of the installed package),
the working tree as it is. Rounds alternate the two sides, so a load that drifts during the bench weighs on
both. Per run: the wall time, the peak resident memory (``wait4``'s ``ru_maxrss``, the figure ``/usr/bin/time
-v`` prints), the median step and its phases (``time/<phase>_seconds`` in the run's metrics.jsonl) and the
share of the wall time spent in steps (the rest: building the trainer, evaluations, the checkpoint).

The two sides sample the same config and seed but not the same responses (their numerics differ, so the
sampled tokens part after the first step), and a step's cost grows with its sampled tokens. So the ratio is
also given at equal work: this tree's wall time had it sampled the baseline's tokens, ``wall + slope x
(baseline tokens - its tokens)``, the slope being its steps' seconds per sampled token (least squares over
the run's steps after the first). That ratio is the goal's reading; the raw one is printed beside it.

The default baseline, 7bbbfc3, is the tree on which the cost of a SmolLM2 run was first measured (main on
2026-12-06: a 12-step run in 3 m 54 s and 5.6 GB on a 2-core Xeon). Both sides share the converted
SmolLM2 weights (``~/.cache/exgrpo``), so neither pays the one-off conversion inside a round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from summary import record  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("rollout", "old_log_prob", "forward", "backward")


def baseline_tree(rev: str, dest: Path) -> Path:
    """``exgrpo/`` and ``experiments/`` of ``rev``, extracted under ``dest``."""
    dest.mkdir(parents=True)
    got = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "exgrpo", "experiments"], capture_output=True)
    if got.returncode != 0:
        why = (got.stderr.decode(errors="replace").strip().splitlines() or ["git archive failed"])[-1]
        sys.exit(f"bench_run_cost: --baseline {rev}: not a revision of this checkout ({why}); name a commit, "
                 "e.g. 7bbbfc3")
    archive = got.stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def run_once(tree: Path, out: Path, args: argparse.Namespace, sets: Sequence[str] = ()) -> dict:
    """One ``exgrpo train`` from ``tree`` (``sets``: its ``--set FIELD=VALUE``): its wall seconds, peak RSS
    (GiB) and step timings."""
    cmd = [sys.executable, "-c", "from exgrpo.cli import main; main()", "train", args.config,
           "--no-tracking", "--no-progress", "--output-dir", str(out), *(f"--set={s}" for s in sets)]
    if args.max_steps is not None:
        cmd += ["--max-steps", str(args.max_steps)]
    if args.eval_every is not None:
        cmd += ["--set", f"train.eval_every_steps={args.eval_every}"]
    env = {**os.environ, "PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1"}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if status != 0:
        sys.exit(f"bench_run_cost: the run from {tree} failed:\n{err[-2000:]}")
    metrics = next(out.rglob("metrics.jsonl"))  # <out>/NAME/seedS, or <out>/NAME/NAME-ARM/seedS for a comparison
    steps = [r for r in map(json.loads, metrics.read_text().splitlines()) if "time/step_seconds" in r]
    tokens = [r.get("compute/rollout_tokens", 0.0) for r in steps]
    seconds = [r["time/step_seconds"] for r in steps]
    return {"slope": seconds_per_token(tokens[1:], seconds[1:]), "total_tokens": sum(tokens),
            "wall": wall, "peak_gib": usage.ru_maxrss / 2**20,
            "step": statistics.median(r["time/step_seconds"] for r in steps),
            "phases": {p: statistics.median(r.get(f"time/{p}_seconds", 0.0) for r in steps) for p in PHASES},
            "in_steps": sum(r["time/step_seconds"] for r in steps) / wall,
            "tokens": statistics.median(r.get("compute/rollout_tokens", 0.0) for r in steps)}


def seconds_per_token(tokens: list[float], seconds: list[float]) -> float:
    """Least-squares slope of a step's seconds on its sampled tokens (0 where the tokens do not vary)."""
    if len(set(tokens)) < 2:
        return 0.0
    return statistics.linear_regression(tokens, seconds).slope


def at_baseline_work(base: dict, this: dict) -> float:
    """This tree's wall time had its run sampled the baseline run's tokens (module docstring); its own wall
    where a side recorded no sampled tokens (a revision before ``compute/rollout_tokens``)."""
    if not base["total_tokens"] or not this["total_tokens"]:
        return this["wall"]
    return this["wall"] + this["slope"] * (base["total_tokens"] - this["total_tokens"])


def describe(name: str, r: dict) -> str:
    phases = " / ".join(f"{r['phases'][p]:.2f}" for p in PHASES)
    return (f"  {name:<10} wall {r['wall']:6.1f} s  peak {r['peak_gib']:.2f} GiB  step median {r['step']:.2f} s "
            f"({phases})  {r['in_steps']:.0%} of the wall in steps, {r['tokens']:.0f} sampled tokens a step "
            f"(median; {r['total_tokens']:.0f} in all, {1e3 * r['slope']:.1f} ms a token more)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", default="7bbbfc3", help="git revision to compare against (default: %(default)s)")
    ap.add_argument("--config", default="experiments/smollm2-secret.yaml")
    ap.add_argument("--max-steps", type=int, default=None, help="default: the config's")
    ap.add_argument("--eval-every", type=int, default=None, help="train.eval_every_steps (default: the config's)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--this-set", action="append", default=[], metavar="FIELD=VALUE",
                    help="a config setting of this tree's runs only, e.g. a field the baseline has not got "
                         "(repeatable; default: none, both sides run the file as written)")
    args = ap.parse_args()
    print(f"bench_run_cost: {args.config}, steps {args.max_steps or 'as written'}, an evaluation every "
          f"{args.eval_every or 'as written'} steps; "
          f"baseline {args.baseline} against the working tree{''.join(f' --set {s}' for s in args.this_set)}; "
          f"{args.rounds} round(s); phases: "
          f"{' / '.join(PHASES)} seconds", flush=True)
    runs: dict[str, list[dict]] = {"baseline": [], "this tree": []}
    with tempfile.TemporaryDirectory(prefix="exgrpo-bench-cost-") as tmp:
        trees = {"baseline": baseline_tree(args.baseline, Path(tmp) / "baseline"), "this tree": ROOT}
        for i in range(args.rounds):
            for name, tree in trees.items():
                r = run_once(tree, Path(tmp) / f"runs-{name.replace(' ', '-')}-{i}", args,
                             args.this_set if name == "this tree" else [])
                runs[name].append(r)
                print(describe(name, r), flush=True)
    pairs = list(zip(runs["baseline"], runs["this tree"], strict=True))  # round by round
    raw = statistics.median(b["wall"] / t["wall"] for b, t in pairs)
    equal = statistics.median(b["wall"] / at_baseline_work(b, t) for b, t in pairs)
    print(f"run wall time: baseline / this tree = {raw:.2f}x as sampled; {equal:.2f}x at the baseline's sampled "
          "tokens (target 2x)")
    record("1b. run wall at equal tokens, baseline/this", equal, 2.0,
           f"{args.config}{''.join(f' --set {s}' for s in args.this_set)}, steps {args.max_steps or 'as written'}, "
           f"baseline {args.baseline}, {args.rounds} round(s); "
           f"as sampled {raw:.2f}x")


if __name__ == "__main__":
    main()
