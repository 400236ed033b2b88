"""The CPU allocator recorder (tbmem/_internal/snapshot/_cpu_alloc_recorder.cpp): how it is built and loaded, and
what it records beyond the comparisons with the reference recorder (tests/snapshot/test_recorder_same.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import warnings

import pytest
import torch

from tbmem._internal.snapshot import native
from tbmem._internal.snapshot.recorder import DispatchRecorder
from tests.faults._child import child_env
from tests.snapshot._helpers import native_module


def _record(fn, **kwargs):
    native_module()
    rec = DispatchRecorder(backend="allocator", **kwargs)
    rec.start()
    try:
        out = fn()
    finally:
        rec.stop()
    return rec, out


def test_a_block_freed_on_another_thread_and_after_stop_is_seen_freed():
    def make():
        return torch.ones(3000), torch.ones(5000)  # 12000 and 20000 bytes

    rec, (a, b) = _record(make)
    box = [a]
    del a
    t = threading.Thread(target=box.clear)  # the last reference, so the block, goes on another thread
    t.start()
    t.join()
    del b  # after stop(): still the recording's block
    snap = rec.snapshot(kind="snapshot", step=0)
    ends = dict(zip(snap.allocs["size"].tolist(), snap.allocs["end"].tolist()))
    assert ends[12000] >= 0 and ends[20000] >= 0 and ends[20000] > ends[12000]
    assert snap.meta["recorder"] == "CPU allocator" and snap.source == "allocator"


def test_the_oldest_half_is_dropped_beyond_max_entries_and_what_is_alive_stays():
    def churn():
        kept = [torch.empty(1000 + i) for i in range(5)]  # alive at the end: kept through compactions
        for i in range(200):
            t = torch.empty(64 + i)
            del t
        return kept

    rec, kept = _record(churn, max_entries=50)
    snap = rec.snapshot(kind="snapshot", step=0)
    assert snap.dropped > 0 and snap.n_events <= 50
    sizes = snap.allocs["size"].tolist()
    for i in range(5):  # each survivor, now from before the kept events
        j = sizes.index(4 * (1000 + i))
        assert snap.allocs["start"][j] == -1 and snap.allocs["end"][j] == -1
    starts, ends = snap.allocs["start"], snap.allocs["end"]
    assert ((ends == -1) | (ends > starts)).all() and (ends < snap.n_events).all()
    del kept


def test_one_address_reused_is_many_allocations():
    def churn():
        for _ in range(20):
            t = torch.empty(2048)
            del t

    rec, _ = _record(churn)
    snap = rec.snapshot(kind="snapshot", step=0)
    mine = snap.allocs["size"] == 8192
    assert mine.sum() == 20 and (snap.allocs["end"][mine] >= 0).all()
    assert len(set(snap.allocs["addr"][mine].tolist())) < 20  # glibc hands the same block back


def test_stacks_none_records_no_stacks_and_a_watched_gradient_is_named():
    model = torch.nn.Linear(8, 8)

    def step():
        model(torch.randn(4, 8)).sum().backward()

    rec, _ = _record(step, stacks="none", models=lambda: [model])
    snap = rec.snapshot(kind="snapshot", step=0)
    assert (snap.allocs["stack"] == -1).all()
    names = [snap.categories[c] for c in snap.allocs["category"]]
    made = snap.allocs["start"] >= 0
    # the gradients, allocated in the window, are named by their address when the snapshot is taken
    assert sorted(int(s) for s, n, m in zip(snap.allocs["size"], names, made) if n == "gradient" and m) == [32, 256]
    assert sorted(int(s) for s, n, m in zip(snap.allocs["size"], names, made) if n == "parameter" and not m) == \
        [32, 256]


def test_a_failed_build_says_why(tmp_path, monkeypatch):
    monkeypatch.setenv("TBMEM_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", "/bin/false")
    with pytest.raises(native.NativeUnavailable, match="compiling the CPU allocation recorder failed"):
        native.build()
    assert os.listdir(tmp_path) == []  # no half-written library left behind
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    with pytest.raises(native.NativeUnavailable):
        native.build()


def _child(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**child_env(), **env})


def test_switched_off_the_recorder_falls_back_to_the_dispatch_mode_and_says_so_once():
    proc = _child("""
import torch
from tbmem._internal.snapshot.recorder import DispatchRecorder
for _ in range(2):
    rec = DispatchRecorder()
    rec.start(); x = torch.ones(10) * 2; rec.stop()
    print(rec.backend_used, rec.snapshot(kind="snapshot", step=0).meta["recorder"])
""", TBMEM_NATIVE_RECORDER="0")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["dispatch TorchDispatchMode"] * 2
    lines = [line for line in proc.stderr.splitlines() if line.startswith("tbmem")]
    assert lines == ["tbmem: CPU snapshots use the dispatch-mode recorder (slower while recording): "
                     "switched off by TBMEM_NATIVE_RECORDER=0"]


def test_the_build_command_compiles_into_the_cache_and_the_next_process_loads_it(tmp_path):
    native_module()  # a compiler is here
    proc = subprocess.run([sys.executable, "-m", "tbmem", "snapshot", "build-recorder"], capture_output=True,
                          text=True, timeout=300, env={**child_env(), "TBMEM_CACHE_DIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert "CPU allocation recorder ready in" in proc.stdout
    built = [p for p in os.listdir(tmp_path) if p.startswith("_cpu_alloc_recorder-")]
    assert len(built) == 1 and str(tmp_path / built[0]) in proc.stdout
    proc = _child("""
from tbmem._internal.snapshot import native
mod = native.load(build_if_missing=False)
print(mod is not None and mod.installed(), native.library_path())
""", TBMEM_CACHE_DIR=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", str(tmp_path / built[0])]


def test_the_build_command_says_why_it_cannot_build_and_exits_1(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "tbmem", "snapshot", "build-recorder"], capture_output=True,
                          text=True, timeout=300, env={**child_env(), "TBMEM_CACHE_DIR": str(tmp_path),
                                                       "CXX": "/bin/false"})
    assert proc.returncode == 1 and proc.stdout == "", proc.stderr
    assert proc.stderr.startswith("tbmem: CPU allocation recorder not built: compiling the CPU allocation recorder "
                                  "failed"), proc.stderr


def test_a_process_forked_while_recording_records_nothing_in_the_child():
    mod = native_module()
    rec = DispatchRecorder(backend="allocator")
    rec.start()
    try:
        r, w = os.pipe()
        with warnings.catch_warnings():  # Python 3.12+ warns that forking a threaded process may deadlock
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # the child: its copy of this thread's list was emptied at the fork
            x = torch.ones(1000)
            os.write(w, repr((mod.thread_recordings(), mod.recordings_on_threads())).encode())
            del x
            os._exit(0)
        os.close(w)
        got = os.read(r, 200).decode()
        os.waitpid(pid, 0)
        assert mod.thread_recordings() == [True]
    finally:
        rec.stop()
    assert got == "([], 0)"
