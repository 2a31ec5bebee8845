import pandas as pd
import torch

from exgrpo.core.pool import ExperiencePool, Trajectory


def traj(tokens, step=0, ent=0.5):
    return Trajectory(tuple(tokens), tuple(-0.1 * (i + 1) for i in range(len(tokens))), ent, step)


def test_collection_bounds_are_lbound_exclusive_rbound_inclusive():
    pool = ExperiencePool(group_size=8, lbound=1, rbound=5)
    pool.observe_group(1, 1, [traj([1])], 0)  # k == lbound: not collected
    pool.observe_group(2, 5, [traj([2])], 0)  # k == rbound: collected
    pool.observe_group(3, 6, [traj([3])], 0)  # k > rbound: not collected
    pool.observe_group(4, 2, [traj([4])], 0)
    assert 1 not in pool and 3 not in pool
    assert pool.buckets() == {2: [4], 5: [2]}


def test_retirement_is_permanent_and_deletes_the_entry():
    pool = ExperiencePool(group_size=8)
    pool.observe_group(7, 3, [traj([1, 2])], 0)
    pool.observe_group(7, 8, [], 1)
    assert 7 not in pool and pool.is_retired(7)
    pool.observe_group(7, 4, [traj([5])], 2)  # a retired question is never collected again
    assert 7 not in pool and pool.stats()["pool/retired"] == 1


def test_bucket_is_latest_k_and_k0_keeps_old_state():
    pool = ExperiencePool(group_size=8)
    pool.observe_group(1, 2, [traj([1])], 0)
    pool.observe_group(1, 6, [traj([2]), traj([1])], 1)
    assert pool.bucket_of(1) == 6
    assert [t.tokens for t in pool.trajectories(1)] == [(1,), (2,)]  # dedup by token ids
    pool.observe_group(1, 0, [], 2)
    assert pool.bucket_of(1) == 6 and len(pool.trajectories(1)) == 2


def test_caps():
    pool = ExperiencePool(group_size=8, max_per_question=2, max_questions=2)
    pool.observe_group(1, 3, [traj([1]), traj([2]), traj([3])], 0)
    assert [t.tokens for t in pool.trajectories(1)] == [(2,), (3,)]
    pool.observe_group(2, 3, [traj([4])], 1)
    pool.observe_group(3, 3, [traj([5])], 2)
    assert 1 not in pool and 2 in pool and 3 in pool


def test_stats_names_and_values():
    pool = ExperiencePool(group_size=4)
    pool.observe_group(1, 2, [traj([1]), traj([2])], 0)
    pool.observe_group(2, 4, [], 0)
    assert pool.stats() == {
        "pool/questions": 1.0, "pool/trajectories": 2.0, "pool/retired": 1.0,
        "pool/bucket_1": 0.0, "pool/bucket_2": 1.0, "pool/bucket_3": 0.0,
    }


def test_state_dict_roundtrip_weights_only(tmp_path):
    pool = ExperiencePool(group_size=8)
    pool.observe_group(1, 3, [traj([1, 2, 3], step=4, ent=0.25)], 4)
    pool.observe_group(2, 8, [], 5)
    torch.save(pool.state_dict(), tmp_path / "p.pt")
    other = ExperiencePool(group_size=8)
    other.load_state_dict(torch.load(tmp_path / "p.pt", weights_only=True))
    assert other.trajectories(1) == pool.trajectories(1)
    assert other.retired == {2} and other.bucket_of(1) == 3


def test_a_checkpoint_from_before_the_renames_still_loads():
    pool = ExperiencePool(group_size=8)
    pool.observe_group(1, 3, [traj([1, 2, 3])], 0)
    old = pool.state_dict()
    for q in old["questions"]:
        q["behaviour_logp"] = q.pop("behaviour_log_prob")  # the keys' names until 2026-11-23
        q["k"] = q.pop("num_correct")
    other = ExperiencePool(group_size=8)
    other.load_state_dict(old)
    assert other.trajectories(1) == pool.trajectories(1) and other.bucket_of(1) == 3


def test_parquet_snapshot_reads_with_pandas(tmp_path):
    pool = ExperiencePool(group_size=8)
    pool.observe_group(1, 3, [traj([1, 2])], 0)
    pool.observe_group(9, 8, [], 0)
    df = pd.read_parquet(pool.to_parquet(tmp_path / "pool.parquet"))
    assert list(df.qid) == [1, 9] and list(df.retired) == [False, True]
    assert list(df.tokens.iloc[0]) == [1, 2]
