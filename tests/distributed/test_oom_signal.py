"""The out-of-memory signal through a real TCPStore (two ranks' signals in one process)."""

from __future__ import annotations

import threading
import time

import pytest
import torch.distributed as dist

from tbmem._internal.config import MemoryWriterConfig
from tbmem._internal.ranks.context import RankInfo
from tbmem._internal.ranks.oom import OomSignal
from tbmem._internal.ranks.store import JobStore
from tbmem._internal.ranks.support import RankSupport


@pytest.fixture
def job_env():
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(server.port), "TORCHELASTIC_RUN_ID": "t",
           "TORCHELASTIC_RESTART_COUNT": "0"}
    yield env
    del server


def test_the_failed_rank_waits_for_the_others_pictures(job_env):
    seen: list[tuple[int, int, bool, str]] = []
    done = threading.Event()

    def picture(oom_rank: int, oom_step: int, from_watcher: bool) -> None:
        time.sleep(0.3)  # writing a snapshot takes a while: the failed rank must wait for it
        seen.append((oom_rank, oom_step, from_watcher, threading.current_thread().name))
        done.set()

    rank0 = OomSignal(JobStore.connect(environ=job_env), rank=0, world_size=2, on_peer_oom=picture, wait_s=30)
    rank1 = OomSignal(JobStore.connect(environ=job_env), rank=1, world_size=2,
                      on_peer_oom=lambda *a: pytest.fail("rank 1 must not picture its own OOM"), wait_s=30)
    try:
        rank1.signal(step=7)  # returns once rank 0 confirmed
        assert seen == [(1, 7, True, "tbmem-oom-watch-rank0")]
        assert rank1.store.add("oom/1/pics", 0) == 2 == rank1.store.add("oom/watchers", 0)
    finally:
        rank0.close()
        rank1.close()
    assert not rank0._thread.is_alive() and not rank1._thread.is_alive()


def test_a_rank_that_never_confirms_costs_at_most_oom_wait_s(job_env, tbmem_log):
    stuck = threading.Event()
    rank1 = OomSignal(JobStore.connect(environ=job_env), rank=1, world_size=3, on_peer_oom=lambda *a: None,
                      wait_s=1.0)
    rank2 = OomSignal(JobStore.connect(environ=job_env), rank=2, world_size=3,
                      on_peer_oom=lambda *a: stuck.wait(10), wait_s=1.0)  # its picture takes too long
    try:
        start = time.monotonic()
        rank1.signal(step=2)  # rank 0 has no tbmem writer (no watcher): nobody waits for it
        assert time.monotonic() - start < 5
    finally:
        stuck.set()
        rank1.close()
        rank2.close()
    assert "1 of the 2 ranks with a tbmem writer confirmed their snapshots within 1 s" in tbmem_log.text


def test_store_operations_go_on_while_the_watcher_waits(job_env):
    # Regression: the watcher blocked in wait() on the same connection held every other store call.
    store = JobStore.connect(environ=job_env)
    signal = OomSignal(store, rank=0, world_size=2, on_peer_oom=lambda *a: None, wait_s=0)
    result: list[int] = []
    t = threading.Thread(target=lambda: result.append(store.add("ranks/closed", 1)), daemon=True)
    t.start()
    t.join(timeout=20)
    signal.close()
    assert result == [1]


def test_the_training_thread_writes_the_picture_when_it_comes_by(job_env, monkeypatch):
    for key, value in job_env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr("tbmem._internal.ranks.support.distributed_ready", lambda: True)
    threads: list[str] = []

    class Snapshots:
        def on_oom(self, step, exc, *, stop_recording):  # noqa: ANN001
            threads.append(threading.current_thread().name)
            assert not stop_recording and step == 41 and "rank 1 ran out of memory at its step 9" in str(exc)

    support = RankSupport(RankInfo(rank=0, world_size=2, source="dist"),
                          MemoryWriterConfig(every=10, ranks={"aggregate": False}))
    support.attach(write=lambda values, step: None, snapshots=Snapshots, flush=lambda: None)
    support.last_step = 41
    other = JobStore.connect(environ=job_env)
    other.set("oom/1", "1:9")
    other.first("wake/0/1", "1")
    deadline = time.monotonic() + 20
    while support._peer is None and time.monotonic() < deadline:  # the watcher hands it over ...
        time.sleep(0.01)
    support.on_log(41)  # ... and the training thread, passing by within the second, writes it
    assert threads == ["MainThread"]
    while other.add("oom/1/pics", 0) < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert other.add("oom/1/pics", 0) == 1
    support.close()
    assert other.add("oom/watchers", 0) == 0  # closing the last writer stops the process's watcher


def test_writers_of_one_process_share_one_watcher(job_env, monkeypatch):
    for key, value in job_env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr("tbmem._internal.ranks.support.distributed_ready", lambda: True)
    config = MemoryWriterConfig(ranks={"aggregate": False})
    calls: list[int] = []
    supports = []
    for i in range(2):
        support = RankSupport(RankInfo(rank=0, world_size=2, source="dist"), config)
        support._on_peer_oom = lambda r, s, w, i=i: calls.append(i)  # type: ignore[method-assign]
        support.attach(write=lambda values, step: None, snapshots=lambda: None, flush=lambda: None)
        supports.append(support)
    other = JobStore.connect(environ=job_env)
    assert other.add("oom/watchers", 0) == 1 and supports[0]._oom is supports[1]._oom
    other.set("oom/1", "1:3")
    other.first("wake/0/1", "1")
    deadline = time.monotonic() + 20
    while other.add("oom/1/pics", 0) < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sorted(calls) == [0, 1]  # both writers got the event from the one watcher
    supports[0].close()
    assert other.add("oom/watchers", 0) == 1  # still one writer
    supports[1].close()
    assert other.add("oom/watchers", 0) == 0


def test_a_peer_picture_from_the_watcher_thread_keeps_the_recorder_running(tmp_path):
    import torch

    from tbmem._internal.ranks.oom import PeerOutOfMemoryError
    from tbmem._internal.snapshot import SnapshotConfig, SnapshotManager
    from tbmem._internal.snapshot.readers import load_snapshot

    mgr = SnapshotManager(SnapshotConfig(every=100, html=False, recorder="dispatch", rank=0), log_dir=str(tmp_path))
    x = torch.ones(256) * 2  # recorded by the training thread's dispatch mode
    paths: list[str] = []
    exc = PeerOutOfMemoryError(oom_rank=1, oom_step=3, rank=0, step=3)
    t = threading.Thread(target=lambda: paths.extend(mgr.on_oom(3, exc, stop_recording=False)))
    t.start()
    t.join(timeout=30)
    assert mgr._recorder is not None and mgr._recorder.active  # a dispatch mode is left by its own thread
    y = torch.ones(512) * 3  # still recorded
    mgr.on_step(100)
    snap = load_snapshot(paths[0])
    assert (snap.kind, snap.rank) == ("oom", 0)
    assert snap.meta["exception"].startswith("PeerOutOfMemoryError: rank 1 ran out of memory at its step 3")
    assert 1024 in snap.allocs["size"].tolist()
    later = load_snapshot(str(tmp_path / "plugins" / "tbmem" / "snapshot_rank0_step000000100.json.gz"))
    assert 2048 in later.allocs["size"].tolist()
    mgr.close()
    del x, y
