"""The streaming pickle reader: same events as unpickling, bounded memory, hostile files refused with a reason."""

from __future__ import annotations

import gzip
import io
import os
import pickle

import pytest

from tbmem._internal.snapshot.pickle_rows import ACTIONS, NO_TIME, Limits, SnapshotRefused
from tbmem._internal.snapshot.pickle_stream import read_pickle
from tbmem._internal.snapshot.readers import load_snapshot
from tbmem._internal.snapshot.safe_pickle import UnsafePickleError, load_plain
from tests._shared import REAL_PICKLES, require_shared


def _events_equal(path_or_bytes):
    data = load_plain(io.BytesIO(path_or_bytes)) if isinstance(path_or_bytes, bytes) else load_plain(path_or_bytes)
    src = io.BytesIO(path_or_bytes) if isinstance(path_or_bytes, bytes) else open(path_or_bytes, "rb")
    with src:
        top, rows = read_pickle(src)
    cols = {c: rows.column(c) for c in ("action", "addr", "size", "time", "stack")}
    traces = data["device_traces"] if isinstance(data, dict) else []
    for i, trace in enumerate(traces):
        idx = rows.rows_of(top["device_traces"][i])
        cols = {c: rows.column(c) for c in ("action", "addr", "size", "time", "stack")}  # rows_of may add rows
        assert len(idx) == len(trace)
        for j, e in zip(idx.tolist(), trace):
            assert ACTIONS[cols["action"][j]] == e["action"]
            assert cols["addr"][j] == e.get("device_free" if e["action"] == "oom" else "addr")
            assert cols["size"][j] == e["size"] and cols["time"][j] == e.get("time_us", NO_TIME)
            sid = int(cols["stack"][j])
            got = [rows.frames[f] for f in rows.stacks[sid]] if sid >= 0 else []
            assert got == [(f["filename"], f["line"], f["name"]) for f in e.get("frames", [])]
    return top, rows


@pytest.mark.parametrize("name", REAL_PICKLES)
def test_real_snapshots_read_as_unpickling_reads_them(name):
    _events_equal(str(require_shared() / name))


def test_synthetic_snapshot_fast_path_equals_unpickling():
    from benchmarks.bench_snapshot import write_torch_pickle

    buf = io.BytesIO()
    facts = write_torch_pickle(buf, 20_000, devices=3, other_entries=500, cpp=True)
    top, rows = _events_equal(buf.getvalue())
    assert rows.count == sum(facts["entries"]) >= 21_000


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_every_protocol_and_the_python_pickler(protocol):
    from tests.snapshot._helpers import torch_dict

    for dumps in (pickle.dumps, pickle._dumps):
        _events_equal(dumps(torch_dict(), protocol=protocol))


def test_planted_global_is_refused_before_anything_runs(tmp_path):
    class Planted:
        def __reduce__(self):
            return (os.mkdir, (str(tmp_path / "was-run"),))

    data = pickle.dumps({"segments": [], "device_traces": [[Planted()]]})
    with pytest.raises(UnsafePickleError, match="GLOBAL"):
        read_pickle(io.BytesIO(data))
    assert not (tmp_path / "was-run").exists()


@pytest.mark.parametrize("data, message", [
    (b"", "truncated"),
    (pickle.dumps({"segments": []})[:-3], "truncated"),
    (b"\x80\x04\x95\x05\x00\x00", "truncated"),
    (b"\x80\x04\xfe.", "unknown pickle opcode"),
    (b"\x80\x04j\x10\x27\x00\x00.", "never stored"),
    (b"\x80\x04\x8a\x40" + b"\x01" * 64 + b".", "over the limit"),
    (b"\x80\x04X\xff\xff\xff\x7f", "over the limit"),
    (b"\x80\x04e.", "without a MARK"),
    (b"not a pickle at all", "not a pickle"),
    (b"\x80\x04(}\x91.", "not hashable"),  # FROZENSET of a dict (raised TypeError)
])
def test_malformed_pickles_say_why(data, message):
    with pytest.raises(SnapshotRefused, match=message):
        read_pickle(io.BytesIO(data))


def test_sizes_of_2_62_are_refused_not_wrapped(tmp_path):
    # issue 16 #13: sums of such sizes wrap 64-bit counters into a wrong peak
    ev = {"action": "alloc", "addr": 8, "size": 2**62, "stream": 0, "frames": []}
    path = tmp_path / "big.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [[ev, dict(ev, addr=16)]]}))
    with pytest.raises(SnapshotRefused, match="Limits.max_bytes"):
        load_snapshot(path)
    seg = {"device": 0, "address": 0, "total_size": 2**62, "blocks": []}
    path.write_bytes(pickle.dumps({"segments": [seg], "device_traces": []}))
    with pytest.raises(SnapshotRefused, match="total_size"):
        load_snapshot(path)


