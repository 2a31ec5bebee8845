"""The bench goals (speed ratios against baselines of the same run) in one table at the end of ``make bench``.

Each bench script calls :func:`record` where it prints a goal's ratio; the records go to the JSON
Lines file named by ``EXGRPO_BENCH_SUMMARY`` (nothing is written when it is unset, e.g. a bench run
by hand). ``make bench`` starts the file empty and ends with ``python bench/summary.py``, which
prints one row per record: the goal, the ratio measured, the target, met or not, and the
configuration it was measured on.

    EXGRPO_BENCH_SUMMARY=/tmp/bench.jsonl python bench/bench_rollout.py && python bench/summary.py /tmp/bench.jsonl
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ENV = "EXGRPO_BENCH_SUMMARY"


def record(goal: str, ratio: float, target: float, config: str, higher_is_better: bool = True) -> None:
    """Append one measured goal (``ratio`` against ``target``: at least, or at most when
    ``higher_is_better`` is False) to the summary file, if one is set."""
    path = os.environ.get(ENV)
    if not path:
        return
    row = {"goal": goal, "ratio": round(float(ratio), 3), "target": target, "higher_is_better": higher_is_better,
           "config": config}
    with open(path, "a") as f:  # one short line per append: whole lines even if two benches shared the file
        f.write(json.dumps(row) + "\n")


def table(rows: list[dict]) -> str:
    """The records as a plain-text table (goal, measured, target, met, configuration)."""
    out = [f"{'goal':<46} {'measured':>9} {'target':>8}  {'met':<4} configuration"]
    for r in rows:
        ok = r["ratio"] >= r["target"] if r["higher_is_better"] else r["ratio"] <= r["target"]
        sign = ">=" if r["higher_is_better"] else "<="
        out.append(f"{r['goal']:<46} {r['ratio']:>8.2f}x {sign}{r['target']:>5.2f}x  {'yes' if ok else 'no':<4} "
                   f"{r['config']}")
    return "\n".join(out)


def main() -> None:
    path = Path(sys.argv[1] if len(sys.argv) > 1 else os.environ.get(ENV, ""))
    if not path.is_file():
        sys.exit(f"bench summary: no records at {path!s} (set {ENV} for the bench scripts)")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows.sort(key=lambda r: r["goal"].split(".")[0])  # by goal number; runs of one goal in the order measured
    print("\nthe four speed goals, as measured by this bench run:")
    print(table(rows))


if __name__ == "__main__":
    main()
