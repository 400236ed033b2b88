"""What belongs to the process that opened a MemoryWriter: its flush at exit, its SIGTERM work.

``os.fork()`` copies every object of the parent, its MemoryWriters too, but none of its
threads: TensorBoard's writer thread is missing in the child, so flushing an inherited
writer there waits forever (a forked child that exits normally hung at its at-exit
flush), and a record written there lands in the parent's event file (workers of a
``multiprocessing`` pool wrote their own RSS as the parent's final records on SIGTERM).
So in a child forked through Python (``os.fork``, ``multiprocessing``'s fork start
method, DataLoader workers) every inherited writer is closed without touching its
files: its writes are ignored (one line if the child tries), nothing runs for it at the
child's exit, and SIGTERM gets back the disposition it had before tbmem
(:func:`tbmem._internal._signals.after_fork_in_child`). A child that wants records opens its own
MemoryWriter. A fork that bypasses Python's hooks (a C extension calling ``fork()``) is
caught at exit: the flush runs only in the process that opened the writer.

Example:
    >>> import tempfile
    >>> from tbmem import MemoryWriter
    >>> from tbmem._internal._process import inherited
    >>> with MemoryWriter(tempfile.mkdtemp(), census_every=0) as writer:
    ...     inherited(writer)
    False
"""

from __future__ import annotations

import atexit
import functools
import os
import weakref
from typing import Any, Callable

from tbmem._internal import _signals

__all__ = ["adopt", "release", "inherited", "ignored_write_line"]

# every open writer of this process, for the fork hook (the at-exit partials hold weak references)
_open: "weakref.WeakSet[Any]" = weakref.WeakSet()


def _flush_at_exit(ref: "weakref.ref[Any]", pid: int) -> None:
    writer = ref()
    if writer is not None and not writer.closed and os.getpid() == pid:
        writer.flush()


def adopt(writer: Any) -> Callable[[], None]:
    """Flush ``writer`` at interpreter exit and finish it on SIGTERM, in this process only.

    Returns the at-exit callable, for :func:`release` (each writer's own, so closing one
    unregisters nothing of another's).
    """
    at_exit = functools.partial(_flush_at_exit, weakref.ref(writer), os.getpid())
    atexit.register(at_exit)
    _open.add(writer)
    _signals.register(writer)
    return at_exit


def release(writer: Any, at_exit: Callable[[], None] | None) -> None:
    """Undo :func:`adopt` when ``writer`` closes."""
    if at_exit is not None:
        atexit.unregister(at_exit)
    _open.discard(writer)
    _signals.unregister(writer)


def inherited(writer: Any) -> bool:
    """Whether ``writer`` was opened by the process this one was forked from."""
    return bool(writer.__dict__.get("_inherited", False))


def ignored_write_line(writer: Any, what: str) -> str:
    """The one line said when ``what()`` is called on a closed (or inherited) writer."""
    if inherited(writer):
        return (f"tbmem: {what}() in a process forked from the one that opened the MemoryWriter for "
                f"{writer.log_dir} is ignored (as is every later write; open a MemoryWriter in this "
                "process for its own records)")
    return (f"tbmem: {what}() after close() of the MemoryWriter for {writer.log_dir} is ignored "
            "(as is every later write)")


def _after_fork_in_child() -> None:
    # Runs in the child right after os.fork(), with only the forking thread alive: take no lock
    # another thread may have held, write nothing, wait for nothing.
    for writer in list(_open):
        writer.__dict__["_inherited"] = True
        writer.closed = True
        at_exit = writer.__dict__.get("_at_exit")
        if at_exit is not None:
            atexit.unregister(at_exit)
    _open.clear()
    _signals.after_fork_in_child()


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(after_in_child=_after_fork_in_child)
