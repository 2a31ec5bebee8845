"""The toy pages' per-seed finals, re-run: a figure that drifts fails here instead of going stale.

The toy is the one positive control of the comparisons, so its published numbers must stay what
today's code gives. A page records the runs behind its figures as a per-seed table, announced by a
comment naming the comparison file (and any ``--set`` overrides) they were trained from, and the
kernels torch ran them with (``torch.backends.cpu.get_cpu_capability()``)::

    <!-- check-results: experiments/toy.yaml --cpu AVX512 -->
    | seed | grpo | notebook | exgrpo | exgrpo-early |
    |---|---|---|---|---|
    | 0 | 0.1818 | 0.3580 | 0.2727 | 0.0341 |
    | 5 | 0.1477 | — | 0.1477 | — |

Each cell is the run's final value of the file's metric (``val/accuracy``), at 4 decimals; "—" is a
run the page did not make. This script trains the recorded runs again (``exgrpo train FILE --arm A
--seed S``, no tracking, in a temporary directory) and fails, naming the page, arm and seed, when a
final differs from the page's by more than its rounding. A run recorded on several pages is trained
once and checked against each.

    python scripts/check_results.py            # the first recorded seed of every arm (make check-results)
    python scripts/check_results.py --all      # every recorded run
    python scripts/check_results.py --only experiments/toy.yaml   # its tables only (the CI test's subset)
    python scripts/check_results.py --all --runs runs  # the runs of a comparison under runs/, not trained
    python scripts/check_results.py --table runs experiments/toy.yaml   # a page's table of runs trained here

Runs are deterministic for a given code version, ``train.threads`` (their default, 1, is what the
pages use) and CPU kernels: torch picks its vectorised kernels by the CPU (AVX512 on an AVX-512 CPU,
else AVX2), and their float sums round differently, so an AVX2 machine trains other runs (the
notebook arm's seed 0 ends at 0.2614 instead of 0.3580). A table measured with other kernels than
this machine's is not checked, and the script says so. On the kernels of the record, a drift means
the code or a default changed, and the page must be re-measured with it.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
PAGES = ("docs/seeds.md", "docs/results/toy.md")
"""The pages whose toy figures are checked."""
MARKER = re.compile(r"<!--\s*check-results:\s*(.+?)\s*-->")
DECIMALS = 4
TOLERANCE = 0.5 * 10 ** -DECIMALS + 1e-9
"""A recorded value is the final rounded to 4 decimals: anything further is a different run."""
ABSENT = ("—", "-", "")


@dataclass(frozen=True)
class RunKey:
    """One training run: a comparison file, its overrides, an arm and a seed."""

    config: str
    sets: tuple[str, ...]
    arm: str
    seed: int

    def command(self) -> str:
        sets = "".join(f" --set {s}" for s in self.sets)
        return f"exgrpo train {self.config} --arm {self.arm} --seed {self.seed}{sets}"


@dataclass(frozen=True)
class Recorded:
    """A final value as a page records it."""

    page: str
    line: int
    key: RunKey
    value: float
    cpu: str | None = None
    """torch's CPU capability the page's runs were trained with (None: not recorded)."""


def _number(cell: str) -> float:
    return float(cell.replace("−", "-"))


def parse_page(page: str, text: str) -> list[Recorded]:
    """Every recorded final of ``text`` (the page ``page``): the tables that follow a marker comment."""
    lines = text.splitlines()
    out: list[Recorded] = []
    for i, line in enumerate(lines):
        m = MARKER.search(line)
        if not m:
            continue
        config, *rest = shlex.split(m.group(1))
        flags = list(zip(rest[::2], rest[1::2], strict=False))
        if len(rest) % 2 or any(flag not in ("--set", "--cpu") for flag, _ in flags):
            raise ValueError(f"{page}:{i + 1}: a check-results marker takes a file, --set FIELD=VALUE pairs "
                             "and --cpu CAPABILITY only")
        sets = tuple(v for flag, v in flags if flag == "--set")
        cpu = next((v for flag, v in flags if flag == "--cpu"), None)
        start = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("|")), None)
        if start is None:
            raise ValueError(f"{page}:{i + 1}: a check-results marker with no table after it")
        header = [c.strip() for c in lines[start].strip().strip("|").split("|")]
        if header[0] != "seed":
            raise ValueError(f"{page}:{start + 1}: a check-results table's first column is 'seed', not {header[0]!r}")
        for j in range(start + 2, len(lines)):
            if not lines[j].startswith("|"):
                break
            cells = [c.strip() for c in lines[j].strip().strip("|").split("|")]
            seed = int(cells[0])
            for arm, cell in zip(header[1:], cells[1:], strict=True):
                if cell not in ABSENT:
                    out.append(Recorded(page, j + 1, RunKey(config, sets, arm, seed), _number(cell), cpu))
    return out


def first_seed_per_arm(records: Iterable[Recorded]) -> list[Recorded]:
    """The cheap subset: for each table's file and arm, the records of its lowest seed."""
    lowest: dict[tuple, int] = {}
    records = list(records)
    for r in records:
        k = (r.key.config, r.key.sets, r.key.arm)
        lowest[k] = min(lowest.get(k, r.key.seed), r.key.seed)
    return [r for r in records if r.key.seed == lowest[(r.key.config, r.key.sets, r.key.arm)]]


