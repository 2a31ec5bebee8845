"""The experience pool: correct trajectories per question, bucketed by the latest success count.

Semantics (exgrpo-spec.md §2, §3):
- After a group of K rollouts for question q with k correct:
  - k == K  -> q is retired, permanently: its entries are deleted and it is never sampled again
    (``retire_solved=False``: k == K is an outcome like any other, under the bounds below);
  - lbound < k <= rbound -> q's new distinct correct trajectories are stored (dedup by token ids)
    and q moves to bucket k (its *latest* k, not cumulative);
  - otherwise (e.g. k == 0) nothing changes: q keeps its old bucket and trajectories.
- Trajectories are stored as token ids (never decoded text: spec §11.3) with the behaviour policy's
  per-token log-probs, their mean entropy at collection and the step they were collected at.

Beyond the reference (off by default): a cap per question (a retention policy chooses which
trajectories stay: the newest, or the lowest-entropy ones) and a global cap on questions (least
recently updated evicted).

Scale: trajectories are packed in a :class:`TrajectoryStore` (8 bytes per token); bucket
membership, counts and the eviction order are maintained on every insert, retire and evict, so a
step costs O(batch), not O(pool); a checkpoint is a dozen flat tensors.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from exgrpo.config.options import PoolRetention
from exgrpo.core.trajectory_store import Trajectory, TrajectoryStore, token_digest

POOL_FORMAT = 2
"""Version of :meth:`ExperiencePool.state_dict`'s layout (1: a list of per-question dicts, before 2026-11-24)."""


@dataclass(slots=True)
class _Entry:
    num_correct: int
    """Its latest success count k (correct rollouts of K): the bucket it is in."""
    seq: int
    """Position in the order of first collection (an entry deleted and collected again gets a new one)."""
    updated: int = 0
    rows: list[int] = field(default_factory=list)
    """Its trajectories' row ids in the store, oldest first."""
    digests: list[int] = field(default_factory=list)
    """Token-id digest of each row (dedup)."""


class BucketView(Sequence[int]):
    """The question ids of one bucket in order of first collection; O(1) length and indexing."""

    def __init__(self, seqs: list[int], qid_of: dict[int, int]) -> None:
        self._seqs, self._qid_of = seqs, qid_of

    def __len__(self) -> int:
        return len(self._seqs)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self._qid_of[s] for s in self._seqs[i]]
        return self._qid_of[self._seqs[i]]


