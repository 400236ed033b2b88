"""A trace event's ``pool_id`` (torch >= 2.11 writes it on every event: torch/cuda/memory.py's ``TraceEntry``)
read by every reader tier alike: the C runs, the interpreter alone, the restricted Unpickler; shown per pool in
``tbmem snapshot stats`` and the viewer; a snapshot without it reads as before."""

from __future__ import annotations

import io
import pickle

import numpy as np
import pytest

from benchmarks._snapshot_pickle import POOL_IDS
from tbmem._internal.snapshot import readers
from tbmem._internal.snapshot.cuda import convert_torch_snapshot
from tbmem._internal.snapshot.safe_pickle import load_plain
from tbmem._internal.snapshot.stats import pools_doc, stats_doc
from tests._shared import REAL, REAL2, real_pickles
from tests.snapshot.test_pickle_scan_c import _events_by_c, _read, _require_c, _same_rows, _synthetic

MiB = 2**20


def _tiers(data: bytes, monkeypatch: pytest.MonkeyPatch) -> dict:
    """The snapshot as each tier reads it: the C runs, the interpreter alone, the restricted Unpickler."""
    out = {"c": readers.read_snapshot(io.BytesIO(data), "s.pickle")}
    monkeypatch.setattr(readers, "C_READER", False)
    out["interpreter"] = readers.read_snapshot(io.BytesIO(data), "s.pickle", unpickle=False)
    out["unpickler"] = readers.read_snapshot(io.BytesIO(data), "s.pickle")
    monkeypatch.undo()
    return out


def _devices(snap) -> list:
    return [(d.name, {c: v.tolist() for c, v in d.allocs.items()},
             None if d.segs is None else {c: v.tolist() for c, v in d.segs.items()},
             [list(p) for p in d.pools], d.ooms) for d in snap.devices]


def _pools_of_pieces(dev) -> list:
    return sorted({tuple(dev.pools[k]) if k >= 0 else None for k in dev.segs["pool"].tolist()},
                  key=lambda p: (p is not None, p or ()))


@pytest.mark.parametrize("style", ["inline", "shared"])
def test_every_tier_reads_the_pool_of_each_event(style, monkeypatch):
    _require_c()
    data = _synthetic(n_entries=4000, empty_cache_every=1000, pool_id=style)
    assert _events_by_c(data) >= 3000  # the events with a pool_id are the C runs' too, not the interpreter's
    by_c, alone = _read(data, c=True), _read(data, c=False)
    _same_rows(by_c, alone)
    rows = by_c[1]
    assert set(rows.pool_ids) == set(POOL_IDS) and rows.pools  # every width of integer read
    snaps = _tiers(data, monkeypatch)
    assert _devices(snaps["c"]) == _devices(snaps["interpreter"]) == _devices(snaps["unpickler"])
    dev = snaps["c"].devices[0]
    assert "pool_id" not in snaps["c"].meta.get("unknown_event_keys", [])
    # every segment reserved and released in the trace now has its pool; the oom event names its own
    released = dev.segs["end"] >= 0
    assert released.any() and (dev.segs["pool"][released] >= 0).all()
    [oom] = dev.ooms
    assert oom["pool"] == list(POOL_IDS[((3 << 20) >> 21) % len(POOL_IDS)])  # the writer picks it by address


def test_without_the_field_the_released_segments_pool_is_not_known(monkeypatch):
    _require_c()
    data = _synthetic(n_entries=4000, empty_cache_every=1000)
    snap = _tiers(data, monkeypatch)["c"]
    dev = snap.devices[0]
    released = dev.segs["end"] >= 0
    assert released.any() and (dev.segs["pool"][released] == -1).all() and "pool" not in dev.ooms[0]
    data = _synthetic(n_entries=4000, empty_cache_every=1000, pool_id="inline")
    with_pools = readers.read_snapshot(io.BytesIO(data), "s.pickle").devices[0]
    # the same allocations and segments; only the pools are known now
    assert {c: v.tolist() for c, v in dev.allocs.items()} == {c: v.tolist() for c, v in with_pools.allocs.items()}
    for c in ("addr", "size", "start", "end", "stream", "flags"):
        assert dev.segs[c].tolist() == with_pools.segs[c].tolist()


def _with_pool_ids(top: dict) -> dict:
    """A real snapshot as torch >= 2.11 writes it: each event carries the pool of the segment it lies in
    (the final segments'; (0, 0) where none holds it)."""
    finals = [(s["address"], s["address"] + s["total_size"], tuple(s["segment_pool_id"])) for s in top["segments"]]
    for trace in top["device_traces"]:
        for e in trace:
            addr = e.get("addr", -1)
            e["pool_id"] = next((p for lo, hi, p in finals if lo <= addr < hi), (0, 0))
    return top


@pytest.mark.parametrize("name", ["magma27_memory_snapshot.pickle", "octreenca_752276c_my_snapshot.pickle"])
def test_a_real_snapshot_with_pool_ids_reads_alike_in_every_tier(name, monkeypatch):
    _require_c()
    [path] = [p for p in real_pickles(REAL) + real_pickles(REAL2) if p.name == name]
    plain = readers.load_snapshot(path)
    top = _with_pool_ids(load_plain(str(path)))
    data = pickle.dumps(top, protocol=4)
    snaps = _tiers(data, monkeypatch)
    assert _devices(snaps["c"]) == _devices(snaps["interpreter"]) == _devices(snaps["unpickler"])
    for before, after in zip(plain.devices, snaps["c"].devices):
        assert {c: v.tolist() for c, v in before.allocs.items()} == {c: v.tolist() for c, v in after.allocs.items()}
        if before.segs is not None:
            assert None not in _pools_of_pieces(after)  # what was "not known" is now the event's pool