def drifts(records: Iterable[Recorded], finals: dict[RunKey, float | None]) -> list[str]:
    """One line per recorded value that today's run does not give (or a run that gave nothing)."""
    out = []
    for r in records:
        got = finals.get(r.key)
        if got is None:
            out.append(f"{r.page}:{r.line}: arm {r.key.arm}, seed {r.key.seed}: the run gave no final "
                       f"(command: {r.key.command()})")
        elif abs(got - r.value) > TOLERANCE:
            out.append(f"{r.page}:{r.line}: arm {r.key.arm}, seed {r.key.seed}: final {got:.{DECIMALS}f}, "
                       f"the page records {r.value:.{DECIMALS}f} (command: {r.key.command()})")
    return out


def cpu_capability() -> str:
    """The vectorised kernels torch runs here (``ATEN_CPU_CAPABILITY`` can lower them)."""
    import torch

    return torch.backends.cpu.get_cpu_capability()


def on_this_cpu(records: list[Recorded], cpu: str) -> tuple[list[Recorded], list[str]]:
    """The records measured with ``cpu``'s kernels (or none recorded), and a line per page left out."""
    kept = [r for r in records if r.cpu in (None, cpu)]
    notes = [f"{page}: its finals were measured with torch's {other} CPU kernels; this machine runs {cpu} "
             "ones, whose float sums round differently (other runs): not checked here"
             for page, other in sorted({(r.page, r.cpu) for r in records if r.cpu not in (None, cpu)})]
    return kept, notes


def metric_of(config: str) -> str:
    """The comparison file's metric (``val/accuracy`` unless it names another)."""
    return yaml.safe_load((ROOT / config).read_text()).get("metric", "val/accuracy")


def final_in(run_dir: Path, metric: str) -> float | None:
    """The last logged value of ``metric`` in a run directory's ``metrics.jsonl``."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return None
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    values = [float(r[metric]) for r in rows if metric in r]
    return values[-1] if values else None


def run_dir_in(root: Path, config: str, arm: str, seed: int) -> Path:
    """Where a comparison under ``root`` (an ``--output-dir``) keeps one run: ``<name>/<name>-<arm>/seed<N>``."""
    name = yaml.safe_load((ROOT / config).read_text())["base"]["name"]
    return root / name / f"{name}-{arm}" / f"seed{seed}"


def train(key: RunKey) -> float | None:
    """Train ``key`` as its page's command does, in a temporary directory; its final metric."""
    with tempfile.TemporaryDirectory(prefix="check-results-") as tmp:
        cmd = [sys.executable, "-m", "exgrpo.cli", "train", key.config, "--arm", key.arm, "--seed", str(key.seed),
               "--no-tracking", "--no-progress", "--output-dir", tmp]
        for s in key.sets:
            cmd += ["--set", s]
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            print(f"failed: {key.command()}\n{done.stderr[-2000:]}", file=sys.stderr)
            return None
        found = sorted(Path(tmp).glob(f"**/seed{key.seed}/metrics.jsonl"))
        return final_in(found[0].parent, metric_of(key.config)) if found else None


