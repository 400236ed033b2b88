"""Signals: SIGTERM finishes every open MemoryWriter; Ctrl-C can be deferred to a safe point.

**SIGTERM** (what schedulers send before a kill): the first MemoryWriter opened in
the main thread installs a handler, unless the process already has one of its own
or ignores the signal. On SIGTERM every open writer is flushed, writes a final
record at the last step it saw and is closed; then the previous disposition is
restored and the signal re-delivered, so the default behaviour (the process ends,
killed by SIGTERM) proceeds, or the user's own handler runs. The writers are finished
on a helper thread with a time limit: the signal may interrupt the main thread
while it holds one of TensorBoard's locks, and waiting for it there would hang.

**Ctrl-C** inside code that must not be interrupted at an arbitrary point (SciPy's
L-BFGS-B worker waits forever on a barrier when the main thread raises):
:func:`deferred_interrupt` turns the first SIGINT into a flag the code checks at
its own safe points; a second one finishes the writers and exits with status 130.

Example:
    >>> from tbmem._signals import deferred_interrupt
    >>> with deferred_interrupt() as flag:
    ...     flag.is_set()
    False
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import weakref
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from tbmem._log import logger, report_once

__all__ = ["register", "unregister", "finish_all", "finish_writer", "deferred_interrupt", "InterruptFlag",
           "FINISH_TIMEOUT_S"]

#: Longest time the writers get to finish on a signal before the process goes on without them.
FINISH_TIMEOUT_S = 10.0

_writers: "weakref.WeakSet[Any]" = weakref.WeakSet()
_lock = threading.Lock()
_previous: Any = None
_installed = False


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def register(writer: Any) -> None:
    """Finish ``writer`` on SIGTERM (it needs a ``_finish(reason)`` method)."""
    global _previous, _installed
    with _lock:
        _writers.add(writer)
        if _installed or not _in_main_thread():
            return
        current = signal.getsignal(signal.SIGTERM)
        # Leave a handler the user (or a framework) installed, an ignored signal, or one set from C.
        if current is not signal.SIG_DFL:
            return
        _previous = current
        signal.signal(signal.SIGTERM, _on_sigterm)
        _installed = True


def unregister(writer: Any) -> None:
    """Forget ``writer``; the last one out restores the previous SIGTERM disposition."""
    global _installed
    with _lock:
        _writers.discard(writer)
        if _installed and not len(_writers) and _in_main_thread():
            if signal.getsignal(signal.SIGTERM) is _on_sigterm:
                signal.signal(signal.SIGTERM, _previous)
            _installed = False


def finish_writer(writer: Any, reason: str) -> None:
    """Flush ``writer`` (a MemoryWriter), write a final record at the last step it saw, close it."""
    if writer.closed:
        return
    step = writer.last_step
    wrote = False
    if writer.config.enabled and step is not None:
        try:
            writer.write_readings(writer._read(step), step)
            wrote = True
        except Exception as exc:  # noqa: BLE001
            report_once("writer:final-record", "tbmem: could not write the final record", exc=exc)
    writer.close()
    if wrote:
        logger.warning("tbmem: %s: final record at step %s written, %s closed", reason, step, writer.log_dir)
    else:
        logger.warning("tbmem: %s: %s flushed and closed", reason, writer.log_dir)


def finish_all(reason: str, *, timeout: float = FINISH_TIMEOUT_S) -> bool:
    """Flush, write a final record and close every open writer; False if time ran out."""
    writers = list(_writers)
    if not writers:
        return True

    def work() -> None:
        for w in writers:
            try:
                w._finish(reason)
            except Exception as exc:  # noqa: BLE001 - the others still get their turn
                logger.warning("tbmem: could not finish the writer for %s on %s (%s: %s)",
                               getattr(w, "log_dir", "?"), reason, type(exc).__name__, exc)

    helper = threading.Thread(target=work, name="tbmem-finish", daemon=True)
    helper.start()
    helper.join(timeout)
    if helper.is_alive():
        logger.warning("tbmem: the event files could not be finished within %.0f s on %s; "
                       "records written before are kept", timeout, reason)
        return False
    return True


def _on_sigterm(signum: int, frame: Any) -> None:
    global _installed
    finish_all("SIGTERM")
    with _lock:
        previous = _previous
        _installed = False
    signal.signal(signal.SIGTERM, previous)
    if callable(previous):
        previous(signum, frame)
    else:  # SIG_DFL: end the way the sender meant (killed by SIGTERM)
        os.kill(os.getpid(), signum)


class InterruptFlag:
    """Set by the first Ctrl-C inside :func:`deferred_interrupt`."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def set(self) -> None:
        """Record an interrupt."""
        self._event.set()

    def is_set(self) -> bool:
        """Whether Ctrl-C was pressed."""
        return self._event.is_set()


@contextmanager
def deferred_interrupt(on_first: Callable[[], None] | None = None) -> Iterator[InterruptFlag]:
    """Within the block the first SIGINT only sets the flag (and calls ``on_first``).

    A second SIGINT finishes the open writers and exits at once with status 130.
    Outside the main thread, or when SIGINT has a handler other than Python's
    default, the block runs unchanged (the flag is never set).
    """
    flag = InterruptFlag()
    if not _in_main_thread() or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield flag
        return

    def handler(signum: int, frame: Any) -> None:
        if flag.is_set():
            finish_all("a second Ctrl-C", timeout=3.0)
            print("Interrupted twice: stopped at once (records flushed).", file=sys.stderr, flush=True)
            os._exit(130)
        flag.set()
        if on_first is not None:
            on_first()

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, previous)
