"""Packed storage of trajectories: the pool's memory, independent of Python objects per token.

Token ids (int32) and behaviour log-probs (float32) of every stored trajectory live in two
contiguous arenas; a trajectory is a row of metadata columns (start, length, mean entropy, step,
token-id digest, its group's success count). Removing a row only marks it dead; once dead tokens outnumber live ones the arenas
are compacted in one vectorised pass (amortised O(1) per insert), and the caller remaps its row ids.

Resident cost: 8 bytes per stored token, plus ~40 bytes per trajectory. Capacity grows by doubling;
the untouched tail of a grown array is not resident (the OS maps its pages on first write). With a
``spill_dir`` the two token arenas are memory-mapped files there instead, for pools bigger than RAM.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
import weakref
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Trajectory:
    """One stored correct response."""

    tokens: tuple[int, ...]
    """Response token ids (no prompt, no padding), length T."""
    behaviour_log_prob: tuple[float, ...]
    """log pi_behaviour(token_t | prefix) for each of the T tokens, at collection time."""
    entropy: float
    """Mean token entropy of the behaviour policy over the T tokens."""
    step: int
    """Training step at which it was collected."""
    group_correct: int = 0
    """Correct rollouts among the K of the group it was collected from (1: a success found once in
    K); 0 where not recorded (a pool checkpoint written before this field)."""


def token_digest(tokens: np.ndarray) -> int:
    """A 64-bit digest of token ids (int32), stable across processes: the pool's dedup key."""
    return int.from_bytes(hashlib.blake2b(np.ascontiguousarray(tokens, dtype=np.int32).tobytes(), digest_size=8).digest(),
                          "little", signed=True)


def _grown(a: np.ndarray, need: int) -> np.ndarray:
    """``a`` with capacity for at least ``need`` elements (doubling), contents kept."""
    if need <= len(a):
        return a
    out = np.empty(max(need, 2 * len(a), 64), dtype=a.dtype)
    out[: len(a)] = a
    return out


class _SpillFiles:
    """The token and log-prob arenas as memory-mapped files in a directory (a pool bigger than
    RAM: the OS pages them in and out). Each allocation is a new sparse file; the one it replaces
    is deleted once copied."""

    def __init__(self, directory: str | Path) -> None:
        Path(directory).mkdir(parents=True, exist_ok=True)
        self.dir = Path(tempfile.mkdtemp(prefix="exgrpo-pool-", dir=directory))
        """This store's own sub-directory, deleted with the store (or at exit)."""
        weakref.finalize(self, shutil.rmtree, self.dir, True)
        self._n = 0
        self._paths: dict[str, Path] = {}

    def alloc(self, name: str, dtype: type, n: int, keep: np.ndarray | None = None) -> np.ndarray:
        """A fresh mapped array of ``n`` elements (at least 1), starting with ``keep``'s contents."""
        self._n += 1
        path = self.dir / f"{name}.{self._n}.bin"
        out = np.memmap(path, dtype=dtype, mode="w+", shape=(max(n, 1),))
        if keep is not None and len(keep):
            out[: len(keep)] = keep
        old, self._paths[name] = self._paths.get(name), path
        if old is not None:
            old.unlink(missing_ok=True)  # still mapped until its array is dropped; the name goes now
        return out

    def grown(self, name: str, a: np.ndarray, need: int) -> np.ndarray:
        if need <= len(a):
            return a
        return self.alloc(name, a.dtype, max(need, 2 * len(a), 1 << 16), keep=a)


