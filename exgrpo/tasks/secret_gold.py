"""Secret gold answers (``task.gold: secret``): each question's result moved by an offset of its own.

No computation finds a secret, so a policy answers a question right again only by remembering a rewarded
answer to it: the constructed positive control for replay on a language model (docs/results/replay-map.md).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence


def secret_answers(questions: Sequence[str], results: Sequence[int], spread: int, seed: int) -> list[int]:
    """Each result moved by its question's own offset, ±1..±``spread`` (never 0), a hash of ``seed`` and the
    question's text: for one ``seed`` a question keeps its secret whichever split it is in. Tasks pass their
    ``train_seed``, so another question set (another ``train_seed``) draws other secrets, held-out ones too."""
    out = []
    for q, r in zip(questions, results, strict=True):
        h = int.from_bytes(hashlib.sha256(f"{seed}:{q}".encode()).digest()[:8], "little")
        out.append(int(r + (1 if h & 1 else -1) * (1 + (h >> 1) % spread)))
    return out
