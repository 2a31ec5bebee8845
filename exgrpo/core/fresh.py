"""Fresh training questions: reshuffled passes over the train ids, skipping retired questions."""

from __future__ import annotations

from collections.abc import Sequence
from collections.abc import Set as AbstractSet

import numpy as np


class FreshSampler:
    """A reshuffled pass over the train ids, cycling; retired questions are dropped at the next
    reshuffle (reference behaviour: from the next epoch on)."""

    def __init__(self, ids: Sequence[int], rng: np.random.Generator) -> None:
        self.ids = list(ids)
        self.rng = rng
        self.order: list[int] = []
        self.pos = 0
        self.passes = 0

    def next(self, n: int, retired: AbstractSet[int] = frozenset()) -> list[int]:
        """The next ``n`` question ids (a question repeats only across passes)."""
        out: list[int] = []
        while len(out) < n:
            if self.pos >= len(self.order):
                live = [q for q in self.ids if q not in retired] or self.ids
                self.order = [live[i] for i in self.rng.permutation(len(live))]
                self.pos = 0
                self.passes += 1
            take = min(n - len(out), len(self.order) - self.pos)
            out += self.order[self.pos : self.pos + take]
            self.pos += take
        return out

    def state_dict(self) -> dict:
        return {"order": list(self.order), "pos": self.pos, "passes": self.passes}

    def load_state_dict(self, state: dict) -> None:
        self.order, self.pos, self.passes = list(state["order"]), int(state["pos"]), int(state["passes"])