class TrajectoryStore:
    """Append-mostly packed columns of trajectories; rows are addressed by integer ids."""

    MIN_DEAD_TOKENS = 1 << 16
    """Compaction waits for at least this many dead tokens (or :attr:`MIN_DEAD_ROWS` dead rows)."""
    MIN_DEAD_ROWS = 1 << 12

    def __init__(self, spill_dir: str | Path | None = None) -> None:
        self._spill = _SpillFiles(spill_dir) if spill_dir is not None else None
        """Where the token and log-prob arenas live as mapped files; None: in RAM."""
        self.tokens = np.empty(0, np.int32)
        self.log_prob = np.empty(0, np.float32)
        self.n_tokens = 0
        """Arena positions in use (live and dead)."""
        self.start = np.empty(0, np.int64)
        self.length = np.empty(0, np.int64)
        self.entropy = np.empty(0, np.float64)
        self.step = np.empty(0, np.int64)
        self.digest = np.empty(0, np.int64)
        self.group_correct = np.empty(0, np.int64)
        self.n_rows = 0
        """Rows in use (live and dead)."""
        self.live_rows = 0
        self.live_tokens = 0

    def add(self, tokens: np.ndarray, log_prob: np.ndarray, entropy: float, step: int, digest: int,
            group_correct: int = 0) -> int:
        """Append one trajectory; returns its row id. ``tokens`` (T,) int, ``log_prob`` (T,) float;
        ``group_correct``: the success count k of the group it came from (0: unknown)."""
        t = len(tokens)
        self.tokens = self._grown_arena("tokens", self.tokens, self.n_tokens + t)
        self.log_prob = self._grown_arena("log_prob", self.log_prob, self.n_tokens + t)
        self.tokens[self.n_tokens: self.n_tokens + t] = tokens
        self.log_prob[self.n_tokens: self.n_tokens + t] = log_prob
        row = self.n_rows
        for name in ("start", "length", "entropy", "step", "digest", "group_correct"):
            setattr(self, name, _grown(getattr(self, name), row + 1))
        self.start[row], self.length[row] = self.n_tokens, t
        self.entropy[row], self.step[row], self.digest[row] = entropy, step, digest
        self.group_correct[row] = group_correct
        self.n_tokens += t
        self.n_rows += 1
        self.live_rows += 1
        self.live_tokens += t
        return row

    def _grown_arena(self, name: str, a: np.ndarray, need: int) -> np.ndarray:
        return _grown(a, need) if self._spill is None else self._spill.grown(name, a, need)

    def remove(self, row: int) -> None:
        """Mark a row dead (its tokens are reclaimed by the next :meth:`compact`)."""
        self.live_rows -= 1
        self.live_tokens -= int(self.length[row])

    def wants_compaction(self) -> bool:
        """Dead tokens outnumber live ones (and are worth a pass)."""
        dead = self.n_tokens - self.live_tokens
        return (dead > max(self.live_tokens, self.MIN_DEAD_TOKENS)
                or self.n_rows - self.live_rows > max(self.live_rows, self.MIN_DEAD_ROWS))

    def gather(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Token ids and log-probs of ``rows``, concatenated in that order: (sum T,) each."""
        lengths = self.length[rows]
        if len(rows) == 0:
            return np.empty(0, np.int32), np.empty(0, np.float32)
        ends = np.cumsum(lengths)
        index = np.arange(int(ends[-1])) - np.repeat(ends - lengths - self.start[rows], lengths)
        return self.tokens[index], self.log_prob[index]

    def padded(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Rows right-padded with 0: token ids (N, T_max) int64, log-probs (N, T_max) float32 and
        the mask (N, T_max) bool, T_max = max(1, longest row)."""
        lengths = self.length[rows]
        t_max = max(int(lengths.max()) if len(rows) else 0, 1)
        mask = np.arange(t_max)[None, :] < lengths[:, None]
        tokens = np.zeros((len(rows), t_max), dtype=np.int64)
        log_prob = np.zeros((len(rows), t_max), dtype=np.float32)
        flat_tokens, flat_log_prob = self.gather(rows)
        tokens[mask], log_prob[mask] = flat_tokens, flat_log_prob  # row-major = the gather's order
        return tokens, log_prob, mask

    def compact(self, rows: np.ndarray, chunk_rows: int = 4096) -> None:
        """Keep only ``rows`` (live, in the given order), renumbered 0..len-1, tokens packed into
        fresh arrays of exactly their size (copied a chunk of rows at a time: no second full copy)."""
        lengths = self.length[rows].copy()
        total = int(lengths.sum())
        tokens = self._alloc("tokens", np.int32, total)
        log_prob = self._alloc("log_prob", np.float32, total)
        pos = 0
        for i in range(0, len(rows), chunk_rows):
            t, lp = self.gather(rows[i: i + chunk_rows])
            tokens[pos: pos + len(t)], log_prob[pos: pos + len(t)] = t, lp
            pos += len(t)
        self._set(tokens, log_prob, total, lengths, self.entropy[rows], self.step[rows], self.digest[rows],
                  self.group_correct[rows])

    def load(self, tokens: np.ndarray, log_prob: np.ndarray, lengths: np.ndarray, entropy: np.ndarray,
             step: np.ndarray, digest: np.ndarray, group_correct: np.ndarray | None = None) -> None:
        """Replace the contents with packed columns (rows 0..len(lengths)-1, tokens back to back);
        ``group_correct`` None: not recorded (0 for every row)."""
        n = len(tokens)
        if self._spill is None:
            arena, lp_arena = np.ascontiguousarray(tokens, dtype=np.int32), np.ascontiguousarray(log_prob, dtype=np.float32)
        else:
            arena, lp_arena = self._alloc("tokens", np.int32, n), self._alloc("log_prob", np.float32, n)
            arena[:n], lp_arena[:n] = tokens, log_prob
        self._set(arena, lp_arena, n, lengths, entropy, step, digest,
                  np.zeros(len(lengths), np.int64) if group_correct is None else group_correct)

    def _alloc(self, name: str, dtype: type, n: int) -> np.ndarray:
        return np.empty(n, dtype=dtype) if self._spill is None else self._spill.alloc(name, dtype, n)

    def _set(self, tokens: np.ndarray, log_prob: np.ndarray, n_tokens: int, lengths: np.ndarray,
             entropy: np.ndarray, step: np.ndarray, digest: np.ndarray, group_correct: np.ndarray) -> None:
        self.tokens, self.log_prob = tokens, log_prob
        self.length = np.array(lengths, dtype=np.int64)
        self.start = (np.cumsum(self.length) - self.length).astype(np.int64)
        self.entropy = np.array(entropy, dtype=np.float64)
        self.step = np.array(step, dtype=np.int64)
        self.digest = np.array(digest, dtype=np.int64)
        self.group_correct = np.array(group_correct, dtype=np.int64)
        self.n_tokens = self.live_tokens = n_tokens
        self.n_rows = self.live_rows = len(self.length)

    def packed_columns(self) -> dict[str, np.ndarray]:
        """After :meth:`compact`: the arrays themselves, exactly sized (no copy; a mapped arena
        stays mapped, so a checkpoint of a spilled pool streams from its files)."""
        n, r = self.n_tokens, self.n_rows
        return {"tokens": self.tokens[:n], "behaviour_log_prob": self.log_prob[:n], "length": self.length[:r],
                "entropy": self.entropy[:r], "step": self.step[:r], "digest": self.digest[:r],
                "group_correct": self.group_correct[:r]}

    def trajectory(self, row: int) -> Trajectory:
        """Row ``row`` as a :class:`Trajectory` (tuples; O(T))."""
        s, t = int(self.start[row]), int(self.length[row])
        return Trajectory(tuple(self.tokens[s: s + t].tolist()), tuple(self.log_prob[s: s + t].tolist()),
                          float(self.entropy[row]), int(self.step[row]), int(self.group_correct[row]))

    def nbytes(self) -> int:
        """Bytes held by the arrays (capacity, resident or not)."""
        return sum(getattr(self, n).nbytes for n in ("tokens", "log_prob", "start", "length", "entropy", "step", "digest",
                                                    "group_correct"))
