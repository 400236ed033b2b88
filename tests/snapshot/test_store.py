"""Atomic writes and pruning of snapshot files."""

from __future__ import annotations

import os

import pytest
import torch

from tbmem._internal.snapshot.store import SnapshotStore


def _write(store, kind, step, nbytes=1000):
    for ext in ("json.gz", "html"):
        store.write_bytes(store.path(kind, step, ext), b"x" * nbytes)
    return store.prune(keep=(kind, step))


def test_atomic_write_leaves_no_temp_on_failure(tmp_path):
    store = SnapshotStore(str(tmp_path), rank=0, max_snapshots=0, max_disk_mb=0)
    target = store.path("snapshot", 1, "json.gz")

    def boom(fh):
        fh.write(b"partial")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        store.write_with(target, boom)
    assert os.listdir(store.folder) == []
    store.write_bytes(target, b"complete")
    assert os.listdir(store.folder) == [os.path.basename(target)]
    with open(target, "rb") as fh:
        assert fh.read() == b"complete"


def test_max_snapshots_prunes_oldest_and_keeps_oom(tmp_path):
    store = SnapshotStore(str(tmp_path), rank=3, max_snapshots=2, max_disk_mb=0)
    _write(store, "snapshot", 10)
    _write(store, "oom", 15)
    _write(store, "snapshot", 20)
    removed = _write(store, "snapshot", 30)
    assert sorted(os.path.basename(p) for p in removed) == [
        "snapshot_rank3_step000000010.html", "snapshot_rank3_step000000010.json.gz"]
    assert sorted(k for k in store.groups()) == [("oom", 15), ("snapshot", 20), ("snapshot", 30)]


def test_disk_budget_prunes_but_keeps_oom_and_newest(tmp_path):
    # budget 5000 bytes; each snapshot is 2000 bytes, the OOM one 4000 bytes
    store = SnapshotStore(str(tmp_path), rank=0, max_snapshots=0, max_disk_mb=5000 / 2**20)
    _write(store, "oom", 1, nbytes=2000)
    _write(store, "snapshot", 2)
    _write(store, "snapshot", 3)
    assert sorted(store.groups()) == [("oom", 1), ("snapshot", 3)]
    _write(store, "snapshot", 4, nbytes=5000)  # alone over budget: still kept, it is the newest
    assert sorted(store.groups()) == [("oom", 1), ("snapshot", 4)]


def test_other_ranks_files_untouched(tmp_path):
    a = SnapshotStore(str(tmp_path), rank=0, max_snapshots=1, max_disk_mb=0)
    b = SnapshotStore(str(tmp_path), rank=1, max_snapshots=1, max_disk_mb=0)
    _write(b, "snapshot", 1)
    _write(a, "snapshot", 1)
    _write(a, "snapshot", 2)
    assert sorted(b.groups()) == [("snapshot", 1)] and sorted(a.groups()) == [("snapshot", 2)]


def test_pruning_never_removes_a_file_this_store_did_not_write(tmp_path):
    folder = tmp_path / "plugins" / "tbmem"
    folder.mkdir(parents=True)
    users = folder / "snapshot_rank0_step000000005.pickle"  # the user's, named as tbmem names its files
    users.write_bytes(b"the user's own snapshot")
    earlier = folder / "snapshot_rank0_step000000001.json.gz"  # an earlier run's, in the same logdir
    earlier.write_bytes(b"{}")
    store = SnapshotStore(str(tmp_path), rank=0, max_snapshots=1, max_disk_mb=0)
    for step in (10, 20, 30):
        paths, error = store.write_files("snapshot", step, [("json.gz", lambda fh: fh.write(b"{}"))])
        assert error is None
        store.prune(keep=("snapshot", step))
    assert users.read_bytes() == b"the user's own snapshot" and earlier.exists()
    assert sorted(p.name for p in folder.iterdir()) == [
        "snapshot_rank0_step000000001.json.gz", "snapshot_rank0_step000000005.pickle",
        "snapshot_rank0_step000000030.json.gz"]


