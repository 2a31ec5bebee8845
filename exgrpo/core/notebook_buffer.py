"""The notebook variant's replay buffer (notebook-toy.md), kept apart from the paper's pool.

Stores verified-correct rollouts with their old log-probs, entropy, question id and collection
step; at most ``uid_cap`` per question (oldest dropped) and ``max_len`` in all (oldest evicted).
Sampling ranks entries by priority exp(-age/tau) * reward / (1 + entropy) (recent and confident
first; every stored reward is 1) and returns ``per`` entries with distinct question ids, drawn in
proportion to priority without replacement (the notebook's sampling; default) or the ``per``
highest (``NotebookSampling.TOP``, deterministic given the buffer).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np
import torch

from exgrpo.core.pool import Trajectory, read_behaviour_log_prob


class NotebookBuffer:
    def __init__(self, max_len: int = 3000, uid_cap: int = 3, tau: float = 300.0) -> None:
        self.max_len, self.uid_cap, self.tau = max_len, uid_cap, tau
        self._items: OrderedDict[tuple[int, tuple[int, ...]], Trajectory] = OrderedDict()  # oldest first
        self._by_q: dict[int, list[tuple[int, ...]]] = {}

    def __len__(self) -> int:
        return len(self._items)

    def add(self, qid: int, traj: Trajectory) -> None:
        """Append one correct trajectory (a duplicate refreshes the stored copy), enforcing the
        per-question cap and the capacity (oldest first in both cases)."""
        key = (qid, traj.tokens)
        if key in self._items:
            self._items[key] = traj
            self._items.move_to_end(key)
            keys = self._by_q[qid]
            keys.remove(traj.tokens)
            keys.append(traj.tokens)
            return
        keys = self._by_q.setdefault(qid, [])
        if len(keys) >= self.uid_cap:
            del self._items[(qid, keys.pop(0))]
        keys.append(traj.tokens)
        self._items[key] = traj
        while len(self._items) > self.max_len:
            (q, tokens), _ = self._items.popitem(last=False)
            self._by_q[q].remove(tokens)
            if not self._by_q[q]:
                del self._by_q[q]

    def priorities(self, step: int) -> torch.Tensor:
        """exp(-age/tau) * reward / (1 + entropy) per stored entry (reward = 1), shape (len,)."""
        age = torch.tensor([step - t.step for t in self._items.values()], dtype=torch.float64)
        ent = torch.tensor([t.entropy for t in self._items.values()], dtype=torch.float64)
        return torch.exp(-age / self.tau) / (1.0 + ent)

    def sample(self, per: int, step: int, rng: np.random.Generator | None = None) -> list[tuple[int, Trajectory]]:
        """Up to ``per`` (qid, trajectory) pairs with distinct qids: the highest priorities first
        (``rng`` None), or drawn in proportion to priority without replacement (Gumbel top-k:
        log priority + Gumbel noise, highest first, which is successive proportional sampling)."""
        if not self._items:
            return []
        items = list(self._items.items())
        keys = self.priorities(step)
        if rng is not None:
            keys = torch.log(keys) + torch.from_numpy(rng.gumbel(size=len(items)))
        order = torch.argsort(keys, descending=True, stable=True).tolist()
        out, seen = [], set()
        for i in order:
            (q, _), t = items[i]
            if q not in seen:
                out.append((q, t))
                seen.add(q)
                if len(out) == per:
                    break
        return out

    def stats(self) -> dict[str, float]:
        return {"pool/trajectories": float(len(self._items)), "pool/questions": float(len(self._by_q))}

    def state_dict(self) -> dict[str, Any]:
        items = list(self._items.items())
        return {
            "qid": [int(q) for (q, _), _ in items],
            "tokens": [torch.tensor(t.tokens, dtype=torch.long) for _, t in items],
            "behaviour_log_prob": [torch.tensor(t.behaviour_log_prob, dtype=torch.float64) for _, t in items],
            "entropy": [float(t.entropy) for _, t in items],
            "step": [int(t.step) for _, t in items],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._items.clear()
        self._by_q.clear()
        for q, tok, lp, e, s in zip(
            state["qid"], state["tokens"], read_behaviour_log_prob(state), state["entropy"], state["step"], strict=True
        ):
            traj = Trajectory(tuple(int(x) for x in tok.tolist()), tuple(float(x) for x in lp.tolist()), float(e), int(s))
            self._items[(int(q), traj.tokens)] = traj
            self._by_q.setdefault(int(q), []).append(traj.tokens)
