"""veRL checkpoint directories: torn steps are skipped on resume, keep_last bounds the disk."""

import torch

from exgrpo.backends.verl.checkpoints import POOL_FILE, TRACKER, prune, read_tracker, repair_tracker, step_dirs


def _step(root, n, *, actor=True, data=True, pool=True, torn_pool=False):
    d = root / f"global_step_{n}"
    (d / "actor").mkdir(parents=True)
    if actor:
        (d / "actor" / "model_world_size_1_rank_0.pt").write_bytes(b"weights")
    if data:
        torch.save({"epoch": 0}, d / "data.pt")
    if pool:
        torch.save({"step": n, "replay": {}}, d / POOL_FILE)
        if torn_pool:
            (d / POOL_FILE).write_bytes((d / POOL_FILE).read_bytes()[:20])
    return d


def test_an_intact_tracked_step_is_left_alone(tmp_path):
    _step(tmp_path, 2)
    _step(tmp_path, 4)
    (tmp_path / TRACKER).write_text("4")
    said = []
    assert repair_tracker(tmp_path, said.append) == 4 and said == []


def test_a_torn_newest_step_falls_back_to_the_newest_intact_one_and_says_so(tmp_path):
    _step(tmp_path, 2)
    _step(tmp_path, 4, torn_pool=True)
    _step(tmp_path, 6, actor=False, pool=False)
    (tmp_path / TRACKER).write_text("6")
    said = []
    assert repair_tracker(tmp_path, said.append) == 2
    assert read_tracker(tmp_path) == 2
    assert "global_step_6 is torn (no actor weights)" in said[0]
    assert "global_step_4 is torn (exgrpo_pool.pt does not load" in said[1]
    assert "resuming from it" in said[2] and "global_step_2" in said[2]


def test_a_torn_tracker_or_none_finds_the_newest_intact_step(tmp_path):
    assert repair_tracker(tmp_path, print) is None  # nothing saved yet: a fresh start
    _step(tmp_path, 2)
    _step(tmp_path, 4)
    (tmp_path / TRACKER).write_text("")  # a kill between veRL's open("w") and its write
    assert repair_tracker(tmp_path, print) == 4 and read_tracker(tmp_path) == 4


def test_steps_past_the_tracker_are_not_trusted(tmp_path):
    _step(tmp_path, 2)
    _step(tmp_path, 4)  # weights may be half written: veRL had not written the tracker yet
    (tmp_path / TRACKER).write_text("2")
    assert repair_tracker(tmp_path, print) == 2


def test_prune_keeps_the_newest_keep_last(tmp_path):
    for n in (2, 4, 6, 8):
        _step(tmp_path, n)
    _step(tmp_path, 7, actor=False, pool=False)  # a killed attempt's leftover
    _step(tmp_path, 10)  # not yet the current step: untouched
    assert prune(tmp_path, None, 8) == []
    removed = prune(tmp_path, 2, 8)
    assert [p.name for p in removed] == ["global_step_2", "global_step_4", "global_step_7"]
    assert [n for n, _ in step_dirs(tmp_path)] == [6, 8, 10]
