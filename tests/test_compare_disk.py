"""A comparison launches a run only when the disk has room for it (exgrpo.disk).

The disk is not filled for real here: the free space the comparison reads is the budget of a small
disk minus what its runs have written so far, measured on the real files (the ``small_disk`` fixture)."""

import pytest

from exgrpo.compare import CompareConfig, RunsFailed, run_local
from exgrpo import disk


def _cc(tmp_path, seeds=(0, 1)):
    return CompareConfig.model_validate({
        "base": {"name": "roomy", "output_dir": str(tmp_path / "runs"), "task": {"max_operand": 5},
                 "policy": {"hidden": 16, "layers": 1}, "train": {"max_steps": 2, "batch_size": 8}},
        "arms": {"grpo": {"algorithm.replay": "none"}, "exgrpo": {"algorithm.replay": "buckets"}},
        "seeds": list(seeds)})


def _on_a_small_disk(tmp_path, small_disk, workers):
    """The comparison of :func:`_cc` on a disk with room for 2.2 of its runs: (config, outcomes, failures heard)."""
    cc = _cc(tmp_path)
    small_disk(tmp_path / "runs" / "roomy", runs_it_holds=2.2)
    heard = []
    return cc, run_local(cc, workers=workers, on_failed=lambda *a: heard.append(a)), heard


def test_runs_the_disk_cannot_hold_are_not_launched_and_resume_trains_them(tmp_path, monkeypatch, small_disk):
    comparison = tmp_path / "runs" / "roomy"
    cc, outcomes, heard = _on_a_small_disk(tmp_path, small_disk, workers=1)
    # seed 0's two runs fit; seed 1's grpo would not, and nothing after it is launched
    assert sorted((o.arm, o.seed) for o in outcomes) == [("exgrpo", 0), ("grpo", 0)]
    assert [(arm, seed) for arm, seed, _ in heard] == [("grpo", 1), ("exgrpo", 1)]
    reason = heard[0][2]
    assert reason.startswith("no room on disk: ") and "MiB free under" in reason
    assert reason.endswith("then resume the comparison (--resume) to train this run")
    assert "\n" not in reason and not (comparison / "roomy-grpo" / "seed1").exists()  # never started

    with pytest.raises(RunsFailed, match=r"2 run\(s\) failed: grpo seed 1: no room on disk: ") as e:
        run_local(cc, workers=1, resume=True)  # still no room: the finished runs report, the others are refused
    assert sorted((o.arm, o.seed) for o in e.value.outcomes) == [("exgrpo", 0), ("grpo", 0)]

    monkeypatch.setattr(disk, "free_bytes", lambda path: 1 << 50)  # space freed
    outcomes = run_local(cc, workers=1, resume=True)
    assert sorted((o.arm, o.seed) for o in outcomes) == [("exgrpo", 0), ("exgrpo", 1), ("grpo", 0), ("grpo", 1)]


@pytest.mark.slow  # trains a comparison's runs in worker processes
def test_a_pool_counts_the_runs_training_beside_the_next(tmp_path, small_disk):
    """Two workers: once one run has finished, the next needs room for itself and the one still training."""
    _, outcomes, heard = _on_a_small_disk(tmp_path, small_disk, workers=2)
    assert sorted((o.arm, o.seed) for o in outcomes) == [("exgrpo", 0), ("grpo", 0)]
    assert sorted((arm, seed) for arm, seed, _ in heard) == [("exgrpo", 1), ("grpo", 1)]
    assert all(why.startswith("no room on disk: ") for _, _, why in heard)


def test_what_a_run_writes_is_read_from_the_finished_runs(tmp_path):
    import torch

    comparison = tmp_path / "cmp"
    assert disk.written_per_run(comparison) is None and disk.room_for(comparison, 1, "retry") is None
    ckpts = comparison / "cmp-a" / "seed0" / "checkpoints"
    ckpts.mkdir(parents=True)
    w = torch.zeros(1000)
    weights = {"w": w, "head": w}  # tied: one storage, saved once
    torch.save({"config": "{}", "model": weights, "step": 3, "optimizer": {"m": torch.zeros(2000)}},
               ckpts / "step_0000003.pt")
    checkpoint, policy = disk.written_per_run(comparison)
    assert checkpoint == (ckpts / "step_0000003.pt").stat().st_size and policy == 4000
    (ckpts / "step_0000004.pt.tmp").write_bytes(b"x" * 10 ** 6)  # a save under way: not a checkpoint yet
    assert disk.written_per_run(comparison) == (checkpoint, policy)
    (ckpts / "step_0000003.pt").write_bytes(b"torn")  # unreadable: counted whole
    assert disk.written_per_run(comparison) == (4, 4)
    # a finished run whose last checkpoint left out the optimiser's state held a whole one while it trained
    slim = comparison / "cmp-b" / "seed0" / "checkpoints"
    slim.mkdir(parents=True)
    torch.save({"config": "{}", "model": {"w": torch.zeros(100_000)}, "step": 3}, slim / "step_0000003.pt")
    size = (slim / "step_0000003.pt").stat().st_size
    assert disk.written_per_run(comparison) == (2 * size + 2 * 400_000, 400_000)



def test_a_rerun_without_resume_is_checked_like_a_new_run(tmp_path, small_disk):
    """Without --resume a finished run's directory is moved aside and the run trained anew: it needs room too."""
    cc = _cc(tmp_path, seeds=(0,))
    assert len(run_local(cc, workers=1)) == 2
    small_disk(tmp_path / "runs" / "roomy", runs_it_holds=0.5)
    heard = []
    assert run_local(cc, workers=1, on_failed=lambda *a: heard.append(a)) == []
    assert [(arm, seed) for arm, seed, _ in heard] == [("grpo", 0), ("exgrpo", 0)]
    assert len(run_local(cc, workers=1, resume=True)) == 2  # resumed, the finished runs only report


def _killed_on_grpo_seed0(cfg, arm, metric, resume=False):
    """A runner whose worker process is killed (as by the OOM killer) on one run."""
    import os
    import signal

    from exgrpo.compare import run_one

    if (arm, cfg.seed) == ("grpo", 0):
        os.kill(os.getpid(), signal.SIGKILL)
    return run_one(cfg, arm, metric, resume=resume)


def test_a_killed_worker_fails_the_runs_left_each_reported(tmp_path):
    """A worker killed under the pool breaks it: every run of the comparison still ends, trained or reported
    failed, none lost (the pool takes no more work once broken)."""
    cc = _cc(tmp_path)
    heard = []
    outcomes = run_local(cc, workers=2, runner=_killed_on_grpo_seed0, on_failed=lambda *a: heard.append(a))
    ended = sorted([(o.arm, o.seed) for o in outcomes] + [(arm, seed) for arm, seed, _ in heard])
    assert ended == [("exgrpo", 0), ("exgrpo", 1), ("grpo", 0), ("grpo", 1)]
    assert ("grpo", 0) in [(arm, seed) for arm, seed, _ in heard]
    assert all("BrokenProcessPool" in why for _, _, why in heard), heard
