"""The pickle reader's runs in C (tbmem/_internal/snapshot/_creader.h, _pickle_run.c) give exactly what the interpreter
gives reading every event itself: the same rows, frames, stacks and strings, or the same refusal (real,
synthetic and damaged pickles); and the fallback of a tbmem without the extension (the restricted Unpickler,
tbmem._internal.snapshot.readers) reads the same snapshots."""

from __future__ import annotations

import io
import pickle
import random

import pytest

from tbmem._internal.snapshot import pickle_crun, pickle_stream, readers
from tbmem._internal.snapshot.pickle_crun import Layout
from tbmem._internal.snapshot.pickle_rows import SnapshotRefused
from tbmem._internal.snapshot.safe_pickle import UnsafePickleError
from tests._extensions import not_built
from tests._shared import REAL, REAL2, real_pickles


def _require_c() -> None:
    if not pickle_crun.C_READER:
        not_built("tbmem/_internal/snapshot/_creader.c was not built: the install found no C compiler")


def _read(data: bytes, *, c: bool):
    """(top, rows) or the exception, with the C runs or with the interpreter alone."""
    try:
        return pickle_stream.read_pickle(io.BytesIO(data), c_reader=c)
    except (SnapshotRefused, UnsafePickleError) as exc:
        return type(exc), str(exc)


def _traces(top) -> list:
    traces = top.get("device_traces") if isinstance(top, dict) else None
    return traces if isinstance(traces, list) else []


def _same_rows(a, b) -> None:
    """The same events in every trace, in trace order: action, address, size, time, stream, pool, and the stack
    and metadata each names (the interpreter numbers rows, stacks and strings in another order than the
    C runs, which take the trace's first events as rows when their run starts)."""
    if isinstance(a[0], type) or isinstance(b[0], type):  # both refused, for the same reason
        assert a == b
        return
    (top_a, rows_a), (top_b, rows_b) = a, b
    assert len(_traces(top_a)) == len(_traces(top_b))

    def events(rows, trace):
        order = rows.rows_of(trace)
        stacks = [tuple(rows.frames[f] for f in st) for st in rows.stacks]
        cols = [rows.column(c)[order].tolist() for c in ("action", "addr", "size", "time", "stack", "meta")]
        return (cols[:4], [stacks[s] if s >= 0 else None for s in cols[4]],
                [rows.strings[m] if m >= 0 else None for m in cols[5]], [rows.streams.get(r, 0) for r in order.tolist()],
                [rows.pool_ids[rows.pools[r]] if r in rows.pools else None for r in order.tolist()])
    for ta, tb in zip(_traces(top_a), _traces(top_b)):
        assert events(rows_a, ta) == events(rows_b, tb)
    assert rows_a.count == rows_b.count and rows_a.extra_keys == rows_b.extra_keys


def _synthetic(**kw) -> bytes:
    from benchmarks.bench_snapshot import write_torch_pickle

    buf = io.BytesIO()
    write_torch_pickle(buf, **kw)
    return buf.getvalue()


def test_the_c_reader_is_built_and_used() -> None:
    _require_c()  # without it, a 10M-event pickle takes about 7 s more to read
    machine = pickle_stream._Machine(io.BytesIO(b""), pickle_stream.Limits(), None)
    assert machine.crun is not None


def _events_by_c(data: bytes) -> int:
    """Events the C runs read (the rest, the interpreter)."""
    counted = [0]
    run = pickle_crun.CRunner.run

    def counting(self, *args):
        got = run(self, *args)
        counted[0] += got[0]
        return got

    pickle_crun.CRunner.run = counting
    try:
        pickle_stream.read_pickle(io.BytesIO(data))
    finally:
        pickle_crun.CRunner.run = run
    return counted[0]


def test_real_snapshots_read_the_same() -> None:
    """The real snapshots of ../shared/snapshots/real and real2 under 2 MB (the interpreter alone reads
    about 20k events a second; the fallback's test below reads every one)."""
    _require_c()
    paths = [p for p in real_pickles(REAL) + real_pickles(REAL2) if p.stat().st_size < 2_100_000]
    assert len(paths) >= 6
    by_c = 0
    for path in paths:
        data = path.read_bytes()
        _same_rows(_read(data, c=True), _read(data, c=False))
        by_c += _events_by_c(data)
    assert by_c > 20_000


@pytest.mark.parametrize("kw", [dict(n_entries=6000), dict(n_entries=3000, devices=3, other_entries=500, cpp=True),
                                dict(n_entries=2000, time_us=False, compile_context=False, oom=False)])
