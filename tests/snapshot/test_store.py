"""Atomic writes and pruning of snapshot files."""

from __future__ import annotations

import os

import pytest

from tbmem.snapshot.store import SnapshotStore


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
