"""How the ``exgrpo`` command turns SIGTERM and Ctrl-C into an orderly stop.

Python runs a signal's handler between two bytecodes of the main thread, wherever it is. A handler that
stops the command by raising (Ctrl-C's ``KeyboardInterrupt``, :class:`Terminated` for SIGTERM, Prefect's
``TerminationSignal`` while a flow runs) can land inside a weak reference's callback or a ``__del__`` that a
garbage collection is running; Python prints such an exception ("Exception ignored in ...") and drops it,
and the command goes on as if it had never been signalled, until a scheduler kills it and leaves its
Prefect server, its Ray and RUNNING MLflow runs behind. :func:`install_stop_handlers` sends a dropped stop
signal again, so that its handler runs once more, outside the callback.
"""

from __future__ import annotations

import _thread
import os
import signal
import sys
import threading
import time
from typing import Any


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the command is as Ctrl-C's KeyboardInterrupt is, so that what the command
    started (the Prefect server of a flow, a private Ray, its MLflow runs) is stopped and recorded on the
    way out, as on Ctrl-C; the default action would end the process at once and leave them behind."""


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated()


def stop_signal_of(exc: BaseException | None) -> int | None:
    """The signal an exception stands for, if it is one that stops the command: SIGTERM for
    :class:`Terminated` and for an exception that names its signal (Prefect's ``TerminationSignal``, which
    is no ``Exception``), SIGINT for any other ``KeyboardInterrupt``; None otherwise."""
    if isinstance(exc, Terminated):
        return signal.SIGTERM
    if isinstance(exc, KeyboardInterrupt):
        return signal.SIGINT
    sig = getattr(exc, "signal", None)
    if isinstance(exc, BaseException) and not isinstance(exc, Exception) and sig in (signal.SIGTERM, signal.SIGINT):
        return int(sig)
    return None


_RESEND_AFTER_S = 0.05
"""How long after Python dropped a stop signal's exception it is sent again: time for the rest of the
garbage collection whose callback dropped it to finish."""

_armed = False
"""Whether a dropped stop is sent again: from :func:`install_stop_handlers` until :func:`disarm`."""


def _stop_in_flight() -> bool:
    """Whether the main thread is handling a stop's exception now: in an ``except`` or ``finally`` block, or
    a context manager's exit, on its way out (a stop that arrived by another delivery of the signal)."""
    exc = sys._current_exceptions().get(threading.main_thread().ident)
    if isinstance(exc, tuple):  # Python 3.11: (type, value, traceback)
        exc = exc[1]
    return stop_signal_of(exc) is not None


def _send_again_later(sig: int) -> None:
    """Send ``sig`` to this process in :data:`_RESEND_AFTER_S`, unless by then the command is stopping
    already or has returned. A raw thread: ``os.kill`` here would run the handler at once, inside the hook,
    which drops it too, and ``threading`` takes locks that the interrupted main thread may hold."""

    def later() -> None:
        time.sleep(_RESEND_AFTER_S)
        if _armed and not _stop_in_flight():
            os.kill(os.getpid(), sig)

    _thread.start_new_thread(later, ())


def install_stop_handlers() -> None:
    """In the main thread: SIGTERM raises :class:`Terminated` (unless a handler is set already), and a stop
    signal whose exception Python dropped (raised inside a callback that may not raise) is sent again."""
    global _armed
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _raise_terminated)
    _armed = True
    previous = sys.unraisablehook
    if getattr(previous, "_resends_stop_signals", False):
        return

    def resend_a_dropped_stop(unraisable: Any) -> None:
        sig = stop_signal_of(unraisable.exc_value)
        if sig is None or not _armed or sys.is_finalizing():
            previous(unraisable)
            return
        _send_again_later(sig)

    resend_a_dropped_stop._resends_stop_signals = True  # type: ignore[attr-defined]
    sys.unraisablehook = resend_a_dropped_stop


def disarm() -> None:
    """The command has returned: what runs now (``atexit`` callbacks stopping a Ray, removing temp dirs)
    finishes, and a stop dropped in it stays dropped."""
    global _armed
    _armed = False
