"""The claims page's verdicts under its one rule: Holm over every row that carries a verdict.

Reads the table of ``docs/results/claims.md`` and, for each row, its paired difference and 95% CI
(the "paired diff [95% CI]" column: a Student-t interval over paired seeds), the seeds it rests on
("N seeds" in the row, else 10) and its split. A row read on the tuning split carries no verdict.
Every other row's interval is read back as its two-sided t-test p-value
(:func:`exgrpo.stats.t_test_p_value`), and Holm's adjustment (:func:`exgrpo.stats.holm`) holds the
family-wise error at 0.05 over all of them. The verdict:

- **reproduced**: Holm rejects "no difference" and the difference has the paper's sign;
- **reversed**: Holm rejects it and the sign is the opposite;
- **not reproduced**: Holm does not reject it.

The paper's sign is + (the replay arm above GRPO), except in the ablation rows, whose baseline cell
names the full ExGRPO: there the paper has the ablation below the full method (sign -).

    python scripts/claims_verdicts.py [docs/results/claims.md]
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

from exgrpo.stats import Estimate, holm, t_test_p_value

NUMBER = r"[+−-]?\d+\.\d+"
DIFF = re.compile(rf"({NUMBER}) \[({NUMBER}), ({NUMBER})\]")
"""A paired difference and its 95% CI as the page writes it, e.g. −0.0334 [−0.0508, −0.0160]."""
SEEDS = re.compile(r"(\d+) seeds")
ALPHA = 0.05


def _num(text: str) -> float:
    return float(text.replace("−", "-"))


@dataclass
class Row:
    claim: str
    diff: Estimate | None
    tuning: bool
    paper_sign: int


def rows(page: str) -> list[Row]:
    """The table's rows (the first table whose header names the paired difference)."""
    lines = page.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|") and "paired diff [95% CI]" in line)
    header = [c.strip() for c in lines[start].strip("|").split("|")]
    col = header.index("paired diff [95% CI]")
    out = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        m = DIFF.search(cells[col])
        seeds = SEEDS.search(line)
        n = int(seeds.group(1)) if seeds else 10
        diff = None if m is None else Estimate(_num(m.group(1)), _num(m.group(2)), _num(m.group(3)), n)
        out.append(Row(cells[0], diff, "tuning split" in cells[1], -1 if cells[2].startswith("full ExGRPO") else 1))
    return out


def verdicts(table: list[Row]) -> list[tuple[Row, float | None, float | None, str]]:
    """Each row with its p-value, its Holm-adjusted p-value and its verdict (None, "no verdict" for
    the tuning split and for a row without one interval)."""
    tested = [r for r in table if r.diff is not None and not r.tuning]
    p = [t_test_p_value(r.diff) for r in tested]
    adjusted, reject = holm(p, ALPHA)
    by_row = {id(r): (pv, a, rej) for r, pv, a, rej in zip(tested, p, adjusted, reject, strict=True)}
    out = []
    for r in table:
        if id(r) not in by_row:
            out.append((r, None, None, "no verdict (tuning split)" if r.tuning else "no verdict (no single interval)"))
            continue
        pv, a, rej = by_row[id(r)]
        word = "not reproduced" if not rej else "reproduced" if r.diff.mean * r.paper_sign > 0 else "reversed"
        out.append((r, pv, a, word))
    return out


def main(argv: list[str]) -> int:
    path = Path(argv[0] if argv else "docs/results/claims.md")
    result = verdicts(rows(path.read_text()))
    m = sum(p is not None for _, p, _, _ in result)
    print(f"Holm over {m} rows, family-wise error {ALPHA}:\n")
    print("| claim | paired diff [95% CI] (seeds) | p | Holm-adjusted p | verdict |\n|---|---|---|---|---|")
    for r, p, a, word in result:
        d = "—" if r.diff is None else f"{r.diff.mean:+.4f} [{r.diff.low:+.4f}, {r.diff.high:+.4f}] ({r.diff.n})"
        ps = "—" if p is None else f"{p:.2g}"
        adj = "—" if a is None else f"{a:.2g}"
        print(f"| {r.claim[:60]} | {d} | {ps} | {adj} | {word} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
