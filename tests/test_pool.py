import numpy as np
import pandas as pd
import pytest
import torch

from exgrpo.config import PoolRetention
from exgrpo.core.pool import ExperiencePool, Trajectory
from exgrpo.core.selection import pad_right
from exgrpo.core.trajectory_store import TrajectoryStore


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


def test_without_retirement_a_solved_group_is_an_outcome_like_any_other():
    pool = ExperiencePool(group_size=4, retire_solved=False)
    pool.observe_group(7, 2, [traj([1, 2])], 0)
    pool.observe_group(7, 4, [traj([3])], 1)  # solved 4/4: above rbound = K-1, so nothing changes
    assert not pool.is_retired(7) and pool.bucket_of(7) == 2 and len(pool.trajectories(7)) == 1
    assert pool.stats()["pool/retired"] == 0
    pool.observe_group(7, 1, [traj([4])], 2)  # still collected afterwards
    assert pool.bucket_of(7) == 1 and len(pool.trajectories(7)) == 2
    upto_k = ExperiencePool(group_size=4, rbound=4, retire_solved=False)
    upto_k.observe_group(7, 4, [traj([3])], 0)  # rbound = K: a solved group is collected into bucket K
    assert upto_k.buckets() == {4: [7]}
    upto_k.observe_group(7, 2, [traj([5])], 1)
    assert upto_k.stats()["pool/bucket_4"] == 0 and upto_k.stats()["pool/bucket_2"] == 1  # its curve stays dense


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


def _format_1(pool, renamed=False):
    """The pool's checkpoint as exgrpo wrote it until 2026-11-24 (a dict per question); with
    ``renamed``, under the key names used until 2026-11-23."""
    questions = []
    for qid in [q for qs in pool.buckets().values() for q in qs]:
        trajs = pool.trajectories(qid)
        questions.append({
            "qid": qid, ("k" if renamed else "num_correct"): pool.bucket_of(qid), "updated": 0,
            "tokens": [torch.tensor(t.tokens, dtype=torch.long) for t in trajs],
            ("behaviour_logp" if renamed else "behaviour_log_prob"):
                [torch.tensor(t.behaviour_log_prob, dtype=torch.float64) for t in trajs],
            "entropy": [t.entropy for t in trajs], "step": [t.step for t in trajs],
        })
    return {"questions": questions, "retired": sorted(pool.retired)}


def test_a_checkpoint_of_the_old_formats_still_loads(tmp_path):
    pool = ExperiencePool(group_size=8)
    pool.observe_group(1, 3, [traj([1, 2, 3]), traj([4])], 0)
    pool.observe_group(2, 8, [], 0)
    for renamed in (False, True):
        torch.save(_format_1(pool, renamed), tmp_path / "old.pt")
        other = ExperiencePool(group_size=8)
        other.load_state_dict(torch.load(tmp_path / "old.pt", weights_only=True))
        assert other.trajectories(1) == pool.trajectories(1) and other.bucket_of(1) == 3 and other.retired == {2}
        other.observe_group(1, 2, [traj([1, 2, 3])], 1)  # dedup still knows the loaded trajectories
        assert len(other.trajectories(1)) == 2


def test_a_checkpoint_without_the_groups_success_counts_loads_them_as_unknown():
    pool = ExperiencePool(group_size=4)
    pool.observe_group(1, 2, [Trajectory((1, 2), (-0.1, -0.2), 0.5, 0, 2)], 0)
    state = pool.state_dict()
    assert state["group_correct"].tolist() == [2]
    del state["group_correct"]  # written before the column existed
    other = ExperiencePool(group_size=4)
    other.load_state_dict(state)
    assert [t.group_correct for t in other.trajectories(1)] == [0]


def test_a_checkpoint_of_a_newer_format_is_a_one_line_error():
    state = ExperiencePool(group_size=8).state_dict()
    state["format"] = 99
    with pytest.raises(ValueError, match="format 99 is newer than this exgrpo reads .*upgrade exgrpo"):
        ExperiencePool(group_size=8).load_state_dict(state)


def test_the_checkpoint_is_a_few_flat_tensors():
    pool = ExperiencePool(group_size=8)
    for q in range(50):
        pool.observe_group(q, 1 + q % 7, [traj(range(q, q + 20)), traj(range(q, q + 30))], q)
    state = pool.state_dict()
    assert len(state) == 13 and all(torch.is_tensor(v) for k, v in state.items() if k != "format")
    assert state["tokens"].dtype == torch.int32 and state["tokens"].numel() == 50 * 50
    assert state["behaviour_log_prob"].dtype == torch.float32


