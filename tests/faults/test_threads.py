"""Threads: the recorder (either backend) stays on the thread whose steps it records, and never outlives
close()."""

from __future__ import annotations

import pytest

from tbmem._internal.snapshot import load_snapshot
from tbmem._internal.snapshot.store import PLUGIN_DIR
from tests.faults._child import run_child, tbmem_lines
from tests.snapshot._helpers import require_backend

# What records on the calling thread, printed by the children: the dispatch mode on top of the thread's
# mode stack, or the CPU allocator recordings in the thread's list (indented as the children's code, which
# run_child dedents).
_PROBE = """
        from torch.utils._python_dispatch import _get_current_dispatch_mode
        from tbmem._internal.snapshot import native
        def recording_here(recorder):
            if recorder == "dispatch":
                mode = _get_current_dispatch_mode()
                return None if mode is None else mode.live
            states = native.load().thread_recordings()
            return states[-1] if states else None
        def left_anywhere(recorder, mode):
            if recorder == "dispatch":
                return mode.live
            # the main thread's stopped recording of window 0 waits for close(); the training
            # thread's could only have left its list at that thread's end
            return native.load().recordings_on_threads() > 1
"""


@pytest.mark.parametrize("recorder", ["dispatch", "allocator"])
def test_steps_on_a_background_thread_leave_no_recording_mode_anywhere(tmp_path, recorder):
    require_backend(recorder)
    proc = run_child(_PROBE + """
        import os, sys, threading
        import torch
        from torch.utils._python_dispatch import _get_current_dispatch_mode
        from tbmem import MemoryWriter
        recorder = sys.argv[2]
        # Created on the main thread (which starts recording window 0 there) ...
        w = MemoryWriter(sys.argv[1], every=1, census_every=0,
                         snapshot={"every": 2, "window": 1, "html": False, "max_snapshots": 0,
                                   "recorder": recorder})
        model = torch.nn.Linear(16, 16)
        w.watch(model)

        modes = []

        def train():  # ... trained on another thread
            for step in range(8):
                with w.monitored_step(step):
                    model(torch.randn(4, 16)).sum().backward()
            modes.append(_get_current_dispatch_mode())  # the window of step 8 is open
            print("background thread records:", recording_here(recorder), flush=True)

        t = threading.Thread(target=train)
        t.start(); t.join()
        # the thread's end exited the mode while Python could still drop it: left in the thread's
        # C++ mode stack, it would be dropped at the OS thread's exit, racing the interpreter's
        # finalization ("terminate called without an active exception")
        print("mode live after the thread ended:", left_anywhere(recorder, modes[0]), flush=True)
        w.close()
        print("main thread after close:", recording_here(recorder), flush=True)
        if recorder == "allocator":
            print("recordings on any thread after close:", native.load().recordings_on_threads())
    """, str(tmp_path), recorder)
    assert proc.returncode == 0, proc.stderr
    assert "background thread records: True" in proc.stdout
    assert "mode live after the thread ended: False" in proc.stdout
    assert "main thread after close: None" in proc.stdout  # no pass-through mode slowing every op down
    assert recorder == "dispatch" or "recordings on any thread after close: 0" in proc.stdout
    assert tbmem_lines(proc.stderr) == []
    # window 0 began on the main thread and saw none of the steps: recording moved to the
    # training thread, and every later window recorded that thread's operators
    folder = tmp_path / PLUGIN_DIR
    names = sorted(p.name for p in folder.iterdir())
    assert names == [f"snapshot_rank0_step{s:09d}.json.gz" for s in (2, 4, 6)]
    for name in names:
        snap = load_snapshot(folder / name)
        assert "activation" in snap.categories and snap.n_events > 0


@pytest.mark.parametrize("recorder", ["dispatch", "allocator"])
def test_close_from_another_thread_removes_nothing_it_cannot_and_the_owner_cleans_up(tmp_path, recorder):
    require_backend(recorder)
    proc = run_child(_PROBE + """
        import sys, threading
        import torch
        from tbmem import MemoryWriter
        recorder = sys.argv[2]
        w = MemoryWriter(sys.argv[1], every=1, census_every=0,
                         snapshot={"every": 100, "html": False, "recorder": recorder})
        x = torch.ones(8) * 2  # recorded on the main thread (continuous recording from step 0)
        closer = threading.Thread(target=w.close)
        closer.start(); closer.join()
        print("after close on another thread: live:", recording_here(recorder))
        y = torch.ones(8) * 3  # passes through the stopped mode
        w.close()  # on the owner thread: the stopped mode is removed
        print("after close on the owner thread:", recording_here(recorder), flush=True)
    """, str(tmp_path), recorder)
    assert proc.returncode == 0, proc.stderr
    assert "after close on another thread: live: False" in proc.stdout
    assert "after close on the owner thread: None" in proc.stdout
