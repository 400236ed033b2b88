"""Threads: the dispatch recorder stays on the thread whose steps it records, and never outlives close()."""

from __future__ import annotations

from tbmem.snapshot import load_snapshot
from tbmem.snapshot.store import PLUGIN_DIR
from tests.faults._child import run_child, tbmem_lines


def test_steps_on_a_background_thread_leave_no_recording_mode_anywhere(tmp_path):
    proc = run_child("""
        import os, sys, threading
        import torch
        from torch.utils._python_dispatch import _get_current_dispatch_mode
        from tbmem import MemoryWriter
        # Created on the main thread (which starts recording window 0 there) ...
        w = MemoryWriter(sys.argv[1], every=1, census_every=0,
                         snapshot={"every": 2, "window": 1, "html": False, "max_snapshots": 0})
        model = torch.nn.Linear(16, 16)
        w.watch(model)

        modes = []

        def train():  # ... trained on another thread
            for step in range(8):
                with w.monitored_step(step):
                    model(torch.randn(4, 16)).sum().backward()
            mode = _get_current_dispatch_mode()  # the window of step 8 is open
            modes.append(mode)
            print("background thread records:", getattr(mode, "live", None), flush=True)

        t = threading.Thread(target=train)
        t.start(); t.join()
        # the thread's end exited the mode while Python could still drop it: left in the thread's
        # C++ mode stack, it would be dropped at the OS thread's exit, racing the interpreter's
        # finalization ("terminate called without an active exception")
        print("mode live after the thread ended:", modes[0].live, flush=True)
        w.close()
        print("main thread after close:", _get_current_dispatch_mode(), flush=True)
    """, str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "background thread records: True" in proc.stdout
    assert "mode live after the thread ended: False" in proc.stdout
    assert "main thread after close: None" in proc.stdout  # no pass-through mode slowing every op down
    assert tbmem_lines(proc.stderr) == []
    # window 0 began on the main thread and saw none of the steps: recording moved to the
    # training thread, and every later window recorded that thread's operators
    folder = tmp_path / PLUGIN_DIR
    names = sorted(p.name for p in folder.iterdir())
    assert names == [f"snapshot_rank0_step{s:09d}.json.gz" for s in (2, 4, 6)]
    for name in names:
        snap = load_snapshot(folder / name)
        assert "activation" in snap.categories and snap.n_events > 0


def test_close_from_another_thread_removes_nothing_it_cannot_and_the_owner_cleans_up(tmp_path):
    proc = run_child("""
        import sys, threading
        import torch
        from torch.utils._python_dispatch import _get_current_dispatch_mode
        from tbmem import MemoryWriter
        w = MemoryWriter(sys.argv[1], every=1, census_every=0, snapshot={"every": 100, "html": False})
        x = torch.ones(8) * 2  # recorded on the main thread (continuous recording from step 0)
        closer = threading.Thread(target=w.close)
        closer.start(); closer.join()
        mode = _get_current_dispatch_mode()
        print("after close on another thread:", type(mode).__name__, "live:", getattr(mode, "live", None))
        y = torch.ones(8) * 3  # passes through the stopped mode
        w.close()  # on the owner thread: the stopped mode is removed
        print("after close on the owner thread:", _get_current_dispatch_mode(), flush=True)
    """, str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "after close on another thread: _RecordingMode live: False" in proc.stdout
    assert "after close on the owner thread: None" in proc.stdout
