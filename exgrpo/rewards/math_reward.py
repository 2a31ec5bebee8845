"""Binary math reward graded with `math-verify <https://pypi.org/project/math-verify/>`_.

Reward protocol (one response, one gold string):

1. **Sanitise.** NUL bytes are removed. The response is never truncated: a cut could
   turn a long expression into a different, shorter one.
2. **Extract** with :func:`~exgrpo.rewards.extraction.extract_answer`, strict by default
   (one distinct complete ``\\boxed{...}``, no nested box, ASCII digits, at most
   ``max_answer_chars``; the last-number fallback only with
   :attr:`~exgrpo.config.AnswerFormat.BOXED_OR_LAST_NUMBER`). The prediction given to
   math-verify is ``"\\boxed{" + answer + "}"``; with no answer the item is
   :attr:`RewardStatus.NO_ANSWER` and math-verify never sees the raw text.
3. **Grade.** ``gold_parsed = parse("$" + gold + "$")`` (the reference
   convention), ``pred_parsed = parse(prediction)``, and the reward is 1.0 if
   ``verify(g, p)`` holds for any pair ``(g, p)`` of parsed candidates
   (math-verify returns up to two per string: a sympy object and a string
   fallback), else 0.0.

Safety model: math-verify bounds its own work with ``signal.alarm`` (integer
seconds), which only works on a process's main thread and cannot interrupt
code stuck inside a C call. :class:`MathVerifier` therefore grades in a
``spawn`` process pool by default: each item runs on a worker's main thread
with math-verify's timeouts *and* is bounded from the parent by a per-item
deadline. A worker that misses its deadline is killed and the pool recycled;
a worker that dies (segfault, ``os._exit``, OOM) is detected and only the
responsible item is marked. In every failure mode the item gets reward 0 and
is counted; :meth:`MathVerifier.score` never raises for any string input.

Scripts that use the pool must guard their entry point with
``if __name__ == "__main__":`` (``spawn`` re-imports the main module).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import queue
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool

from exgrpo.config.options import AnswerFormat
from exgrpo.rewards.extraction import DEFAULT_MAX_ANSWER_CHARS, extract_answer, warn_if_lenient
from exgrpo.rewards.grading import (  # noqa: F401  (re-exported: the reward's rule lives in grading.py)
    GRADER_NAME,
    MAX_VERIFY_PAIRS,
    RewardBatch,
    RewardStatus,
    _worker_init,
    build_prediction,
    grader_version,
    score_item,
)

logger = logging.getLogger(__name__)

__all__ = [
    "GRADER_NAME",
    "MathVerifier",
    "RewardBatch",
    "RewardStatus",
    "build_prediction",
    "extract_answer",
    "grader_version",
    "score_item",
]

# --------------------------------------------------------------------------- #
# The verifier
# --------------------------------------------------------------------------- #

ItemFn = Callable[[str | None, str, int, int], str]


def _kill_pool(pool: ProcessPoolExecutor, grace_s: float = 0.0) -> None:
    """Shut ``pool`` down without ever blocking on a hung worker.

    ``ProcessPoolExecutor`` has no public way to kill a busy worker, so this
    reads its private ``_processes`` map (pid -> Process); if that attribute
    ever disappears the workers are still asked to exit via ``shutdown``.
    """
    procs = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    deadline = time.monotonic() + grace_s
    for p in procs:
        p.join(timeout=max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
    for p in procs:
        p.join(timeout=5.0)


@contextlib.contextmanager
def _no_stray_alarm() -> Iterator[None]:
    """Run in-process grading so that no math-verify ``SIGALRM`` outlives it.

    math-verify arms ``signal.alarm`` per call and nests its timeouts (``verify`` parses), so an
    alarm can stay armed after it returns and fire later inside unrelated code. On exit any
    pending alarm is cancelled and the caller's ``SIGALRM`` handler is put back.
    """
    previous = signal.getsignal(signal.SIGALRM)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


class _PoolHolder:
    """Mutable slot for the worker pool (shared with the verifier's finalizer)."""

    def __init__(self) -> None:
        self.pool: ProcessPoolExecutor | None = None

    def shutdown(self, grace_s: float = 0.0) -> None:
        pool, self.pool = self.pool, None
        if pool is not None:
            _kill_pool(pool, grace_s=grace_s)


def _harvest(in_flight: dict[Future[str], tuple[int, float]], statuses: list[RewardStatus | None],
             pending: deque[int]) -> list[int]:
    """Take the finished futures out of ``in_flight``: each item's status into ``statuses`` (a cancelled
    one back to the front of ``pending``). Returns the items whose worker pool broke under them."""
    broken: list[int] = []
    for fut in [f for f in in_flight if f.done()]:
        i, _ = in_flight.pop(fut)
        if fut.cancelled():  # not expected; grade it again
            pending.appendleft(i)
            continue
        exc = fut.exception()
        if exc is None:
            try:
                statuses[i] = RewardStatus(fut.result())
            except ValueError:
                statuses[i] = RewardStatus.ERROR
        elif isinstance(exc, BrokenProcessPool):
            broken.append(i)
        else:
            statuses[i] = RewardStatus.ERROR
    return broken


class MathVerifier:
    """Batch binary math reward using math-verify, safe against hostile responses.

    Args:
        workers: number of ``spawn`` worker processes; ``0`` grades in-process
            (only on the main thread; relies on math-verify's signal timeouts
            alone, so a C-level hang cannot be interrupted there).
        parse_timeout: math-verify ``parsing_timeout`` per ``parse`` call (whole seconds, >= 1).
        verify_timeout: math-verify ``timeout_seconds`` per comparison (whole seconds, >= 1).
        item_timeout: outer per-item deadline in seconds (pool only). Default:
            ``2 * parse_timeout + MAX_VERIFY_PAIRS * verify_timeout + 2``, i.e.
            just above the worst case the inner timeouts allow.
        answer_format: where an answer must be (strict ``boxed`` by default; see
            :mod:`exgrpo.rewards.extraction`). The lenient format logs a warning.
        max_answer_chars: longest graded answer; a longer one scores 0 (None: no limit).
        startup_timeout: seconds to wait for fresh workers to import math-verify.
        memory_limit_mb: ``RLIMIT_AS`` for each worker (``None`` disables), so
            a runaway big-integer computation fails with ``MemoryError``
            instead of swapping the machine.

    Attributes:
        grader_name: ``"math-verify"``.
        grader_version: installed math-verify version.

    Use as a context manager or call :meth:`close`; the pool starts lazily.
    """

    #: Per-item grading function. Must be a picklable module-level function;
    #: tests override it on a subclass for fault injection.
    _item_fn: ItemFn = staticmethod(score_item)

    def __init__(
        self,
        workers: int = 2,
        *,
        parse_timeout: int = 5,
        verify_timeout: int = 5,
        item_timeout: float | None = None,
        answer_format: AnswerFormat | str = AnswerFormat.BOXED,
        max_answer_chars: int | None = DEFAULT_MAX_ANSWER_CHARS,
        startup_timeout: float = 120.0,
        memory_limit_mb: int | None = 4096,
    ) -> None:
        if not isinstance(workers, int) or workers < 0:
            raise ValueError(f"MathVerifier: workers must be an int >= 0 (0 = in-process), got {workers!r}")
        for name, val in (("parse_timeout", parse_timeout), ("verify_timeout", verify_timeout)):
            if not isinstance(val, int) or isinstance(val, bool) or val < 1:
                raise ValueError(
                    f"MathVerifier: {name} must be a whole number of seconds >= 1 "
                    f"(math-verify uses signal.alarm), got {val!r}"
                )
        if item_timeout is not None and item_timeout <= 0:
            raise ValueError(f"MathVerifier: item_timeout must be > 0 seconds or None, got {item_timeout!r}")
        self.workers = workers
        self.parse_timeout = parse_timeout
        self.verify_timeout = verify_timeout
        self.item_timeout: float = (
            float(item_timeout)
            if item_timeout is not None
            else float(2 * parse_timeout + MAX_VERIFY_PAIRS * verify_timeout + 2)
        )
        self.answer_format = AnswerFormat(answer_format)
        warn_if_lenient(self.answer_format, "MathVerifier")
        self.max_answer_chars = max_answer_chars
        self.startup_timeout = startup_timeout
        self.memory_limit_mb = memory_limit_mb
        self.grader_name: str = GRADER_NAME
        self.grader_version: str = grader_version()
        # The pool lives in a holder shared with a weakref finalizer, so
        # workers are reaped even if the verifier is garbage-collected unclosed.
        self._holder = _PoolHolder()
        self._finalizer = weakref.finalize(self, self._holder.shutdown)
        self._closed = False
        self._lock = threading.Lock()  # one score() at a time: deadlines assume we own the pool
        self.n_pool_restarts = 0

    # ----------------------------------------------------------------- API --

    def score(self, responses: Sequence[str | None], golds: Sequence[str | int | float]) -> RewardBatch:
        """Grade ``responses[i]`` against ``golds[i]``; one reward (0.0/1.0) per item.

        ``None`` responses are treated as empty (:attr:`RewardStatus.NO_ANSWER`).
        Identical (prediction, gold) pairs are graded once. Never raises for
        any string content; raises ``ValueError``/``TypeError`` only for
        malformed arguments, and ``RuntimeError`` if the verifier is closed or
        worker processes cannot start. Thread-safe (concurrent calls on the
        pool path are serialised).
        """
        t0 = time.monotonic()
        if self._closed:
            raise RuntimeError("MathVerifier.score: verifier is closed; create a new MathVerifier")
        if len(responses) != len(golds):
            raise ValueError(
                f"MathVerifier.score: responses and golds must have the same length, "
                f"got {len(responses)} responses and {len(golds)} golds"
            )
        gold_strs = [self._gold_to_str(g, i) for i, g in enumerate(golds)]
        preds = [self._prediction(r, i) for i, r in enumerate(responses)]

        # Deduplicate: GRPO groups often repeat the same final answer.
        keys = list(zip(preds, gold_strs, strict=True))
        unique: dict[tuple[str | None, str], int] = {}
        for k in keys:
            unique.setdefault(k, len(unique))
        items = list(unique)
        if self.workers == 0:
            statuses = self._score_in_process(items)
        else:
            with self._lock:
                statuses = self._score_pool(items)
        per_item = [statuses[unique[k]] for k in keys]
        return RewardBatch.from_statuses(per_item, elapsed_s=time.monotonic() - t0)

    def score_one(self, response: str | None, gold: str | int | float) -> float:
        """Reward (0.0/1.0) of a single response; see :meth:`score`."""
        return self.score([response], [gold]).rewards[0]

    def close(self) -> None:
        """Stop worker processes (killing hung ones). Idempotent."""
        self._closed = True
        with self._lock:
            self._shutdown_pool(grace_s=0.5)

    def __enter__(self) -> MathVerifier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"MathVerifier(workers={self.workers}, parse_timeout={self.parse_timeout}, "
            f"verify_timeout={self.verify_timeout}, item_timeout={self.item_timeout}, "
            f"grader={self.grader_name}=={self.grader_version})"
        )

    # ------------------------------------------------------------- helpers --

    @staticmethod
    def _gold_to_str(gold: object, i: int) -> str:
        if isinstance(gold, str):
            return gold
        if isinstance(gold, (int, float)) and not isinstance(gold, bool):
            return str(gold)
        raise TypeError(f"MathVerifier.score: golds[{i}] must be a str (or int/float), got {type(gold).__name__}")

    def _prediction(self, response: object, i: int) -> str | None:
        if response is not None and not isinstance(response, str):
            raise TypeError(
                f"MathVerifier.score: responses[{i}] must be a str or None, got {type(response).__name__}"
            )
        return build_prediction(response, self.answer_format, self.max_answer_chars)

    def _score_in_process(self, items: list[tuple[str | None, str]]) -> list[RewardStatus]:
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError(
                "MathVerifier(workers=0) must be called from the main thread because math-verify's "
                "timeouts use signal.alarm; use workers>=1 (process pool) from threads"
            )
        out: list[RewardStatus] = []
        fn = type(self)._item_fn
        for pred, gold in items:
            with _no_stray_alarm():
                try:
                    out.append(RewardStatus(fn(pred, gold, self.parse_timeout, self.verify_timeout)))
                except BaseException as exc:  # noqa: BLE001 - TimeoutException is a BaseException
                    if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                        raise
                    out.append(RewardStatus.ERROR)
        return out

    # ----------------------------------------------------------------- pool --

    def _ensure_pool(self) -> ProcessPoolExecutor:
        if self._holder.pool is not None:
            return self._holder.pool
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        ready = ctx.Queue()
        pool = ProcessPoolExecutor(
            max_workers=self.workers,
            mp_context=ctx,
            initializer=_worker_init,
            initargs=(ready, self.memory_limit_mb),
        )
        # Workers are spawned on demand; one no-op per worker starts them all,
        # then wait until each has imported math-verify so that item deadlines
        # measure grading time, not interpreter start-up.
        pings = [pool.submit(os.getpid) for _ in range(self.workers)]
        deadline = time.monotonic() + self.startup_timeout
        seen: set[int] = set()
        try:
            while len(seen) < self.workers:
                try:
                    seen.add(ready.get(timeout=0.2))
                except queue.Empty:
                    failed = [p.exception() for p in pings if p.done() and p.exception() is not None]
                    if failed:  # a worker died during start-up (e.g. memory_limit_mb too low)
                        raise failed[0] from None
                    if time.monotonic() > deadline:
                        raise
            wait(pings, timeout=max(0.01, deadline - time.monotonic()))
        except Exception as exc:  # queue.Empty (too slow) or BrokenProcessPool (worker died)
            _kill_pool(pool)
            raise RuntimeError(
                f"MathVerifier: {self.workers} worker process(es) failed to start within "
                f"startup_timeout={self.startup_timeout}s ({type(exc).__name__}: {exc}); raise "
                "startup_timeout / memory_limit_mb, or use workers=0 for in-process grading"
            ) from exc
        finally:
            ready.close()
            ready.join_thread()
        self._holder.pool = pool
        return pool

    def _shutdown_pool(self, grace_s: float = 0.0) -> None:
        self._holder.shutdown(grace_s=grace_s)

    def _recycle_pool(self) -> None:
        self.n_pool_restarts += 1
        self._shutdown_pool()

    def _score_pool(self, items: list[tuple[str | None, str]]) -> list[RewardStatus]:
        """Grade ``items`` with at most one item in flight per worker.

        Keeping ``len(in_flight) <= workers`` means a submitted item starts at
        once, so ``submit time + item_timeout`` is a true per-item deadline.
        An item that misses it is marked TIMEOUT and the pool is recycled;
        the other in-flight items are resubmitted. If the pool breaks (a
        worker died), the in-flight items become *suspects* and are re-run
        alone, so only the item that really kills a worker is marked ERROR.
        """
        statuses: list[RewardStatus | None] = [None] * len(items)
        pending: deque[int] = deque(i for i, (pred, _) in enumerate(items) if pred is not None)
        for i, (pred, _) in enumerate(items):
            if pred is None:
                statuses[i] = RewardStatus.NO_ANSWER
        suspects: set[int] = set()
        fn = type(self)._item_fn
        in_flight: dict[Future[str], tuple[int, float]] = {}
        failed_submits = 0

        while pending or in_flight:
            pool = self._ensure_pool()
            # Fill free worker slots; a suspect only ever runs alone.
            while pending and len(in_flight) < self.workers:
                nxt = pending[0]
                if nxt in suspects and in_flight:
                    break
                if in_flight and any(j in suspects for j, _ in in_flight.values()):
                    break
                pending.popleft()
                pred, gold = items[nxt]
                try:
                    fut = pool.submit(fn, pred, gold, self.parse_timeout, self.verify_timeout)
                except BrokenProcessPool:
                    pending.appendleft(nxt)
                    break
                in_flight[fut] = (nxt, time.monotonic() + self.item_timeout)
            if not in_flight:  # pool broke on submit: recycle and retry a few times
                self._recycle_pool()
                failed_submits += 1
                if failed_submits > 3:
                    for i in pending:
                        statuses[i] = RewardStatus.ERROR
                    pending.clear()
                continue
            failed_submits = 0

            next_deadline = min(d for _, d in in_flight.values())
            wait(list(in_flight), timeout=max(0.0, next_deadline - time.monotonic()), return_when=FIRST_COMPLETED)

            broken = _harvest(in_flight, statuses, pending)
            now = time.monotonic()
            expired = [f for f, (_, d) in in_flight.items() if d <= now]
            for fut in expired:
                i, _ = in_flight.pop(fut)
                statuses[i] = RewardStatus.TIMEOUT
                logger.warning("math-verify item exceeded item_timeout=%.1fs; recycling worker pool", self.item_timeout)

            if broken:
                for i in broken:
                    if i in suspects:  # it ran alone and the pool died: it is the culprit
                        statuses[i] = RewardStatus.ERROR
                    else:
                        suspects.add(i)
                        pending.appendleft(i)
            if expired or broken:
                # Innocent in-flight items go back to the front of the queue.
                for _, (i, _) in in_flight.items():
                    pending.appendleft(i)
                in_flight.clear()
                self._recycle_pool()

        return [s if s is not None else RewardStatus.ERROR for s in statuses]
