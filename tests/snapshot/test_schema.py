"""The JSON+gzip schema: round trip, numbers, validation of crafted files."""

from __future__ import annotations

import gzip
import json
import time

import numpy as np
import pytest

from tbmem._internal.snapshot import SnapshotConfig
from tbmem._internal.snapshot.recorder import DispatchRecorder
from tbmem._internal.snapshot.schema import encode_json_gz, from_json, read_json_gz, to_json
from tests.snapshot._helpers import require_backend, small_snapshot


def test_round_trip_and_timeline(tmp_path):
    snap = small_snapshot(n=10)
    path = tmp_path / "s.json.gz"
    path.write_bytes(encode_json_gz(snap))
    back = read_json_gz(str(path))
    assert to_json(back) == to_json(snap)
    # independent timeline: pre-existing 4096, + 1024*(i+1) for i<10, then frees of the first 5
    sizes = [1024 * (i + 1) for i in range(10)]
    expected = list(4096 + np.cumsum(sizes)) + [4096 + sum(sizes) - sum(sizes[:k + 1]) for k in range(5)]
    assert back.timeline().tolist() == expected
    assert back.peak() == (9, 4096 + sum(sizes))
    assert back.alive_at(9).tolist() == list(range(11))


@pytest.mark.parametrize("patch, message", [
    ({"schema": "other"}, "not a tbmem.snapshot"),
    ({"version": 99}, "unsupported"),
    ({"frames": [[0, 1, 999]]}, "frames"),
    ({"stacks": [[5]]}, "stacks"),
    ({"strings": [1, 2]}, "strings"),
    ({"default_device": 3}, "default_device"),
    ({"devices": "x"}, "devices"),
])
def test_crafted_documents_are_rejected(patch, message):
    doc = to_json(small_snapshot(n=2))
    doc.update(patch)
    with pytest.raises(ValueError, match=message):
        from_json(doc)


@pytest.mark.parametrize("patch, message", [
    ({"allocs": {"start": [0], "end": [-1], "size": [1], "category": [7], "stack": [-1], "addr": [0]}}, "out-of-range"),
    ({"allocs": {"start": [0, 1], "end": [-1], "size": [1], "category": [0], "stack": [-1], "addr": [0]}}, "values"),
    ({"time_us": "abc"}, "time_us"),
    ({"time_us": {"dtype": "<i4", "b64": "AAA"}}, "base64|partial"),
    ({"time_us": {"dtype": "<f8", "b64": "AAAAAAAA+H8="}}, "exact integers"),
    ({"markers": [{"event": 99, "label": "x"}]}, "markers"),
])
def test_crafted_device_columns_are_rejected(patch, message):
    doc = to_json(small_snapshot(n=2))
    doc["devices"][0].update(patch)
    with pytest.raises(ValueError, match=message):
        from_json(doc)


def test_version_1_files_are_still_read():
    v1 = {"schema": "tbmem.snapshot", "version": 1, "source": "cuda", "kind": "oom", "device": "cuda:0", "rank": 0,
          "step": 4, "n_events": 2, "dropped": 0, "time_us": [0, 5], "t0_unix": 1.7e9, "strings": ["a.py", "f"],
          "frames": [[0, 3, 1]], "stacks": [[0]], "categories": ["activation"],
          "allocs": {"start": [0, -1], "end": [1, -1], "size": [100, 7], "category": [0, 0], "stack": [0, -1],
                     "addr": [1, 2]}, "meta": {"reserved_bytes": 4096, "oom_events": [{"size": 9, "device_free": 1}]}}
    snap = from_json(v1)
    assert snap.device == "cuda:0" and snap.peak_bytes() == 107 and snap.main.reserved_bytes == 4096
    assert snap.main.ooms[0]["requested_bytes"] == 9


def test_gzip_is_deterministic():
    snap = small_snapshot(n=5)
    assert encode_json_gz(snap) == encode_json_gz(snap)
    assert json.loads(gzip.decompress(encode_json_gz(snap)))["devices"][0]["n_events"] == snap.n_events


def test_builder_splits_devices_and_keeps_one_clock():
    from tbmem._internal.snapshot.schema import SnapshotBuilder

    b = SnapshotBuilder(source="dispatch", device="cpu")
    now = time.perf_counter_ns() // 1000  # the recorder's clock
    b.alloc(10, time_us=now, device="cpu")
    b.alloc(20, time_us=now + 1000, device="cuda:0")
    b.alloc(30, time_us=now + 2000, device="cpu")
    snap = b.build(kind="snapshot", step=0)
    assert [(d.name, d.n_events, d.peak_bytes()) for d in snap.devices] == [("cpu", 2, 40), ("cuda:0", 1, 20)]
    assert snap.devices[0].time_us.tolist() == [0, 2000] and snap.devices[1].time_us.tolist() == [1000]
    assert abs(snap.t0_unix - time.time()) < 60  # the wall-clock time of the first event


def test_recorder_ring_buffer_keeps_recent_events():
    import torch

    rec = DispatchRecorder(max_entries=100)
    rec.start()
    keep = []
    for i in range(200):
        keep.append(torch.full((i + 1,), 1.0))  # 200 allocations of 4*(i+1) bytes, all alive
    rec.stop()
    snap = rec.snapshot(kind="snapshot", step=0)
    assert snap.n_events <= 100 and snap.dropped == 200 - snap.n_events
    # allocations made before the kept window became "before the trace", none lost
    alive_sizes = sorted(snap.allocs["size"].tolist())
    assert alive_sizes == [4 * (i + 1) for i in range(200)]
    assert int((snap.allocs["start"] >= 0).sum()) == snap.n_events


@pytest.mark.parametrize("backend", ["dispatch", "allocator"])
def test_recorder_sees_frees_and_views(backend):
    import torch

    require_backend(backend)
    rec = DispatchRecorder(backend=backend)
    rec.start()
    a = torch.ones(1000)
    v = a[10:20].view(2, 5)  # a view: no new allocation
    b = a * 2
    del a, v
    rec.stop()
    snap = rec.snapshot(kind="snapshot", step=0)
    sizes, ends = snap.allocs["size"].tolist(), snap.allocs["end"].tolist()
    if backend == "allocator":
        # the allocator also sees the 0-dim tensor wrapping the Python number 2 (and its float copy):
        # real blocks, freed when the multiplication returns
        assert sizes == [4000, 8, 4, 4000] and ends[1] >= 0 and ends[2] >= 0
        sizes, ends = [sizes[0], sizes[3]], [ends[0], ends[3]]
    assert sizes == [4000, 4000]
    assert ends[0] == snap.n_events - 1 and ends[1] == -1  # a's free is the last event
    del b


def test_config_validation_and_mapping():
    cfg = SnapshotConfig.from_mapping({"snapshot_every": 50, "steps": [30, 10, 30], "window": 3})
    assert cfg.every == 50 and cfg.steps == (10, 30)
    assert [s for s in range(0, 120) if cfg.is_due(s)] == [0, 10, 30, 50, 100]
    with pytest.raises(ValueError, match=r"unknown SnapshotConfig key 'bogus'; valid keys: "):
        SnapshotConfig.from_mapping({"bogus": 1})
    for field, value in (("every", -1), ("window", 1.5), ("recorder", "gpu"), ("max_disk_mb", -1),
                         ("steps", [-3]), ("max_entries", 0), ("rank", -2), ("html", "yes")):
        with pytest.raises(ValueError, match=f"SnapshotConfig.{field}"):
            SnapshotConfig(**{field: value})