def check(records: list[Recorded], final_of: Callable[[RunKey], float | None], jobs: int = 1) -> list[str]:
    """Each distinct run of ``records`` through ``final_of`` once; the drifts."""
    keys = sorted({r.key for r in records}, key=lambda k: (k.config, k.sets, k.arm, k.seed))
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        finals = dict(zip(keys, pool.map(final_of, keys), strict=True))
    return drifts(records, finals)


def table(runs: Path, config: str) -> str:
    """The per-seed table of the finished runs of ``config`` under ``runs`` (a page's record)."""
    spec = yaml.safe_load((ROOT / config).read_text())
    arms, metric = list(spec["arms"]), spec.get("metric", "val/accuracy")
    finals = {}
    for arm in arms:
        for d in sorted(run_dir_in(runs, config, arm, 0).parent.glob("seed*")):
            value = final_in(d, metric)
            if value is not None:
                finals[arm, int(d.name.removeprefix("seed"))] = value
    seeds = sorted({s for _, s in finals})
    lines = [f"<!-- check-results: {config} --cpu {cpu_capability()} -->",
             "| seed | " + " | ".join(arms) + " |", "|---" * (len(arms) + 1) + "|"]
    for s in seeds:
        cells = [f"{finals[a, s]:.{DECIMALS}f}" if (a, s) in finals else "—" for a in arms]
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--all", action="store_true", help="every recorded run (default: the first seed of each arm)")
    p.add_argument("--runs", type=Path, help="read the runs under this --output-dir instead of training (finished "
                   "ones: a run still training is read at its latest evaluation)")
    p.add_argument("--jobs", type=int, default=1, help="runs trained at once (default 1)")
    p.add_argument("--pages", nargs="+", default=list(PAGES), help=f"pages to check (default: {' '.join(PAGES)})")
    p.add_argument("--only", metavar="FILE", help="check the tables of this comparison file only")
    p.add_argument("--table", nargs=2, metavar=("RUNS", "FILE"), help="print the table of FILE's runs under RUNS")
    a = p.parse_args(argv)
    if a.table:
        print(table(Path(a.table[0]), a.table[1]))
        return 0
    records = [r for page in a.pages for r in parse_page(page, (ROOT / page).read_text())]
    if not records:
        print(f"no recorded finals in {', '.join(a.pages)}", file=sys.stderr)
        return 1
    if a.only:
        records = [r for r in records if r.key.config == a.only]
    records, notes = on_this_cpu(records, cpu_capability())
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    if not records:
        print("nothing to check on this CPU", file=sys.stderr)
        return 0
    chosen = records if a.all else first_seed_per_arm(records)
    n_runs = len({r.key for r in chosen})
    if a.runs:
        found = [r for r in chosen if run_dir_in(a.runs, r.key.config, r.key.arm, r.key.seed).is_dir()]
        if len(found) < len(chosen):  # a test that stopped an arm earlier than the page's did
            print(f"{len(chosen) - len(found)} recorded runs are not under {a.runs}: not checked", file=sys.stderr)
        chosen = found
        if not chosen:
            print(f"none of the recorded runs is under {a.runs}", file=sys.stderr)
            return 1

        def final_of(k: RunKey) -> float | None:
            return final_in(run_dir_in(a.runs, k.config, k.arm, k.seed), metric_of(k.config))
    else:
        final_of = train
        print(f"training {n_runs} runs of {len(records)} recorded finals ({'all' if a.all else 'first seed of each arm'})",
              file=sys.stderr)
    bad = check(chosen, final_of, a.jobs)
    for line in bad:
        print(f"drift: {line}", file=sys.stderr)
    if bad:
        print(f"{len(bad)} of {len(chosen)} recorded finals drifted: the code, a default or the CPU kernels "
              f"(torch's {cpu_capability()} here) differ from those the page was measured with; re-measure the "
              "page with today's code (and say in CHANGELOG.md what moved the runs)", file=sys.stderr)
        return 1
    print(f"ok: {len(chosen)} recorded finals ({n_runs} runs) as the pages give them")
    return 0


if __name__ == "__main__":
    sys.exit(main())
