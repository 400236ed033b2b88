"""Signals: SIGTERM finishes every open MemoryWriter; Ctrl-C can be deferred to a safe point.

**SIGTERM** (what schedulers send before a kill): the first MemoryWriter opened in
the main thread installs a handler, unless the process already has one of its own
or ignores the signal. On SIGTERM every open writer is flushed, writes a final
record at the last step it saw and is closed; then the previous disposition is
restored and the signal re-delivered, so the default behaviour (the process ends,
killed by SIGTERM) proceeds, or the user's own handler runs. The writers are finished
on a helper thread with a time limit: the signal may interrupt the main thread
while it holds one of TensorBoard's locks, and waiting for it there would hang.
Whatever another signal handler raises meanwhile (DataLoader's SIGCHLD handler raises
when its workers die of the same SIGTERM) does not stop this: the writers still get
their time, partly written snapshot files are removed, and the signal is re-delivered.
A forked child does none of this for its parent's writers (:mod:`tbmem._internal._process`).

**Ctrl-C** inside code that must not be interrupted at an arbitrary point (SciPy's
L-BFGS-B worker waits forever on a barrier when the main thread raises):
:func:`deferred_interrupt` turns the first SIGINT into a flag the code checks at
its own safe points; a second one finishes the writers and exits with status 130.

Example:
    >>> from tbmem._internal._signals import deferred_interrupt
    >>> with deferred_interrupt() as flag:
    ...     flag.is_set()
    False
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import weakref
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from tbmem._internal._log import logger, report_once

__all__ = ["register", "unregister", "finish_all", "finish_writer", "deferred_interrupt", "InterruptFlag",
           "FINISH_TIMEOUT_S", "after_fork_in_child"]

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
            writer._write_readings(writer._record.read(step), step)
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

    done = threading.Event()

    def work() -> None:
        try:
            for w in writers:
                try:
                    w._finish(reason)
                except Exception as exc:  # noqa: BLE001 - the others still get their turn
                    logger.warning("tbmem: could not finish the writer for %s on %s (%s: %s)",
                                   getattr(w, "log_dir", "?"), reason, type(exc).__name__, exc)
        finally:
            done.set()

    threading.Thread(target=work, name="tbmem-finish", daemon=True).start()
    # An Event, not Thread.join: a join interrupted by another handler's exception marks the thread
    # as stopped while it still runs (bpo-45274's fix), and the writers would lose their time.
    deadline = time.monotonic() + timeout
    while not done.is_set() and time.monotonic() < deadline:
        try:
            done.wait(max(0.0, deadline - time.monotonic()))
        except Exception:  # noqa: BLE001 - raised by another signal handler while waiting: keep waiting
            continue
    if not done.is_set():
        logger.warning("tbmem: the event files could not be finished within %.0f s on %s; "
                       "records written before are kept", timeout, reason)
        return False
    return True


def _on_sigterm(signum: int, frame: Any) -> None:
    global _installed
    try:
        finish_all("SIGTERM")
    except BaseException:  # noqa: BLE001 - raised into this handler by another one: the process still ends
        pass
    finally:
        _remove_partial_snapshots()
        # no lock: this handler may have interrupted the main thread inside register()
        previous = _previous
        _installed = False
        signal.signal(signal.SIGTERM, previous)
    if callable(previous):
        previous(signum, frame)
    else:  # SIG_DFL: end the way the sender meant (killed by SIGTERM)
        os.kill(os.getpid(), signum)


def _remove_partial_snapshots() -> None:
    """Remove the temporary files of snapshot writes this signal interrupted (nothing unwinds
    the interrupted write: the process dies when the signal is re-delivered)."""
    store = sys.modules.get("tbmem._internal.snapshot.store")
    remove = getattr(store, "remove_partial_files", None)
    if remove is not None:
        try:
            remove()
        except Exception:  # noqa: BLE001 - the process is ending; a leftover file is cleaned later
            pass


def after_fork_in_child() -> None:
    """In a forked child: forget the parent's writers and give SIGTERM back its previous disposition.

    Called by :mod:`tbmem._internal._process`'s fork hook, with only the forking thread alive: no lock.
    """
    global _writers, _lock, _installed
    _writers = weakref.WeakSet()
    _lock = threading.Lock()  # another thread of the parent may have held it at the fork
    if _installed:
        _installed = False
        try:
            if signal.getsignal(signal.SIGTERM) is _on_sigterm:
                signal.signal(signal.SIGTERM, _previous)
        except (ValueError, OSError):  # not the main thread (cannot happen after fork); leave it
            pass


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
