"""Probes keep /proc files open (issue 18): every reading must still be the current one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import numpy as np
import psutil
import pytest

from tbmem._internal.probes import _procfs
from tbmem._internal.probes.host import HostProbe, read_rss
from tbmem._internal.probes.process_tree import ProcessTreeProbe

MiB = 2**20
_GROWER = ("import sys; blocks = []\n"
           "for line in sys.stdin:\n"
           "    b = bytearray(int(line) * 2**20); b[::4096] = b'x' * len(b[::4096]); blocks.append(b)\n"
           "    print('grown', flush=True)\n")


def test_a_changed_rss_is_seen_at_the_next_read():
    probe = HostProbe(peak_mode="run")
    before = probe.read()["ram_rss"]
    assert read_rss() == pytest.approx(psutil.Process().memory_info().rss, rel=0.05)
    block = np.ones(200 * MiB // 8)  # touched: resident
    grown = probe.read()["ram_rss"]
    grown_rss = read_rss()
    del block
    shrunk = probe.read()["ram_rss"]
    assert grown >= before + 0.9 * 200 * MiB and grown_rss >= before + 0.9 * 200 * MiB
    assert shrunk <= grown - 0.9 * 200 * MiB


def test_system_memory_and_cpu_are_read_at_every_record():
    probe = HostProbe()
    probe.start()
    probe.read()
    block = np.ones(300 * MiB // 8)  # 300 MiB more in use on the machine since the previous read
    second = probe.read()
    available = psutil.virtual_memory().available  # read now, from a freshly opened file
    del block
    # other processes move the machine's numbers as well, but not by 300 MiB in a millisecond
    assert second["ram_system_available"] == pytest.approx(available, abs=64 * MiB)
    assert second["cpu_percent"] > 0  # filling 300 MiB took CPU time since the previous read


def _statm_now() -> int:
    with open("/proc/self/statm", "rb") as fh:  # opened afresh: the truth to compare with
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_a_forked_child_reads_its_own_proc_files():
    from tbmem._internal.probes.process_tree import ProcessTreeProbe

    probe, tree = HostProbe(peak_mode="run"), ProcessTreeProbe()
    parent = probe.read()["ram_rss"]  # the /proc/self files are open now, in the parent
    tree.read()
    read_rss()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child, through the state it inherited: its own RSS, not its parent's
        try:
            before = probe.read()["ram_rss"]
            block = np.ones(300 * MiB // 8)
            out = [before, probe.read()["ram_rss"], read_rss(), _statm_now(), tree.read()["ram_tree_rss"],
                   int(block[0])]
            os.write(write_fd, json.dumps(out).encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd) as fh:
        before, after, rss, truth, tree_rss, _ = json.loads(fh.read())
    os.waitpid(pid, 0)
    assert after >= before + 0.9 * 300 * MiB
    assert after == pytest.approx(truth, rel=0.02) and rss == pytest.approx(truth, rel=0.02)
    assert tree_rss == pytest.approx(truth, rel=0.02)  # the child's own tree: itself, no parent
    assert probe.read()["ram_rss"] < parent + 0.5 * 300 * MiB  # and the parent still reads itself


def test_a_failed_read_is_retried_on_a_fresh_descriptor(monkeypatch):
    _procfs.pread_all("/proc/self/status")
    real = os.pread
    calls = []

    def failing_once(fd, n, offset):
        calls.append(fd)
        if len(calls) == 1:
            raise OSError(5, "Input/output error")
        return real(fd, n, offset)

    monkeypatch.setattr(os, "pread", failing_once)
    with pytest.raises(OSError):
        _procfs.pread_all("/proc/self/status")
    assert b"VmRSS" in _procfs.pread_all("/proc/self/status")


def _grower() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _GROWER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)


def _grow(child: subprocess.Popen, mb: int) -> None:
    child.stdin.write(f"{mb}\n")
    child.stdin.flush()
    assert child.stdout.readline().strip() == "grown"


def _stop(child: subprocess.Popen) -> None:
    child.kill()
    child.wait()
    child.stdin.close()
    child.stdout.close()


def test_tree_sees_a_new_child_of_the_reading_thread_at_once_and_its_growth(monkeypatch):
    monkeypatch.setattr(ProcessTreeProbe, "REFRESH_S", 1e9)  # no timed walk: only the change check
    probe = ProcessTreeProbe()
    alone = probe.read()
    probe.read()  # the calling thread's children are known now
    child = _grower()
    try:
        _grow(child, 40)
        with_child = probe.read()
        assert with_child["ram_tree_workers"] == alone["ram_tree_workers"] + 1
        assert with_child["ram_tree_rss"] >= alone["ram_tree_rss"] + 35 * MiB
        _grow(child, 60)  # a known child's RSS is read at every read
        grown = probe.read()
        assert grown["ram_tree_rss"] >= with_child["ram_tree_rss"] + 55 * MiB
    finally:
        _stop(child)
    ended = probe.read()  # an ended child is not counted, at once
    assert ended["ram_tree_workers"] == alone["ram_tree_workers"]


def test_tree_sees_another_threads_child_at_the_next_walk(monkeypatch):
    monkeypatch.setattr(ProcessTreeProbe, "REFRESH_S", 1e9)
    probe = ProcessTreeProbe()
    alone = probe.read()
    started: list[subprocess.Popen] = []
    ready, finish = threading.Event(), threading.Event()

    def spawn() -> None:  # the thread stays alive: a child of an ended thread moves to the main thread
        started.append(_grower())
        ready.set()
        finish.wait(60)

    thread = threading.Thread(target=spawn)
    thread.start()
    ready.wait(60)
    child = started[0]
    try:
        _grow(child, 40)
        # started by another thread: not seen before the next walk (documented, at most REFRESH_S)
        assert probe.read()["ram_tree_workers"] == alone["ram_tree_workers"]
        monkeypatch.setattr(ProcessTreeProbe, "REFRESH_S", 0.0)
        walked = probe.read()
        assert walked["ram_tree_workers"] == alone["ram_tree_workers"] + 1
        assert walked["ram_tree_rss"] >= alone["ram_tree_rss"] + 35 * MiB
    finally:
        _stop(child)
        finish.set()
        thread.join()