def test_real_snapshots_without_the_field_read_as_before():
    """No real snapshot here has a ``pool_id`` on its events: the reader keeps none, and every pool comes
    from the final segments (a piece no final segment holds stays not known)."""
    for path in real_pickles(REAL) + real_pickles(REAL2):
        top = load_plain(str(path))
        assert not any("pool_id" in e for t in top.get("device_traces", []) for e in t)
        snap = readers.load_snapshot(path)
        finals = {tuple(s["segment_pool_id"]) for s in top.get("segments", []) if "segment_pool_id" in s}
        for dev in snap.devices:
            assert {tuple(p) for p in dev.pools} <= finals
            assert not any("pool" in o for o in dev.ooms)


def _ev(action, addr, size, t, pool=None):
    e = {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": 1_757_000_000_000_000 + t,
         "frames": [{"filename": "/home/u/train.py", "line": 42, "name": "forward"}]}
    return e if pool is None else {**e, "pool_id": pool}


def _seg(addr, total, pool, used):
    return {"device": 0, "address": addr, "total_size": total, "stream": 0, "segment_type": "large",
            "segment_pool_id": pool, "is_expandable": False, "frames": [],
            "blocks": [{"address": addr, "size": used, "requested_size": used, "state": "active_allocated",
                        "frames": []}]}


def _graph_pool_snapshot(with_pools: bool):
    """A default-pool segment before the trace, a CUDA graph's pool (0, 1) reserving 40 MiB, and a 16 MiB
    segment of that graph pool reserved and released during the trace (no final segment says its pool)."""
    A, B, D = 0x10000000, 0x20000000, 0x40000000
    p0, p1 = ((0, 0), (0, 1)) if with_pools else (None, None)
    trace = [_ev("alloc", A, 4 * MiB, 0, p0), _ev("segment_alloc", B, 40 * MiB, 10, p1),
             _ev("alloc", B, 30 * MiB, 11, p1), _ev("segment_alloc", D, 16 * MiB, 20, p1),
             _ev("segment_free", D, 16 * MiB, 30, p1)]
    final = [_seg(A, 20 * MiB, (0, 0), 4 * MiB), _seg(B, 40 * MiB, (0, 1), 30 * MiB)]
    return convert_torch_snapshot({"segments": final, "device_traces": [trace]}, kind="snapshot", step=0)


def test_stats_per_pool():
    [dev] = _graph_pool_snapshot(True).devices
    doc = pools_doc(dev, None)
    assert doc == [{"pool": [0, 0], "reserved_bytes": 20 * MiB, "most_reserved_bytes": 20 * MiB, "allocated_bytes": 0,
                    "segments": 0},
                   {"pool": [0, 1], "reserved_bytes": 40 * MiB, "most_reserved_bytes": 56 * MiB, "allocated_bytes": 0,
                    "segments": 0}]
    snap = _graph_pool_snapshot(True)
    [d] = stats_doc(snap)["devices"]
    assert [(p["pool"], p["reserved_bytes"], p["most_reserved_bytes"], p["allocated_bytes"], p["segments"])
            for p in d["pools"]] == [([0, 0], 20 * MiB, 20 * MiB, 4 * MiB, 1), ([0, 1], 40 * MiB, 56 * MiB, 30 * MiB, 1)]
    # without the field the released segment's 16 MiB belong to no known pool
    [d] = stats_doc(_graph_pool_snapshot(False))["devices"]
    assert [(p["pool"], p["most_reserved_bytes"]) for p in d["pools"]] == [
        (None, 16 * MiB), ([0, 0], 20 * MiB), ([0, 1], 40 * MiB)]
    from tbmem._internal.snapshot.stats import stats_text
    text = stats_text(snap)
    assert "private pool (0, 1): reserved 40.0 MiB at the end in 1 segment(s), at most 56.0 MiB, allocated 30.0 MiB" in text


def test_the_oom_request_is_measured_against_its_own_pool():
    """A 10 MiB request to the graph pool (0, 1): the default pool's 16 MiB free block is not one it can use."""
    from tbmem._internal.oom.explain import explain_device

    A, B = 0x10000000, 0x20000000
    trace = [_ev("alloc", B, 30 * MiB, 0, (0, 1)),
             {"action": "oom", "device_free": MiB, "size": 10 * MiB, "stream": 0, "frames": [],
              "time_us": 1_757_000_000_000_100, "pool_id": (0, 1)}]
    final = [_seg(A, 20 * MiB, (0, 0), 4 * MiB), _seg(B, 32 * MiB, (0, 1), 30 * MiB)]
    snap = convert_torch_snapshot({"segments": final, "device_traces": [trace]}, kind="oom", step=0)
    dev = snap.devices[0]
    [oom] = dev.ooms
    assert oom["pool"] == [0, 1]
    x = explain_device(dev, oom, categories=snap.categories, strings=snap.strings, frames=snap.frames,
                       stacks=snap.stacks)
    assert x.pool == [0, 1] and x.largest_free_block_bytes == 2 * MiB and x.verdict == "device_full"
    without = explain_device(dev, {k: v for k, v in oom.items() if k != "pool"}, categories=snap.categories,
                             strings=snap.strings, frames=snap.frames, stacks=snap.stacks)
    assert without.largest_free_block_bytes == 16 * MiB and without.verdict == "fragmented"
    assert np.all(dev.segs["pool"] >= 0)