def test_a_taken_name_gets_the_next_free_one_and_nothing_is_overwritten(tmp_path):
    a = SnapshotStore(str(tmp_path), rank=0, max_snapshots=0, max_disk_mb=0)
    b = SnapshotStore(str(tmp_path), rank=0, max_snapshots=0, max_disk_mb=0)
    files = [("json.gz", lambda fh: fh.write(b"a")), ("html", lambda fh: fh.write(b"a"))]
    first, _ = a.write_files("snapshot", 4, files)
    second, _ = b.write_files("snapshot", 4, [("json.gz", lambda fh: fh.write(b"b"))])
    third, _ = a.write_files("snapshot", 4, files)
    names = [os.path.basename(p) for p in first + second + third]
    assert names == ["snapshot_rank0_step000000004.json.gz", "snapshot_rank0_step000000004.html",
                     "snapshot_rank0_step000000004-2.json.gz",
                     "snapshot_rank0_step000000004-3.json.gz", "snapshot_rank0_step000000004-3.html"]
    with open(first[0], "rb") as fh:
        assert fh.read() == b"a"
    with open(second[0], "rb") as fh:
        assert fh.read() == b"b"


def test_a_failure_after_the_first_file_keeps_what_was_written(tmp_path):
    import errno

    store = SnapshotStore(str(tmp_path), rank=0, max_snapshots=0, max_disk_mb=0)

    def full(fh):
        fh.write(b"<html>")
        raise OSError(errno.ENOSPC, "No space left on device")

    paths, error = store.write_files("oom", 7, [("json.gz", lambda fh: fh.write(b"{}")), ("html", full),
                                                ("pickle", lambda fh: fh.write(b"p"))])
    assert [os.path.basename(p) for p in paths] == ["oom_rank0_step000000007.json.gz"]
    assert error.errno == errno.ENOSPC
    assert os.listdir(store.folder) == ["oom_rank0_step000000007.json.gz"]  # no temp file left


def test_two_writers_on_one_logdir_keep_each_others_snapshots(tmp_path):
    import torch

    from tbmem import MemoryWriter
    from tbmem._internal.snapshot import load_snapshot

    cfg = {"every": 2, "html": False, "max_snapshots": 2}
    one = MemoryWriter(tmp_path, every=10, census_every=0, snapshot=cfg)
    two = MemoryWriter(tmp_path, every=10, census_every=0, snapshot=cfg)
    for step in range(7):
        x = torch.ones(256 * (step + 1))
        one.log_memory(step)
        two.log_memory(step)
        del x
    one.close()
    two.close()
    names = sorted(os.listdir(tmp_path / "plugins" / "tbmem"))
    # each kept its own 2 newest (steps 4 and 6); neither overwrote nor pruned the other's
    assert names == ["snapshot_rank0_step000000004-2.json.gz", "snapshot_rank0_step000000004.json.gz",
                     "snapshot_rank0_step000000006-2.json.gz", "snapshot_rank0_step000000006.json.gz"]
    for name in names:
        assert load_snapshot(tmp_path / "plugins" / "tbmem" / name).step in (4, 6)


@pytest.fixture
def umask_027():
    old = os.umask(0o027)
    try:
        yield
    finally:
        os.umask(old)


def test_snapshot_files_follow_the_umask_like_event_files(tmp_path, umask_027):
    import stat

    from tbmem import MemoryWriter

    model = torch.nn.Linear(32, 32)
    with MemoryWriter(tmp_path, every=1, census_every=0, snapshot={"every": 2, "window": 1, "html": True}) as writer:
        for step in range(3):
            model(torch.randn(8, 32)).sum().backward()
            writer.log_memory(step)
    events = list(tmp_path.glob("events.out.tfevents*"))
    snapshots = sorted((tmp_path / "plugins" / "tbmem").glob("snapshot_*"))
    assert events and {p.suffix for p in snapshots} == {".gz", ".html"}
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in events + snapshots}
    assert set(modes.values()) == {0o640}, modes  # 0o666 & ~0o027; mkstemp alone gave 0o600


def test_store_files_get_0644_under_umask_022(tmp_path):
    import stat

    old = os.umask(0o022)
    try:
        store = SnapshotStore(str(tmp_path), rank=0, max_snapshots=0, max_disk_mb=0)
        path = store.write_bytes(store.path("snapshot", 1, "json.gz"), b"{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
