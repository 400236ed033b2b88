"""The benchmark's synthetic snapshot pickle is what CPython's pickler writes for the same objects."""

from __future__ import annotations

import io
import pickle

import pytest

from benchmarks.bench_snapshot import write_torch_pickle


def _objects(data: bytes):
    return pickle.loads(data)


@pytest.mark.parametrize("kw", [dict(n_entries=3000), dict(n_entries=5000, devices=3, other_entries=1, cpp=True),
                                dict(n_entries=2000, time_us=False, compile_context=False, oom=False)])
def test_generator_writes_what_the_pickler_writes(kw):
    buf = io.BytesIO()
    write_torch_pickle(buf, **kw)
    data = buf.getvalue()
    # re-pickling what it holds gives the same bytes: same values, same sharing, same frames
    assert pickle.dumps(_objects(data), protocol=4) == data


def test_generator_is_realistic():
    buf = io.BytesIO()
    write_torch_pickle(buf, 20_000)
    d = pickle.loads(buf.getvalue())
    trace = d["device_traces"][0]
    actions = {e["action"] for e in trace}
    assert {"alloc", "free_requested", "free_completed", "segment_alloc", "oom"} <= actions
    pairs = [(a, b) for a, b in zip(trace, trace[1:]) if a["action"] == "free_requested"]
    assert all(b["frames"] is a["frames"] for a, b in pairs)  # torch shares the free site's list
    depths = [len(e["frames"]) for e in trace if e["action"] == "alloc" and e["frames"]]
    assert 5 <= sum(depths) / len(depths) <= 20
    assert any(not e["frames"] for e in trace if e["action"] == "alloc")  # backward: no Python frames
    assert d["segments"] and all(s["blocks"] for s in d["segments"])


def test_generator_segments_are_what_its_trace_leaves():
    """The final ``segments`` are the state the trace's own events leave: every segment the trace
    reserves and does not release is there with its size, every allocation alive at the end is an
    active block of its requested size, blocks tile their segment, and empty_cache() releases
    segments in the trace (the old generator wrote one segment per live allocation instead)."""
    buf = io.BytesIO()
    write_torch_pickle(buf, 30_000, empty_cache_every=10_000)
    d = pickle.loads(buf.getvalue())
    trace = d["device_traces"][0]
    reserved: dict[int, int] = {}
    alive: dict[int, int] = {}
    released = 0
    for e in trace:
        a = e["action"]
        if a == "segment_alloc":
            reserved[e["addr"]] = e["size"]
        elif a == "segment_free":
            released += 1
            assert reserved.pop(e["addr"], None) == e["size"] or e["addr"] not in {s["address"] for s in d["segments"]}
        elif a == "alloc":
            alive[e["addr"]] = e["size"]
        elif a == "free_completed":
            alive.pop(e["addr"], None)
    assert released and reserved
    final = {s["address"]: s for s in d["segments"]}
    assert all(a in final and final[a]["total_size"] == size for a, size in reserved.items())
    blocks = {b["address"]: b for s in d["segments"] for b in s["blocks"] if b["state"] == "active_allocated"}
    assert alive and all(blocks[a]["requested_size"] == size for a, size in alive.items())
    for s in d["segments"]:
        end = s["address"]
        for b in s["blocks"]:
            assert b["address"] == end
            end += b["size"]
        assert end == s["address"] + s["total_size"]
        assert s["allocated_size"] == sum(b["size"] for b in s["blocks"] if b["state"] == "active_allocated")