def test_lowest_entropy_retention_keeps_the_lowest_in_collection_order():
    pool = ExperiencePool(group_size=8, max_per_question=2, retention=PoolRetention.LOWEST_ENTROPY)
    pool.observe_group(1, 3, [traj([1], ent=0.9), traj([2], ent=0.1), traj([3], ent=0.5)], 0)
    assert [t.tokens for t in pool.trajectories(1)] == [(2,), (3,)]
    pool.observe_group(1, 3, [traj([4], ent=0.05)], 1)
    assert [t.tokens for t in pool.trajectories(1)] == [(2,), (4,)]


class _ReferencePool:
    """The pool's semantics written the obvious O(pool) way (the unpacked layout of bench/legacy_pool.py)."""

    def __init__(self, group_size, max_per_question=None, max_questions=None):
        from collections import OrderedDict

        self.k, self.cap, self.max_q = group_size, max_per_question, max_questions
        self.entries, self.retired = OrderedDict(), set()

    def observe_group(self, qid, n, correct, step):
        if n >= self.k:
            self.retired.add(qid)
            self.entries.pop(qid, None)
            return
        if not 0 < n <= self.k - 1 or qid in self.retired:
            return
        e = self.entries.setdefault(qid, {"k": n, "t": [], "u": 0})
        e["k"], e["u"] = n, step
        for t in correct:
            if t.tokens not in [x.tokens for x in e["t"]]:
                e["t"].append(t)
        if self.cap is not None:
            e["t"] = e["t"][-self.cap:]
        if not e["t"]:
            del self.entries[qid]
            return
        while self.max_q is not None and len(self.entries) > self.max_q:
            del self.entries[min(self.entries, key=lambda q: self.entries[q]["u"])]

    def buckets(self):
        out = {}
        for q, e in self.entries.items():
            out.setdefault(e["k"], []).append(q)
        return dict(sorted(out.items()))


@pytest.mark.parametrize("caps,spill", [((None, None), False), ((2, 6), False), ((2, 6), True)])
def test_incremental_pool_matches_the_obvious_one_through_compactions(monkeypatch, tmp_path, caps, spill):
    """Random groups (retirements, re-buckets, duplicates, caps, evictions); compaction forced
    often: buckets, trajectories, stats and a checkpoint round trip agree with the reference,
    in RAM and with the token arrays spilled to memory-mapped files."""
    monkeypatch.setattr(TrajectoryStore, "MIN_DEAD_TOKENS", 0)
    monkeypatch.setattr(TrajectoryStore, "MIN_DEAD_ROWS", 0)
    rng = np.random.default_rng(0)
    spill_dir = tmp_path / "spill" if spill else None

    def new_pool():
        return ExperiencePool(4, 0, None, *caps, spill_dir=spill_dir)

    pool, ref = new_pool(), _ReferencePool(4, *caps)
    for step in range(300):
        qid, n = int(rng.integers(0, 30)), int(rng.integers(0, 5))
        correct = [traj(rng.integers(0, 3, size=int(rng.integers(1, 4))).tolist(), step, float(rng.random()))
                   for _ in range(n)]
        pool.observe_group(qid, n, correct, step)
        ref.observe_group(qid, n, correct, step)
        assert pool.buckets() == ref.buckets()
        if step % 25 == 0:
            clone = new_pool()
            clone.load_state_dict(pool.state_dict())
            pool = clone
    if spill:  # the arenas are mapped files of this pool's own directory; one pair alive at a time
        assert isinstance(pool._store.tokens, np.memmap)
        assert len(list(pool._store._spill.dir.glob("*.bin"))) == 2
    for q, e in ref.entries.items():
        assert [t.tokens for t in pool.trajectories(q)] == [t.tokens for t in e["t"]]
        assert [t.entropy for t in pool.trajectories(q)] == [t.entropy for t in e["t"]]
    assert pool.retired == ref.retired
    assert pool.stats()["pool/trajectories"] == sum(len(e["t"]) for e in ref.entries.values())
    # the padded batch the scorer gets, straight from the packed arrays, is what padding the tuples gives
    rows = [r for q in ref.entries for r in pool.rows(q)]
    tokens, log_prob, mask = pool.padded(rows)
    trajs = [t for e in ref.entries.values() for t in e["t"]]
    want_tokens, want_mask = pad_right([t.tokens for t in trajs])
    want_log_prob, _ = pad_right([t.behaviour_log_prob for t in trajs], dtype=torch.float32)
    assert torch.equal(tokens, want_tokens) and torch.equal(mask, want_mask) and torch.equal(log_prob, want_log_prob)


def test_parquet_snapshot_reads_with_pandas(tmp_path):
    pool = ExperiencePool(group_size=8)
    pool.observe_group(1, 3, [traj([1, 2])], 0)
    pool.observe_group(9, 8, [], 0)
    df = pd.read_parquet(pool.to_parquet(tmp_path / "pool.parquet"))
    assert list(df.qid) == [1, 9] and list(df.retired) == [False, True]
    assert list(df.tokens.iloc[0]) == [1, 2]
