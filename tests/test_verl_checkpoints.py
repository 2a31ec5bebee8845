"""veRL checkpoint directories: torn steps are skipped on resume, keep_last bounds the disk."""

import torch

import json

from exgrpo.backends.verl.checkpoints import (
    POOL_FILE,
    TRACKER,
    newest_intact,
    prune,
    read_tracker,
    repair_tracker,
    step_dirs,
)


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


def _logged(metrics_dir, *attempts):
    """veRL's file-logger files, one per attempt: a training row per step (a validation-only row of
    step 0 first, as ``val_before_train`` writes), and a torn last line."""
    metrics_dir.mkdir(exist_ok=True)
    for i, steps in enumerate(attempts):
        lines = [json.dumps({"step": 0, "data": {"val-core/x/mean@1": 0.1}})]
        lines += [json.dumps({"step": n, "data": {"training/global_step": n, "batch/solved": 0.5}}) for n in steps]
        (metrics_dir / f"attempt_{i:03d}.jsonl").write_text("\n".join(lines) + '\n{"step": 9, "da')


def test_a_checkpoint_whose_step_has_no_metrics_row_falls_back_to_the_one_before(tmp_path):
    """veRL logs a step after checkpointing it: killed in between, step 4 is whole on disk but its row
    is missing; the resume starts from step 2 (pool and weights of one step) and deletes nothing."""
    ckpt, metrics = tmp_path / "checkpoints", tmp_path / "verl_metrics"
    _step(ckpt, 2)
    _step(ckpt, 4)
    (ckpt / TRACKER).write_text("4")
    _logged(metrics, [1, 2, 3])
    assert newest_intact(ckpt, metrics) == 2 and newest_intact(ckpt) == 4
    said = []
    assert repair_tracker(ckpt, said.append, metrics_dir=metrics) == 2 and read_tracker(ckpt) == 2
    assert "global_step_4 has no metrics row (the run was killed before veRL logged the step)" in said[0]
    assert "resuming from it" in said[1] and "global_step_2" in said[1]
    assert [n for n, _ in step_dirs(ckpt)] == [2, 4]  # nothing deleted
    _logged(metrics, [1, 2, 3], [3, 4])  # the resumed attempt saved step 4 again and logged it
    (ckpt / TRACKER).write_text("4")
    assert newest_intact(ckpt, metrics) == 4


def test_prune_keeps_the_step_to_fall_back_to_until_the_new_one_is_logged(tmp_path):
    """With keep_last=1, the save of step 4 (its row not yet written) keeps step 2 beside it; once
    step 4's row is there, the next prune removes step 2."""
    ckpt, metrics = tmp_path / "checkpoints", tmp_path / "verl_metrics"
    _step(ckpt, 2)
    _step(ckpt, 4)
    _logged(metrics, [1, 2, 3])
    assert prune(ckpt, 1, 4, metrics) == []
    _logged(metrics, [1, 2, 3, 4])
    assert [p.name for p in prune(ckpt, 1, 4, metrics)] == ["global_step_2"]
    assert [n for n, _ in step_dirs(ckpt)] == [4]
