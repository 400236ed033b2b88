"""The recorder is confined to the thread that started it (a dispatch mode is thread-local state, and
so is the CPU allocator recorder's list of recordings), with either backend."""

from __future__ import annotations

import threading

import pytest
import torch

from tbmem._internal._torch_private import current_dispatch_mode
from tbmem._internal.snapshot.recorder import DispatchRecorder, release_detached
from tests.snapshot._helpers import native_module, require_backend


def _in_thread(fn):
    out = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join()
    return out[0] if out else None


@pytest.mark.parametrize("backend", ["dispatch", "allocator"])
def test_other_threads_are_not_recorded(backend):
    require_backend(backend)
    rec = DispatchRecorder(backend=backend)
    rec.start()
    assert rec.backend_used == backend
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
    rec = DispatchRecorder(backend="dispatch")
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


def test_stop_from_another_thread_stops_the_allocator_recording_and_the_owner_releases_it():
    mod = native_module()
    rec = DispatchRecorder(backend="allocator")
    rec.start()
    assert mod.thread_recordings() == [True] and _in_thread(mod.thread_recordings) == []
    _in_thread(rec.stop)
    assert not rec.active
    assert mod.thread_recordings() == [False]  # stopped, still in this thread's list until released
    before = len(rec.snapshot(kind="snapshot", step=0).allocs["size"])
    y = torch.ones(64) * 3  # not recorded
    assert len(rec.snapshot(kind="snapshot", step=0).allocs["size"]) == before
    assert _in_thread(release_detached) == 0
    assert release_detached() == 1
    assert mod.thread_recordings() == []
    assert release_detached() == 0
    del y


def test_a_mode_of_the_users_above_ours_is_left_in_place():
    from torch.utils._python_dispatch import TorchDispatchMode

    class UserMode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    rec = DispatchRecorder(backend="dispatch")
    rec.start()
    with UserMode() as user:
        rec.stop()  # ours is below the user's: it cannot be popped without popping theirs
        assert current_dispatch_mode() is user
        assert release_detached() == 0
    assert release_detached() == 1
    assert current_dispatch_mode() is None


def test_the_allocator_recording_leaves_a_users_dispatch_mode_alone():
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class UserMode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    native_module()
    rec = DispatchRecorder(backend="allocator")
    with UserMode() as user:
        rec.start()
        x = torch.ones(100) * 2
        rec.stop()  # no mode of ours: the user's stays on top, and nothing is left to release
        assert current_dispatch_mode() is user
    assert release_detached() == 0 and current_dispatch_mode() is None
    assert "aten.mul.Tensor" in seen
    assert 400 in rec.snapshot(kind="snapshot", step=0).allocs["size"].tolist()
    del x
