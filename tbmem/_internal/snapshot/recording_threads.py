"""Where recordings live: a dispatch mode and a CPU allocator recording are state of the thread that
started them, and only that thread can remove them. A recording stopped from another thread is
parked here (:func:`park`) and removed by :func:`release_detached` on its own thread, or when that
thread ends (:func:`exit_at_thread_end`).

Example:
    >>> from tbmem._internal.snapshot.recording_threads import release_detached
    >>> release_detached()  # nothing parked for this thread
    0
"""

from __future__ import annotations

import threading
from typing import Any

from tbmem._internal import _torch_private as tp
from tbmem._internal.snapshot import native
from tbmem._internal.snapshot.cpu_recorder import AllocatorRecording

__all__ = ["exit_at_thread_end", "park", "release_detached"]

# thread id -> stopped modes still entered on that thread (only it can remove them), and stopped
# allocator recordings still in that thread's list
_detached: dict[int | None, list[Any]] = {}
_detached_lock = threading.Lock()


class _ThreadEnd:
    """Kept in a ``threading.local`` of a thread that entered a recording mode: deleted when that
    thread's Python state is cleared at its end (on that thread, with the GIL, before ``join()``
    returns), it exits the recording modes still entered there.

    Otherwise the mode would stay in the thread's C++ dispatch-mode stack until the OS thread
    exits, and dropping it then needs the GIL: when the main thread is already finalizing the
    interpreter, that thread is ended by a forced unwind through a C++ destructor, and the process
    aborts with "terminate called without an active exception".
    """

    __slots__ = ()

    def __del__(self) -> None:
        try:
            while getattr(top := tp.current_dispatch_mode(), "tbmem_recording", False):
                top.live = False
                top.__exit__(None, None, None)
            mod = native.loaded()
            if mod is not None:
                mod.release(True)
            with _detached_lock:
                _detached.pop(threading.get_ident(), None)
        except Exception:  # noqa: BLE001 - a thread's end must not raise; nothing better can be done
            pass


_thread_end = threading.local()


def exit_at_thread_end() -> None:
    """Arrange for :class:`_ThreadEnd` to run at the end of the calling thread (not the main
    thread: its modes outlive the interpreter's threads, and torch drops them at exit)."""
    if threading.current_thread() is not threading.main_thread() and not hasattr(_thread_end, "hook"):
        _thread_end.hook = _ThreadEnd()


def park(thread_id: int | None, mode: Any) -> None:
    """Leave a stopped mode or allocator recording of thread ``thread_id`` for that thread to remove."""
    with _detached_lock:
        _detached.setdefault(thread_id, []).append(mode)


def release_detached() -> int:
    """Remove the stopped recording modes still entered on the calling thread; return how many.

    Cheap when there are none (one dict check): the snapshot manager calls it every step.
    """
    if not _detached:
        return 0
    me = threading.get_ident()
    with _detached_lock:
        modes = _detached.pop(me, [])
        alive = {t.ident for t in threading.enumerate()}
        for tid in [t for t in _detached if t not in alive]:
            del _detached[tid]  # a thread that ended took its modes with it
    removed = 0
    recordings = [m for m in modes if isinstance(m, AllocatorRecording)]
    mod = native.loaded()
    if recordings and mod is not None:  # parked ones exist only where the module was loaded
        mod.release()
        removed += len(recordings)
        modes = [m for m in modes if not isinstance(m, AllocatorRecording)]
    while modes:
        top = tp.current_dispatch_mode()
        if not any(top is m for m in modes):
            break  # a mode of the user's is above ours: wait until it is gone
        top.__exit__(None, None, None)
        modes = [m for m in modes if m is not top]
        removed += 1
    if modes:
        with _detached_lock:
            _detached.setdefault(me, []).extend(modes)
    return removed