def test_synthetic_snapshots_read_the_same(kw) -> None:
    _require_c()
    data = _synthetic(**kw)
    assert _events_by_c(data) >= kw["n_entries"] // 2  # the C runs read most events
    _same_rows(_read(data, c=True), _read(data, c=False))


def _layouts_of(data: bytes) -> list[Layout]:
    """The event layouts the reader learns from a pickle."""
    machine = pickle_stream._Machine(io.BytesIO(data), pickle_stream.Limits(), None, c_reader=False)
    try:
        machine.run()
    finally:
        machine.close()
    return machine.layouts


def test_damaged_pickles_read_the_same() -> None:
    """Bytes flipped, cut and spliced where events are: reading the damaged pickle gives the same rows, or
    both readers refuse it (each names the first fault it meets: a run in C sees the events it read as rows,
    so a later reference to one is refused there, where the interpreter may only meet a later fault)."""
    _require_c()
    data = _synthetic(n_entries=600, devices=2, other_entries=100, cpp=True)
    rng = random.Random(23)
    events = [i for i in range(len(data) - 3) if data[i:i + 3] == b"}\x94("]
    interesting = b"}\x94(hjKMJ\x8a\x8c\x94]eau(\x95N\x88\x89\x00\xff"
    outcomes = {"same rows": 0, "both refused": 0, "c refused": 0}
    for trial in range(60):
        buf = bytearray(data)
        at = rng.choice(events)
        for _ in range(rng.randint(1, 4)):
            p = at + rng.randint(0, 80)
            if p < len(buf):
                buf[p] = rng.choice(interesting) if rng.random() < 0.7 else rng.randrange(256)
        if trial % 5 == 0:
            buf = buf[:at + rng.randint(1, 120)]  # cut inside an event
        raw = bytes(buf)
        by_c, alone = _read(raw, c=True), _read(raw, c=False)
        if not isinstance(by_c[0], type) and not isinstance(alone[0], type):
            _same_rows(by_c, alone)
            outcomes["same rows"] += 1
        elif isinstance(alone[0], type):
            assert isinstance(by_c[0], type), f"trial {trial}: the interpreter refused ({alone[1]}), the C runs read it"
            outcomes["both refused"] += 1
        else:
            assert by_c[1] == "the pickle refers twice to one trace event, which torch never writes", by_c
            outcomes["c refused"] += 1
    assert outcomes["same rows"] >= 10 and outcomes["both refused"] >= 10, outcomes


def test_edges_of_integers_and_frame_lists() -> None:
    """Integers of every encoding (LONG1 up to 8 bytes, negative ones) and frame lists up to the C runs'
    longest (512 references) and past it: the same rows."""
    _require_c()
    frames = [{"filename": f"f{i}.py", "line": i, "name": "g"} for i in range(600)]
    first = {"action": "alloc", "addr": 0, "size": 0, "stream": 0, "time_us": 0, "frames": frames}
    events = [{"action": "alloc", "addr": a, "size": s, "stream": 0, "time_us": t, "frames": list(frames[:k])}
              for _ in range(3)
              for a, s, t, k in ((1, 2, 3, 1), (255, 256, 65535, 2), (65536, -1, -(2**31), 511),
                                 (2**31, 2**55, 2**56 - 1, 512), (2**62, -(2**60), 2**63 - 1, 513),
                                 (-(2**63), 0, 2**40, 0), (7, 8, 9, 514))]
    data = pickle.dumps({"segments": [], "device_traces": [[first, first.copy(), *events]]}, protocol=4)
    assert _events_by_c(data) >= 10  # most events read by the C runs, the long lists not
    _same_rows(_read(data, c=True), _read(data, c=False))


