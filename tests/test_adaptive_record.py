"""A resumed adaptive comparison keeps the settings its sequential test began with
(exgrpo/compare/adaptive_record.py): a resume that would change a decision already made is refused
before any work, and ``--new-test`` says that it starts a new test."""

from __future__ import annotations

import json

import pytest

from exgrpo.cli import main
from exgrpo.compare.adaptive_record import FIELDS, RECORD_FILE, begin, check_settings, record_path, settings_of
from exgrpo.config import CompareConfig, ConfigError


def _cc(tmp_path, arms=("grpo", "exgrpo", "notebook"), seeds=(0,), **adaptive) -> CompareConfig:
    return CompareConfig(base={"tier": "toy", "name": "cmp", "output_dir": str(tmp_path / "runs")},
                         arms={a: {} for a in arms}, baseline="grpo", seeds=list(seeds), adaptive=adaptive)


def test_the_settings_are_recorded_when_the_test_begins_and_a_same_resume_goes_on(tmp_path):
    cc = _cc(tmp_path)
    assert begin(cc, resume=False, new_test=False) is None
    recorded = json.loads(record_path(cc).read_text())["settings"]
    assert list(recorded) == list(FIELDS) and recorded["adaptive.first_seed"] == 0
    assert recorded["arms"] == ["grpo", "exgrpo", "notebook"] and recorded["adaptive.max_stages"] == 4
    check_settings(cc, resume=True, new_test=False)  # nothing changed
    assert begin(cc, resume=True, new_test=False) is None
    assert json.loads(record_path(cc).read_text())["settings"] == recorded


@pytest.mark.parametrize("change, field", [
    ({"max_stages": 6}, "adaptive.max_stages"), ({"alpha": 0.1}, "adaptive.alpha"), ({"pairs": "all"}, "adaptive.pairs"),
    ({"first_seed": 10}, "adaptive.first_seed"), ({"test_seed": 3}, "adaptive.test_seed"),
    ({"permutations": 500}, "adaptive.permutations"), ({"seeds_per_stage": 3}, "adaptive.seeds_per_stage"),
])
def test_a_resume_that_changes_a_setting_is_refused_in_one_line_naming_it(tmp_path, change, field):
    begin(_cc(tmp_path), resume=False, new_test=False)
    with pytest.raises(ConfigError) as err:
        check_settings(_cc(tmp_path, **change), resume=True, new_test=False)
    (line,) = str(err.value).splitlines()
    assert line.startswith(f"{field}=") and "which this adaptive test began with" in line and "--new-test" in line
    assert f"--set {field}" in line


def test_other_arms_or_first_seed_of_the_file_are_refused_too(tmp_path):
    begin(_cc(tmp_path), resume=False, new_test=False)
    with pytest.raises(ConfigError, match=r"^arms=grpo,exgrpo differs from grpo,exgrpo,notebook.*drop --arms"):
        check_settings(_cc(tmp_path, arms=("grpo", "exgrpo")), resume=True, new_test=False)
    with pytest.raises(ConfigError, match=r"^adaptive\.first_seed=5 differs from 0"):
        check_settings(_cc(tmp_path, seeds=(5,)), resume=True, new_test=False)


def test_a_new_test_replaces_the_record_keeps_the_old_and_says_so(tmp_path):
    begin(_cc(tmp_path), resume=False, new_test=False)
    changed = _cc(tmp_path, max_stages=6)
    check_settings(changed, resume=True, new_test=True)
    note = begin(changed, resume=True, new_test=True)
    kept = record_path(changed).with_name("adaptive-test.1.json")
    assert note.startswith("a new sequential test (adaptive.max_stages: 4 -> 6): its error rate holds for its own "
                           "decisions") and str(kept) in note
    assert json.loads(kept.read_text())["settings"]["adaptive.max_stages"] == 4
    assert json.loads(record_path(changed).read_text())["settings"] == settings_of(changed)
    with pytest.raises(ConfigError, match="--new-test goes with --resume"):
        check_settings(changed, resume=False, new_test=True)


def test_the_command_refuses_a_changed_resume_before_any_work(tmp_path, capsys):
    cfg = tmp_path / "cmp.yaml"
    cfg.write_text(json.dumps({"base": {"tier": "toy", "name": "cmp"}, "arms": {"grpo": {}, "exgrpo": {}},
                               "baseline": "grpo", "seeds": [0]}))
    out = tmp_path / "runs"
    begin(_cc(tmp_path, arms=("grpo", "exgrpo")), resume=False, new_test=False)
    before = sorted(p.name for p in (out / "cmp").iterdir())
    code = main(["compare", str(cfg), "--adaptive", "--resume", "--no-prefect", "--output-dir", str(out),
                 "--set", "adaptive.max_stages=2", "--set", "train.max_steps=1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: adaptive.max_stages=2 differs from 4"), err
    assert sorted(p.name for p in (out / "cmp").iterdir()) == before == [RECORD_FILE]  # nothing trained
    code = main(["compare", str(cfg), "--new-test", "--no-prefect", "--output-dir", str(out)])
    assert code == 2 and "--new-test starts a new sequential test" in capsys.readouterr().err


def test_a_record_of_the_earlier_test_is_not_resumed_without_new_test(tmp_path):
    """A comparison whose sequential test began under AdaStop's per-pair permutations (a record without
    ``test``) is refused on resume: its decisions were another test's; --new-test starts one over its runs."""
    cc = _cc(tmp_path)
    begin(cc, resume=False, new_test=False)
    path = record_path(cc)
    record = json.loads(path.read_text())
    del record["settings"]["test"]
    path.write_text(json.dumps(record))
    with pytest.raises(ConfigError) as err:
        check_settings(cc, resume=True, new_test=False)
    (line,) = str(err.value).splitlines()
    assert "began under another sequential test (AdaStop with per-pair permutations" in line and "--new-test" in line
    check_settings(cc, resume=True, new_test=True)


def test_a_new_test_after_a_kept_record_was_deleted_overwrites_none(tmp_path):
    """The kept records are numbered past the largest number there, not by their count: with records 1
    and 3 left (2 deleted), the next is 4, and 3 keeps its settings."""
    begin(_cc(tmp_path), resume=False, new_test=False)
    for stages in (5, 6, 7):  # three new tests: records 1, 2 and 3 keep max_stages 4, 5 and 6
        begin(_cc(tmp_path, max_stages=stages), resume=True, new_test=True)
    folder = record_path(_cc(tmp_path)).parent
    (folder / "adaptive-test.2.json").unlink()
    note = begin(_cc(tmp_path, max_stages=8), resume=True, new_test=True)

    def stages_of(name: str) -> int:
        return json.loads((folder / name).read_text())["settings"]["adaptive.max_stages"]

    assert sorted(p.name for p in folder.glob("adaptive-test.*.json")) == [
        "adaptive-test.1.json", "adaptive-test.3.json", "adaptive-test.4.json"]
    assert [stages_of(f"adaptive-test.{n}.json") for n in (1, 3, 4)] == [4, 6, 7]
    assert stages_of(RECORD_FILE) == 8 and str(folder / "adaptive-test.4.json") in note
    assert not list(folder.glob("*.tmp"))
