"""The experience pool's unpacked layout (a Python tuple per trajectory), kept only as the baseline of ``bench_pool.py``.

Same semantics as :class:`exgrpo.core.pool.ExperiencePool` for what the bench does (collect,
dedup, bucket, retire), in the old representation: a ``Trajectory`` of Python tuples per stored
response, an ``OrderedDict`` of questions scanned for every bucket query, and a checkpoint of one
small tensor per trajectory. Not used by exgrpo itself.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch

from exgrpo.core.trajectory_store import Trajectory


class LegacyPool:
    def __init__(self, group_size: int) -> None:
        self.k = group_size
        self.questions: OrderedDict[int, dict[str, Any]] = OrderedDict()
        self.retired_ids: set[int] = set()

    def observe_group(self, qid: int, num_correct: int, correct: list[Trajectory], step: int) -> None:
        if num_correct >= self.k:
            self.retired_ids.add(qid)
            self.questions.pop(qid, None)
            return
        if not 0 < num_correct < self.k or qid in self.retired_ids:
            return
        q = self.questions.setdefault(qid, {"k": num_correct, "trajs": [], "updated": step})
        q["k"], q["updated"] = num_correct, step
        have = {t.tokens for t in q["trajs"]}
        q["trajs"] += [t for t in correct if t.tokens not in have]

    def buckets(self) -> dict[int, list[int]]:
        by_k: dict[int, list[int]] = {}
        for qid, q in self.questions.items():  # the O(pool) scan of every step
            by_k.setdefault(q["k"], []).append(qid)
        return dict(sorted(by_k.items()))

    def trajectories(self, qid: int) -> list[Trajectory]:
        return list(self.questions[qid]["trajs"])

    def state_dict(self) -> dict[str, Any]:
        return {"retired": sorted(self.retired_ids), "questions": [
            {"qid": qid, "k": q["k"], "updated": q["updated"],
             "tokens": [torch.tensor(t.tokens, dtype=torch.long) for t in q["trajs"]],
             "log_prob": [torch.tensor(t.behaviour_log_prob, dtype=torch.float64) for t in q["trajs"]],
             "entropy": [t.entropy for t in q["trajs"]], "step": [t.step for t in q["trajs"]]}
            for qid, q in self.questions.items()]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.retired_ids = set(state["retired"])
        self.questions = OrderedDict()
        for q in state["questions"]:
            trajs = [Trajectory(tuple(tok.tolist()), tuple(lp.tolist()), e, s)
                     for tok, lp, e, s in zip(q["tokens"], q["log_prob"], q["entropy"], q["step"], strict=True)]
            self.questions[q["qid"]] = {"k": q["k"], "trajs": trajs, "updated": q["updated"]}
