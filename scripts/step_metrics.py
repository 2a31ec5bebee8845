"""Per arm of a finished comparison: step metrics from its runs' ``metrics.jsonl``, as a Markdown table.

For each metric, each run is reduced to one number (its first logged value, its mean over the steps
that log it, or its last value), and the arm's cell is the mean over its seeds ± a Student-t 95% CI.
It reads what the runs logged; nothing is trained.

    python scripts/step_metrics.py runs/NAME batch/solve_none:mean batch/solved:first \
        replay/single_success_share_run:last

``runs/NAME`` is a comparison's directory (``<output_dir>/<name>``); its runs are
``runs/NAME/NAME-<arm>/seed<N>/metrics.jsonl``. A metric a run never logged leaves its cell empty.
With ``--vs ARM`` each cell also gives the arm minus ARM on the same seeds, with a Student-t 95% CI
of the paired differences.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from exgrpo.stats import mean_ci, paired_difference

REDUCERS = {
    "first": lambda xs: xs[0],
    "mean": lambda xs: sum(xs) / len(xs),
    "last": lambda xs: xs[-1],
}
"""How a run's step values of one metric become one number."""


def run_values(path: Path, metric: str) -> list[float]:
    """``metric`` at every step row of one run's ``metrics.jsonl`` that logs it, in step order."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [float(r[metric]) for r in rows if metric in r]


def arm_runs(comparison: Path) -> dict[str, dict[int, Path]]:
    """Arm -> seed -> its run's ``metrics.jsonl`` under a comparison's directory."""
    out: dict[str, dict[int, Path]] = {}
    prefix = f"{comparison.name}-"
    for arm_dir in sorted(p for p in comparison.iterdir() if p.is_dir() and p.name.startswith(prefix)):
        runs = {int(p.parent.name[4:]): p for p in arm_dir.glob("seed*/metrics.jsonl")}
        if runs:
            out[arm_dir.name[len(prefix):]] = dict(sorted(runs.items()))
    return out


def _cell(per_seed: dict[int, float], n_runs: int, base: dict[int, float] | None) -> str:
    if not per_seed:
        return ""
    text = str(mean_ci(list(per_seed.values()))) + (f" (n={len(per_seed)})" if len(per_seed) != n_runs else "")
    common = sorted(set(per_seed) & set(base or {}))
    if base is not None and len(common) > 1:
        d = paired_difference([per_seed[s] for s in common], [base[s] for s in common])
        text += f"; {d.mean:+.4f} [{d.low:+.4f}, {d.high:+.4f}]"
    return text


def table(comparison: Path, specs: Sequence[str], vs: str | None = None, seeds: range | None = None) -> str:
    """The Markdown table: one row per arm, one column per ``metric:reducer`` spec; with ``vs``, the
    paired difference from that arm after each cell."""
    parsed = []
    for spec in specs:
        metric, _, how = spec.rpartition(":")
        if how not in REDUCERS or not metric:
            raise SystemExit(f"{spec!r}: write METRIC:{'|'.join(REDUCERS)}")
        parsed.append((metric, how))
    lines = ["| arm | seeds | " + " | ".join(f"{m} ({h})" for m, h in parsed) + " |",
             "|---|---|" + "---|" * len(parsed)]
    arms = {a: {s: p for s, p in runs.items() if seeds is None or s in seeds} for a, runs in arm_runs(comparison).items()}
    if vs is not None and vs not in arms:
        raise SystemExit(f"--vs {vs}: no such arm under {comparison} (arms: {', '.join(arms)})")

    def reduced(runs: dict[int, Path], metric: str, how: str) -> dict[int, float]:
        values = {s: run_values(p, metric) for s, p in runs.items()}
        return {s: REDUCERS[how](v) for s, v in values.items() if v}

    for arm, runs in arms.items():
        cells = [_cell(reduced(runs, m, h), len(runs), None if vs in (None, arm) else reduced(arms[vs], m, h))
                 for m, h in parsed]
        lines.append(f"| {arm} | {len(runs)} | " + " | ".join(cells) + " |")
    if vs is not None:
        lines += ["", f"Each cell: mean over seeds ± 95% CI; after it, the arm minus {vs} on the same seeds [95% CI]."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("comparison", type=Path, help="a comparison's run directory, e.g. runs/tiny-lm-chain-sparse")
    ap.add_argument("metrics", nargs="+", help="METRIC:first|mean|last, e.g. batch/solve_none:mean")
    ap.add_argument("--vs", help="also the paired difference from this arm (default: none)")
    ap.add_argument("--seeds", help="only seeds A-B (default: every run found)")
    args = ap.parse_args(argv)
    seeds = None
    if args.seeds:
        first, _, last = args.seeds.partition("-")
        seeds = range(int(first), int(last or first) + 1)
    print(table(args.comparison, args.metrics, args.vs, seeds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
