"""The dispatch recorder is confined to the thread that started it (a mode is thread-local state)."""

from __future__ import annotations

import threading

import torch

from tbmem._torch_private import current_dispatch_mode
from tbmem.snapshot.recorder import DispatchRecorder, release_detached


def _in_thread(fn):
    out = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join()
    return out[0] if out else None


def test_other_threads_are_not_recorded():
    rec = DispatchRecorder()
    rec.start()
    try:
        _in_thread(lambda: torch.ones(1000) * 2)  # 4 kB on another thread
        x = torch.ones(10) * 2
        snap = rec.snapshot(kind="snapshot", step=0)
    finally:
        rec.stop()
    assert current_dispatch_mode() is None
    assert 4000 not in set(snap.allocs["size"].tolist()) and 40 in set(snap.allocs["size"].tolist())
    del x


def test_stop_from_another_thread_stops_recording_and_the_owner_removes_the_mode():
    rec = DispatchRecorder()
    rec.start()
    mode = current_dispatch_mode()
    _in_thread(rec.stop)
    assert not rec.active
    assert current_dispatch_mode() is mode and mode.live is False  # only this thread can remove it
    before = len(rec.snapshot(kind="snapshot", step=0).allocs["size"])
    y = torch.ones(64) * 3  # passes through, not recorded
    assert len(rec.snapshot(kind="snapshot", step=0).allocs["size"]) == before
    assert _in_thread(release_detached) == 0  # another thread cannot remove it
    assert release_detached() == 1
    assert current_dispatch_mode() is None
    assert release_detached() == 0
    del y


def test_a_mode_of_the_users_above_ours_is_left_in_place():
    from torch.utils._python_dispatch import TorchDispatchMode

    class UserMode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    rec = DispatchRecorder()
    rec.start()
    with UserMode() as user:
        rec.stop()  # ours is below the user's: it cannot be popped without popping theirs
        assert current_dispatch_mode() is user
        assert release_detached() == 0
    assert release_detached() == 1
    assert current_dispatch_mode() is None