def test_gzip_bomb_is_refused_before_it_is_expanded(tmp_path):
    # issue 16 #13: 1 MB of gzip expanding to 1 GB of whitespace took 2.3 GB of memory
    path = tmp_path / "bomb.json.gz"
    with gzip.open(path, "wb", compresslevel=9) as fh:
        chunk = b" " * (1 << 20)
        for _ in range(1024):
            fh.write(chunk)
    assert path.stat().st_size < 2 << 20
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(SnapshotRefused, match="gzip bomb"):
        load_snapshot(path)
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 200


def test_limits_bound_events_and_objects():
    ev = {"action": "alloc", "addr": 8, "size": 1, "stream": 0, "frames": []}
    data = pickle.dumps({"segments": [], "device_traces": [[dict(ev, addr=i) for i in range(50)]]})
    with pytest.raises(SnapshotRefused, match="max_events"):
        read_pickle(io.BytesIO(data), limits=Limits(max_events=10))
    with pytest.raises(SnapshotRefused, match="max_objects"):
        read_pickle(io.BytesIO(pickle.dumps([[{}] * 3 for _ in range(100)])), limits=Limits(max_objects=50))
    with pytest.raises(ValueError, match="Limits.max_events"):
        Limits(max_events=0)


def _traced_peak(fn) -> int:
    import tracemalloc

    tracemalloc.start()
    result = fn()
    _now, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del result
    return peak


def test_memory_per_event_is_columnar(tmp_path, monkeypatch):
    """Each further event costs the reader tens of bytes (columns), unpickling ~500 (a dict and its list).

    The reader also holds one read window (16 MiB of file, parsed side by side); a smaller window
    here keeps that fixed cost out of the difference between the two sizes.
    """
    from benchmarks.bench_snapshot import write_torch_pickle
    from tbmem._internal.snapshot import pickle_input, pickle_stream

    monkeypatch.setattr(pickle_input, "_CHUNK", 1 << 20)
    monkeypatch.setattr(pickle_stream, "_MARGIN", 1 << 18)

    paths = {}
    for n in (50_000, 250_000):
        paths[n] = tmp_path / f"s{n}.pickle"
        with open(paths[n], "wb") as fh:
            write_torch_pickle(fh, n)

    def stream(path):
        with open(path, "rb") as fh:
            return read_pickle(fh)

    ours = [_traced_peak(lambda p=paths[n]: stream(p)) for n in (50_000, 250_000)]
    theirs = [_traced_peak(lambda p=paths[n]: load_plain(p)) for n in (50_000, 250_000)]
    per_event = (ours[1] - ours[0]) / 200_000
    unpickled = (theirs[1] - theirs[0]) / 200_000
    assert per_event < 150 and per_event < unpickled / 3, (per_event, unpickled)


def test_a_trace_is_one_range_of_rows_with_events_the_interpreter_built_inside_it():
    """An event whose action string appears for the first time mid-trace (the first segment_free, an
    oom) is built by the interpreter; its row comes where it is in the trace, so a trace stays one
    range of rows (the conversion then takes its columns as views instead of copying them)."""
    ev = {"action": "alloc", "addr": 512, "size": 512, "stream": 0, "time_us": 1, "frames": []}
    trace = [dict(ev, addr=512 * i) for i in range(3000)]
    trace[1500] = {"action": "segment_free", "addr": 0, "size": 2 << 20, "stream": 0, "time_us": 1, "frames": []}
    data = pickle.dumps({"segments": [], "device_traces": [trace, [dict(e) for e in trace[:2000]]]}, protocol=4)
    top, rows = read_pickle(io.BytesIO(data))
    for i, want in enumerate((trace, trace[:2000])):
        idx = rows.rows_of(top["device_traces"][i])
        assert idx.tolist() == list(range(int(idx[0]), int(idx[0]) + len(want)))
        assert [ACTIONS[a] for a in rows.column("action")[idx]] == [e["action"] for e in want]
        assert rows.column("addr")[idx].tolist() == [e["addr"] for e in want]


def test_an_integer_in_a_trace_is_not_taken_for_rows():
    """A hostile trace holding a bare integer among its events is refused, not read as that many rows."""
    ev = {"action": "alloc", "addr": 512, "size": 512, "stream": 0, "time_us": 1, "frames": []}
    trace = [dict(ev, addr=512 * i) for i in range(50)]
    trace.insert(30, 7)
    data = pickle.dumps({"segments": [], "device_traces": [trace]}, protocol=4)
    with pytest.raises(SnapshotRefused, match="holds a int"):
        load_snapshot_bytes(data)


def load_snapshot_bytes(data: bytes):
    from tbmem._internal.snapshot.readers import read_snapshot

    return read_snapshot(io.BytesIO(data), "t.pickle")