def test_hostile_layouts_and_bounds() -> None:
    """Layouts no reader learns (long references, one key, many keys) and every cut of a buffer: no run;
    bounds outside the buffer or the memo are refused, not read."""
    _require_c()
    ev = pickle.dumps([{"action": "alloc", "addr": 2**40, "size": -5, "frames": ["x"] * 3, "user_metadata": "m"}] * 3,
                      protocol=4)
    buf = ev * 3 + b"}\x94(" + b"\xff" * 40
    odd = [Layout(["size", "frames"], [b"h\x00", b"j\x01\x00\x00\x00"]), Layout(["frames"], [b""]),
           Layout(["user_metadata"] * 2 + ["x", "action", "device_free"], [b"h\x05", b"h\x06", b"", b"h\x01", b"h\x02"])]
    from tbmem._internal.snapshot import _creader

    # the reader's runs: layouts without the keys every event has are read by the interpreter, not here;
    # bounds outside the buffer or the memo are refused
    from tbmem._internal.snapshot.pickle_crun import State
    from tbmem._internal.snapshot.pickle_rows import EventRows, Limits, Memo

    memo, rows = Memo(), EventRows(Limits())
    memo.extend(["alloc"] * 300)
    runner = pickle_crun.CRunner(memo, rows, State())
    for cut in range(0, len(buf) + 1, 7):
        assert runner.run(buf[:cut], 0, odd)[0] == 0
    outs, cbs = (*runner._cols, runner._entries), (int,) * 9
    with pytest.raises(ValueError, match="memo base"):
        _creader.run(runner._runner, cbs, buf, 0, len(buf), runner._spec, memo._slots, 10**6, outs)
    with pytest.raises(ValueError):
        _creader.run(runner._runner, cbs, buf, 0, len(buf) + 1, runner._spec, memo._slots, 1, outs)
    with pytest.raises(ValueError, match="memo base"):
        _creader.run(runner._runner, cbs, buf, 0, len(buf), runner._spec, memo._slots, 1, outs[:3])
    with pytest.raises(ValueError):
        _creader.run(object(), cbs, buf, 0, len(buf), runner._spec, memo._slots, 1, outs)
    with pytest.raises(ValueError, match="9 callbacks"):
        _creader.run(runner._runner, cbs[:6], buf, 0, len(buf), runner._spec, memo._slots, 1, outs)


def test_the_reader_keeps_nothing_alive_after_it_returns() -> None:
    """The C reader's caches hold no Python object: a runner holding its callbacks (bound methods of the
    object that holds the runner) made a cycle the collector cannot see through a capsule, and every
    read kept its rows and memo alive (0.45 GiB at 10M events)."""
    _require_c()
    import gc
    import weakref

    data = _synthetic(n_entries=3000)
    top, rows = pickle_stream.read_pickle(io.BytesIO(data))
    assert rows.count > 2000
    gone = weakref.ref(rows)
    del top, rows
    gc.collect()
    assert gone() is None


def _fallback(data: bytes, monkeypatch) -> object:
    """The snapshot read as a tbmem without the C extension reads it (the restricted Unpickler)."""
    with monkeypatch.context() as m:
        m.setattr(readers, "C_READER", False)
        m.setattr(pickle_stream, "read_pickle", None)  # the streaming reader is not used at all
        return readers.read_snapshot(io.BytesIO(data), "s.pickle")


def _same_snapshot(a, b) -> None:
    """The same document, stacks compared by the frames they name (the two readers number them apart)."""
    from tbmem._internal.snapshot.schema import to_json

    def doc(snap):
        out = to_json(snap)
        named = [tuple(snap.stack_frames(s)) for s in range(len(snap.stacks))] + [None]  # [-1]: none
        for key in ("strings", "frames", "stacks"):
            del out[key]
        for dev, raw in zip(out["devices"], snap.devices):
            dev["allocs"]["stack"] = [named[s] for s in raw.allocs["stack"].tolist()]
            if raw.segs is not None:
                dev["segs"]["stack"] = [named[s] for s in raw.segs["stack"].tolist()]
        return out
    assert doc(a) == doc(b)


def test_without_the_extension_the_unpickler_reads_the_same_snapshots(monkeypatch) -> None:
    """The one fallback: every real snapshot, and synthetic ones, give the snapshot of the C path (columns,
    frames, stacks, strings, segments, markers)."""
    _require_c()
    datas = [p.read_bytes() for p in real_pickles(REAL) + real_pickles(REAL2)]
    datas += [_synthetic(n_entries=8000, devices=3, other_entries=700, cpp=True),
              _synthetic(n_entries=3000, time_us=False, compile_context=False, oom=False)]
    for data in datas:
        _same_snapshot(_fallback(data, monkeypatch), readers.read_snapshot(io.BytesIO(data), "s.pickle"))


def test_without_the_extension_hostile_pickles_are_refused(monkeypatch) -> None:
    """The fallback refuses what the C path refuses: a pickle naming a Python object (before anything it
    names is imported), a truncated one, plain data that is no snapshot; progress is still reported."""
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    with pytest.raises(UnsafePickleError, match="builtins.print"):
        _fallback(pickle.dumps({"segments": [], "device_traces": [[Evil()]]}), monkeypatch)
    data = _synthetic(n_entries=2000)
    with pytest.raises(SnapshotRefused, match="truncated|not a valid"):
        _fallback(data[:len(data) // 2], monkeypatch)
    with pytest.raises(SnapshotRefused, match="not a snapshot"):
        _fallback(pickle.dumps({"x": 1}), monkeypatch)
    seen: list[int] = []
    with monkeypatch.context() as m:
        m.setattr(readers, "C_READER", False)
        readers.read_snapshot(io.BytesIO(data), "s.pickle", progress=seen.append)
    assert seen and seen[-1] == len(data)
