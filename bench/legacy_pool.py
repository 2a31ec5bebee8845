"""The experience pool's layout before issue 14, kept only as the baseline of ``bench_pool.py``:
a Python tuple per trajectory, an O(pool) scan per bucket query, a tensor per trajectory in a
checkpoint. Not used by exgrpo itself."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import torch

from exgrpo.core.trajectory_store import Trajectory


@dataclass
class _Entry:
    num_correct: int
    """Its latest success count k (correct rollouts of K): the bucket it is in."""
    trajectories: list[Trajectory] = field(default_factory=list)
    updated: int = 0


class LegacyPool:
    """Per-question store of correct trajectories with correctness buckets and retirement."""

    def __init__(
        self,
        group_size: int,
        lbound: int = 0,
        rbound: int | None = None,
        max_per_question: int | None = None,
        max_questions: int | None = None,
    ) -> None:
        self.group_size = group_size
        self.lbound = lbound
        self.rbound = group_size - 1 if rbound is None else rbound
        self.max_per_question = max_per_question
        self.max_questions = max_questions
        self._entries: OrderedDict[int, _Entry] = OrderedDict()  # insertion order = first collection
        self._retired: set[int] = set()

    # ---------------------------------------------------------------- updates
    def eligible(self, num_correct: int) -> bool:
        """Whether a group with k = num_correct correct rollouts is collected: lbound < k <= rbound."""
        return self.lbound < num_correct <= self.rbound

    def observe_group(self, qid: int, num_correct: int, correct: list[Trajectory], step: int,
                      collect: bool = True) -> None:
        """Apply one group's outcome: retire at k == K, else collect and re-bucket if eligible.

        ``collect=False`` applies retirement only (the reference retires during warm-up too but
        collects only once replay has started).
        """
        if num_correct >= self.group_size:
            self.retire(qid)
            return
        if not collect or not self.eligible(num_correct) or qid in self._retired:
            return
        entry = self._entries.get(qid)
        if entry is None:
            entry = self._entries[qid] = _Entry(num_correct=num_correct)
        entry.num_correct = num_correct
        entry.updated = step
        seen = {t.tokens for t in entry.trajectories}
        for traj in correct:
            if traj.tokens not in seen:
                entry.trajectories.append(traj)
                seen.add(traj.tokens)
        if self.max_per_question is not None and len(entry.trajectories) > self.max_per_question:
            del entry.trajectories[: len(entry.trajectories) - self.max_per_question]
        if not entry.trajectories:  # an eligible k with no trajectory to keep cannot be replayed
            del self._entries[qid]
            return
        self._evict()

    def retire(self, qid: int) -> None:
        """Retire a question for good (solved K/K): delete its entry, never sample it again."""
        self._retired.add(qid)
        self._entries.pop(qid, None)

    def _evict(self) -> None:
        if self.max_questions is None:
            return
        while len(self._entries) > self.max_questions:
            oldest = min(self._entries, key=lambda q: self._entries[q].updated)
            del self._entries[oldest]

    # ---------------------------------------------------------------- queries
    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, qid: int) -> bool:
        return qid in self._entries

    def is_retired(self, qid: int) -> bool:
        return qid in self._retired

    @property
    def retired(self) -> frozenset[int]:
        return frozenset(self._retired)

    def bucket_of(self, qid: int) -> int:
        return self._entries[qid].num_correct

    def trajectories(self, qid: int) -> list[Trajectory]:
        return list(self._entries[qid].trajectories)

    def buckets(self) -> dict[int, list[int]]:
        """Bucket k -> question ids (insertion order), over non-retired questions with trajectories."""
        out: dict[int, list[int]] = {}
        for qid, entry in self._entries.items():
            out.setdefault(entry.num_correct, []).append(qid)
        return dict(sorted(out.items()))

    def stats(self) -> dict[str, float]:
        """Pool statistics with MLflow-safe names: pool/questions, pool/trajectories,
        pool/retired and pool/bucket_<k> for k in 1..K-1 (zeros included, so curves are dense)."""
        out: dict[str, float] = {
            "pool/questions": float(len(self._entries)),
            "pool/trajectories": float(sum(len(e.trajectories) for e in self._entries.values())),
            "pool/retired": float(len(self._retired)),
        }
        counts = {k: 0 for k in range(1, self.group_size)}
        for entry in self._entries.values():
            counts[entry.num_correct] = counts.get(entry.num_correct, 0) + 1
        for k, n in sorted(counts.items()):
            out[f"pool/bucket_{k}"] = float(n)
        return out

    # ---------------------------------------------------------------- persistence
    def state_dict(self) -> dict[str, Any]:
        """Plain containers and tensors only, so a checkpoint loads with ``weights_only=True``."""
        questions = []
        for qid, entry in self._entries.items():
            questions.append(
                {
                    "qid": int(qid),
                    "num_correct": int(entry.num_correct),
                    "updated": int(entry.updated),
                    "tokens": [torch.tensor(t.tokens, dtype=torch.long) for t in entry.trajectories],
                    "behaviour_log_prob": [
                        torch.tensor(t.behaviour_log_prob, dtype=torch.float64) for t in entry.trajectories
                    ],
                    "entropy": [float(t.entropy) for t in entry.trajectories],
                    "step": [int(t.step) for t in entry.trajectories],
                }
            )
        return {"questions": questions, "retired": sorted(int(q) for q in self._retired)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._entries.clear()
        for q in state["questions"]:
            trajs = [
                Trajectory(tuple(int(x) for x in tok.tolist()), tuple(float(x) for x in lp.tolist()), ent, st)
                for tok, lp, ent, st in zip(q["tokens"], q["behaviour_log_prob"], q["entropy"], q["step"], strict=True)
            ]
            self._entries[int(q["qid"])] = _Entry(num_correct=int(q["num_correct"]), trajectories=trajs, updated=int(q["updated"]))
        self._retired = set(int(q) for q in state["retired"])