class ExperiencePool:
    """Per-question store of correct trajectories with correctness buckets and retirement."""

    def __init__(
        self,
        group_size: int,
        lbound: int = 0,
        rbound: int | None = None,
        max_per_question: int | None = None,
        max_questions: int | None = None,
        retention: PoolRetention = PoolRetention.NEWEST,
        spill_dir: str | Path | None = None,
        retire_solved: bool = True,
    ) -> None:
        self.group_size = group_size
        self.retire_solved = retire_solved
        self.lbound = lbound
        self.rbound = group_size - 1 if rbound is None else rbound
        self.max_per_question = max_per_question
        self.max_questions = max_questions
        self.retention = PoolRetention(retention)
        self._store = TrajectoryStore(spill_dir)
        self._entries: dict[int, _Entry] = {}
        self._retired: set[int] = set()
        self._next_seq = 0
        self._qid_of: dict[int, int] = {}
        """seq -> qid of every entry in the pool."""
        self._bucket_seqs: dict[int, list[int]] = {}
        """bucket k -> seqs of its questions, ascending (= order of first collection)."""
        self._evict_heap: list[tuple[int, int, int]] = []
        """(updated, seq, qid) pushed on every update, stale ones skipped (only with max_questions)."""

    # ---------------------------------------------------------------- updates
    def eligible(self, num_correct: int) -> bool:
        """Whether a group with k = num_correct correct rollouts is collected: lbound < k <= rbound."""
        return self.lbound < num_correct <= self.rbound

    def observe_group(self, qid: int, num_correct: int, correct: list[Trajectory], step: int,
                      collect: bool = True) -> None:
        """Apply one group's outcome: retire at k == K (if ``retire_solved``), else collect and
        re-bucket if eligible.

        ``collect=False`` applies retirement only (the reference retires during warm-up too but
        collects only once replay has started).
        """
        if num_correct >= self.group_size and self.retire_solved:
            self.retire(qid)
            return
        if not collect or not self.eligible(num_correct) or qid in self._retired:
            return
        entry = self._entries.get(qid)
        if entry is None:
            entry = self._entries[qid] = _Entry(num_correct=num_correct, seq=self._next_seq)
            self._next_seq += 1
            self._qid_of[entry.seq] = qid
            insort(self._bucket_seqs.setdefault(num_correct, []), entry.seq)
        elif entry.num_correct != num_correct:
            self._move(entry, num_correct)
        entry.updated = step
        for traj in correct:
            tokens = np.asarray(traj.tokens, dtype=np.int32)
            digest = token_digest(tokens)
            if digest not in entry.digests:
                entry.rows.append(self._store.add(tokens, np.asarray(traj.behaviour_log_prob, dtype=np.float32),
                                                  traj.entropy, traj.step, digest, traj.group_correct))
                entry.digests.append(digest)
        if self.max_per_question is not None and len(entry.rows) > self.max_per_question:
            self._retain(entry)
        if not entry.rows:  # an eligible k with no trajectory to keep cannot be replayed
            self._delete(qid)
            return
        if self.max_questions is not None:
            heapq.heappush(self._evict_heap, (entry.updated, entry.seq, qid))
            self._evict()
        self._maybe_compact()

    def retire(self, qid: int) -> None:
        """Retire a question for good (solved K/K): delete its entry, never sample it again."""
        self._retired.add(qid)
        if qid in self._entries:
            self._delete(qid)

    def _move(self, entry: _Entry, num_correct: int) -> None:
        old = self._bucket_seqs[entry.num_correct]
        del old[bisect_left(old, entry.seq)]
        insort(self._bucket_seqs.setdefault(num_correct, []), entry.seq)
        entry.num_correct = num_correct

    def _retain(self, entry: _Entry) -> None:
        """Drop trajectories beyond ``max_per_question`` as the retention policy says."""
        n = len(entry.rows)
        if self.retention == PoolRetention.NEWEST:
            keep = list(range(n - self.max_per_question, n))
        else:  # lowest entropy; ties keep the older; the kept stay in collection order
            order = sorted(range(n), key=lambda i: (self._store.entropy[entry.rows[i]], i))
            keep = sorted(order[: self.max_per_question])
        for i in sorted(set(range(n)) - set(keep)):
            self._store.remove(entry.rows[i])
        entry.rows = [entry.rows[i] for i in keep]
        entry.digests = [entry.digests[i] for i in keep]

    def _delete(self, qid: int) -> None:
        entry = self._entries.pop(qid)
        seqs = self._bucket_seqs[entry.num_correct]
        del seqs[bisect_left(seqs, entry.seq)]
        del self._qid_of[entry.seq]
        for row in entry.rows:
            self._store.remove(row)

    def _evict(self) -> None:
        """Least recently updated questions out (ties: the first collected), O(log n) each."""
        while len(self._entries) > self.max_questions:
            updated, seq, qid = heapq.heappop(self._evict_heap)
            entry = self._entries.get(qid)
            if entry is not None and entry.seq == seq and entry.updated == updated:
                self._delete(qid)
        if len(self._evict_heap) > 4 * len(self._entries) + 64:  # drop the stale records
            self._evict_heap = [(e.updated, e.seq, q) for q, e in self._entries.items()]
            heapq.heapify(self._evict_heap)

    def _maybe_compact(self) -> None:
        if self._store.wants_compaction():
            self._compact()

    def _compact(self) -> None:
        """Pack the store's live rows (entries in collection order) and renumber the entries' rows."""
        entries = sorted(self._entries.values(), key=lambda e: e.seq)
        rows = np.fromiter((r for e in entries for r in e.rows), dtype=np.int64)
        self._store.compact(rows)
        i = 0
        for e in entries:
            e.rows = list(range(i, i + len(e.rows)))
            i += len(e.rows)

    # ---------------------------------------------------------------- queries
    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, qid: int) -> bool:
        return qid in self._entries

    def is_retired(self, qid: int) -> bool:
        return qid in self._retired

    @property
    def retired(self) -> AbstractSet[int]:
        """The retired question ids: the pool's own set, read-only by contract (no copy per step)."""
        return self._retired

    def bucket_of(self, qid: int) -> int:
        return self._entries[qid].num_correct

    def trajectories(self, qid: int) -> list[Trajectory]:
        """The question's stored trajectories, oldest first (built on demand: O(its tokens))."""
        return [self._store.trajectory(r) for r in self._entries[qid].rows]

    def rows(self, qid: int) -> list[int]:
        """The question's trajectories as row ids of the store, oldest first."""
        return list(self._entries[qid].rows)

    def trajectory(self, row: int) -> Trajectory:
        """One stored trajectory by row id (O(its tokens))."""
        return self._store.trajectory(row)

    def padded(self, rows: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Stored rows right-padded with 0, straight from the packed arrays: token ids (N, T) long,
        behaviour log-probs (N, T) float32 and mask (N, T) bool, T = max(1, longest)."""
        tokens, log_prob, mask = self._store.padded(np.asarray(rows, dtype=np.int64))
        return torch.from_numpy(tokens), torch.from_numpy(log_prob), torch.from_numpy(mask)

    def bucket_views(self) -> Mapping[int, BucketView]:
        """Bucket k -> its question ids in order of first collection, non-empty buckets only, keys
        ascending: views, O(number of buckets) to build (what the sampler reads every step)."""
        return {k: BucketView(seqs, self._qid_of) for k, seqs in sorted(self._bucket_seqs.items()) if seqs}

    def buckets(self) -> dict[int, list[int]]:
        """Bucket k -> question ids (order of first collection), over non-retired questions with
        trajectories; a copy (O(pool)): for inspection, the sampler reads :meth:`bucket_views`."""
        return {k: list(v) for k, v in self.bucket_views().items()}

    def stats(self) -> dict[str, float]:
        """Pool statistics with MLflow-safe names: pool/questions, pool/trajectories,
        pool/retired and pool/bucket_<k> for k in 1..K-1, and K where a solved group can be collected
        (no retirement, bucket_rbound = K) (zeros included, so curves are dense)."""
        out: dict[str, float] = {
            "pool/questions": float(len(self._entries)),
            "pool/trajectories": float(self._store.live_rows),
            "pool/retired": float(len(self._retired)),
        }
        top = self.group_size if not self.retire_solved and self.rbound >= self.group_size else self.group_size - 1
        counts = {k: 0 for k in range(1, top + 1)}
        for k, seqs in self._bucket_seqs.items():
            if seqs or k in counts:
                counts[k] = len(seqs)
        for k, n in sorted(counts.items()):
            out[f"pool/bucket_{k}"] = float(n)
        return out

    def resident_bytes(self) -> int:
        """Bytes of the packed trajectory store (arrays' capacity; the bench measures the process RSS)."""
        return self._store.nbytes()

    # ---------------------------------------------------------------- persistence
    def state_dict(self) -> dict[str, Any]:
        """A few flat tensors (format :data:`POOL_FORMAT`), loadable with ``weights_only=True``:
        per question (collection order) its id, bucket, last update and trajectory count; per
        trajectory (grouped by question, oldest first) its length, entropy, step and digest; all
        token ids and behaviour log-probs back to back; per trajectory also its group's success count
        (``group_correct``, absent from checkpoints written before it: read as 0, unknown). The store is compacted into that order
        first and the tensors share its arrays (valid until the pool changes)."""
        self._compact()
        entries = sorted(self._entries.items(), key=lambda item: item[1].seq)

        def col(values, dtype):
            return torch.from_numpy(np.asarray(values, dtype=dtype))

        packed = {k: torch.from_numpy(np.asarray(v)) for k, v in self._store.packed_columns().items()}
        return {
            "format": POOL_FORMAT,
            "qid": col([q for q, _ in entries], np.int64),
            "num_correct": col([e.num_correct for _, e in entries], np.int64),
            "updated": col([e.updated for _, e in entries], np.int64),
            "n_trajectories": col([len(e.rows) for _, e in entries], np.int64),
            **packed,
            "retired": col(sorted(self._retired), np.int64),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (format 2) or a checkpoint of format 1 (before 2026-11-24)."""
        version = int(state.get("format", 1))
        if version == 1:
            state = _from_format_1(state)
        elif version != POOL_FORMAT:
            raise ValueError(f"experience pool checkpoint format {version} is newer than this exgrpo reads "
                             f"(format {POOL_FORMAT}); upgrade exgrpo to load it")
        qids = state["qid"].tolist()
        counts = state["n_trajectories"].tolist()
        self._store.load(state["tokens"].numpy(), state["behaviour_log_prob"].numpy(), state["length"].numpy(),
                         state["entropy"].numpy(), state["step"].numpy(), state["digest"].numpy(),
                         state["group_correct"].numpy() if "group_correct" in state else None)
        digests = state["digest"].tolist()
        self._entries, self._qid_of, self._bucket_seqs = {}, {}, {}
        row = 0
        for seq, (qid, k, updated, n) in enumerate(zip(qids, state["num_correct"].tolist(), state["updated"].tolist(),
                                                       counts, strict=True)):
            self._entries[qid] = _Entry(k, seq, updated, list(range(row, row + n)), digests[row: row + n])
            self._qid_of[seq] = qid
            self._bucket_seqs.setdefault(k, []).append(seq)
            row += n
        self._next_seq = len(qids)
        self._retired = set(int(q) for q in state["retired"].tolist())
        self._evict_heap = [(e.updated, e.seq, q) for q, e in self._entries.items()] if self.max_questions else []
        heapq.heapify(self._evict_heap)

    def to_frame(self):
        """One row per stored trajectory (retired questions are listed with empty tokens)."""
        import pandas as pd

        rows = []
        for qid, entry in sorted(self._entries.items(), key=lambda item: item[1].seq):
            for t in self.trajectories(qid):
                rows.append({"qid": qid, "bucket": entry.num_correct, "retired": False, "tokens": list(t.tokens),
                             "behaviour_log_prob": list(t.behaviour_log_prob), "entropy": t.entropy, "step": t.step})
        for qid in sorted(self._retired):
            rows.append({"qid": qid, "bucket": self.group_size, "retired": True, "tokens": [], "behaviour_log_prob": [],
                         "entropy": np.nan, "step": -1})
        return pd.DataFrame(rows, columns=["qid", "bucket", "retired", "tokens", "behaviour_log_prob", "entropy", "step"])

    def to_parquet(self, path: str | Path) -> Path:
        """Write a snapshot readable with ``pandas.read_parquet``."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.to_frame().to_parquet(path, index=False)
        return path


def _from_format_1(state: dict[str, Any]) -> dict[str, Any]:
    """A format-1 pool checkpoint (a list of per-question dicts of per-trajectory tensors; keys
    ``k`` / ``behaviour_logp`` before 2026-11-23) in today's layout."""
    qs = state["questions"]
    tokens = [t.to(torch.int32) for q in qs for t in q["tokens"]]
    log_prob = [lp.to(torch.float32) for q in qs for lp in read_behaviour_log_prob(q)]

    def cat(parts, dtype):
        return torch.cat(parts) if parts else torch.zeros(0, dtype=dtype)

    return {
        "qid": torch.tensor([int(q["qid"]) for q in qs], dtype=torch.int64),
        "num_correct": torch.tensor([int(q["num_correct"] if "num_correct" in q else q["k"]) for q in qs], dtype=torch.int64),
        "updated": torch.tensor([int(q["updated"]) for q in qs], dtype=torch.int64),
        "n_trajectories": torch.tensor([len(q["tokens"]) for q in qs], dtype=torch.int64),
        "length": torch.tensor([len(t) for t in tokens], dtype=torch.int64),
        "entropy": torch.tensor([float(e) for q in qs for e in q["entropy"]], dtype=torch.float64),
        "step": torch.tensor([int(x) for q in qs for x in q["step"]], dtype=torch.int64),
        "digest": torch.tensor([token_digest(t.numpy()) for t in tokens], dtype=torch.int64),
        "tokens": cat(tokens, torch.int32),
        "behaviour_log_prob": cat(log_prob, torch.float32),
        "retired": torch.tensor([int(q) for q in state["retired"]], dtype=torch.int64),
    }


def read_behaviour_log_prob(state: dict[str, Any]) -> Any:
    """The stored behaviour log-probs of a per-question (format 1) or notebook-buffer record;
    checkpoints written before the one-name rename call them ``behaviour_logp``."""
    return state["behaviour_log_prob"] if "behaviour_log_prob" in state else state["behaviour_logp"]


__all__ = ["BucketView", "ExperiencePool", "POOL_FORMAT", "Trajectory", "read_behaviour_log_prob"]
