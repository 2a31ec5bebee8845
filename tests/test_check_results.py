"""scripts/check_results.py: the toy pages' recorded per-seed finals are found, and a run whose final
differs from its page's is reported by page, arm and seed; one run per arm is re-trained and must
give the pages' finals (the toy is the comparisons' positive control: its figures must not drift)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("check_results", ROOT / "scripts" / "check_results.py")
check_results = importlib.util.module_from_spec(_spec)
sys.modules["check_results"] = check_results
_spec.loader.exec_module(check_results)

PAGE = """Some text.

<!-- check-results: experiments/toy.yaml --set train.lr=1e-3 --cpu AVX512 -->
| seed | grpo | notebook |
|---|---|---|
| 3 | 0.1818 | 0.3580 |
| 4 | 0.2000 | — |

After the table.
"""


def test_a_page_table_is_read_with_its_command() -> None:
    records = check_results.parse_page("page.md", PAGE)
    assert [(r.key.arm, r.key.seed, r.value, r.line) for r in records] == [
        ("grpo", 3, 0.1818, 6), ("notebook", 3, 0.3580, 6), ("grpo", 4, 0.2, 7)]
    assert records[0].key.config == "experiments/toy.yaml" and records[0].key.sets == ("train.lr=1e-3",)
    assert records[0].key.command() == "exgrpo train experiments/toy.yaml --arm grpo --seed 3 --set train.lr=1e-3"
    assert [(r.key.arm, r.key.seed) for r in check_results.first_seed_per_arm(records)] == [("grpo", 3), ("notebook", 3)]
    assert {r.cpu for r in records} == {"AVX512"}


def test_a_table_of_other_cpu_kernels_is_left_out_and_said_so() -> None:
    """torch's AVX2 kernels round float sums otherwise than its AVX512 ones: other runs, not a drift."""
    records = check_results.parse_page("page.md", PAGE)
    assert check_results.on_this_cpu(records, "AVX512") == (records, [])
    kept, (note,) = check_results.on_this_cpu(records, "AVX2")
    assert kept == [] and note.startswith("page.md: its finals were measured with torch's AVX512 CPU kernels")
    with pytest.raises(ValueError, match="--cpu CAPABILITY only"):
        check_results.parse_page("page.md", PAGE.replace("--cpu AVX512", "--seeds 3"))


def test_a_drift_names_page_arm_and_seed_and_rounding_is_not_a_drift() -> None:
    records = check_results.parse_page("docs/x.md", PAGE)
    finals = {r.key: r.value for r in records}
    grpo3 = records[0].key
    finals[grpo3] = 0.181818187  # the page's 0.1818, unrounded
    assert check_results.check(records, finals.get) == []
    finals[grpo3] = 0.1875
    (line,) = check_results.check(records, finals.get)
    assert line.startswith("docs/x.md:6: arm grpo, seed 3: final 0.1875, the page records 0.1818")
    assert "exgrpo train experiments/toy.yaml --arm grpo --seed 3" in line
    finals[grpo3] = None
    assert "gave no final" in check_results.check(records, finals.get)[0]


def test_every_toy_page_records_its_runs() -> None:
    """Each checked page has a table, of runs of a file that exists, with its every arm."""
    for page in check_results.PAGES:
        records = check_results.parse_page(page, (ROOT / page).read_text())
        assert records, f"{page} records no per-seed finals"
        for config in {r.key.config for r in records}:
            arms = set(check_results.yaml.safe_load((ROOT / config).read_text())["arms"])
            assert {r.key.arm for r in records if r.key.config == config} == arms, page


@pytest.mark.slow
@pytest.mark.e2e
# four toy runs, about 70 s of CPU; `make check-results` re-trains them too
def test_the_toy_pages_first_seed_of_each_arm_reproduces(capsys: pytest.CaptureFixture[str]) -> None:
    """One training run per arm of experiments/toy.yaml (300 steps each, about 70 s of CPU in all), each
    final as the pages record it; ``make check-results`` also runs the 800-step tables' first seeds."""
    recorded = {r.cpu for page in check_results.PAGES for r in check_results.parse_page(page, (ROOT / page).read_text())}
    if check_results.cpu_capability() not in recorded:
        pytest.skip(f"the pages' finals were measured with torch's {recorded} CPU kernels; this machine runs "
                    f"{check_results.cpu_capability()} ones, which round otherwise")
    assert check_results.main(["--jobs", "2", "--only", "experiments/toy.yaml"]) == 0, capsys.readouterr().err
