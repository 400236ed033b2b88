"""The pickle reader in C (tbmem/snapshot/_creader.h, _pickle_scan.c, _pickle_run.c) gives exactly what
its numpy twin gives: its parser the same arrays as pickle_fast.scan for every buffer the reader scans (real,
synthetic and damaged pickles), and the reader the same rows, frames, stacks and strings, or the same refusal."""

from __future__ import annotations

import io
import pickle
import random

import numpy as np
import pytest

from tbmem.snapshot import pickle_crun, pickle_stream
from tbmem.snapshot.pickle_fast import Layout, scan, scan_c
from tbmem.snapshot.pickle_rows import SnapshotRefused
from tbmem.snapshot.safe_pickle import UnsafePickleError
from tests._extensions import not_built
from tests._shared import REAL, REAL2, real_pickles

_FIELDS = ("start", "end", "ok", "chain", "layout", "addr", "size", "time", "stream", "has_time", "action_ref",
           "list_ref", "span_pos", "span_len", "span_hash", "inline", "inline_before_frames", "meta_ref", "batch_end")


def _require_c() -> None:
    if not pickle_crun.C_READER:
        not_built("tbmem/snapshot/_creader.c was not built: the install found no C compiler")


def _same_scan(a, b) -> None:
    for name in _FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and x.shape == y.shape, name
        bad = np.flatnonzero((x != y).reshape(x.shape[0], -1).any(axis=1)) if x.shape[0] else []
        assert len(bad) == 0, f"{name} differs at candidates {list(bad[:5])}"
    assert a.str_pos.keys() == b.str_pos.keys()
    for key in a.str_pos:
        assert np.array_equal(a.str_pos[key], b.str_pos[key]) and np.array_equal(a.str_len[key], b.str_len[key]), key


class _Compare:
    """Stands in for pickle_stream.scan (numpy's reader): scans with both parsers, checks they agree."""

    def __init__(self) -> None:
        self.calls = 0
        self.candidates = 0

    def __call__(self, buf, lo, layouts, hi=None):
        got, want = scan_c(buf, lo, layouts, hi), scan(buf, lo, layouts, hi)
        _same_scan(got, want)
        self.calls += 1
        self.candidates += int(got.ok.sum())
        return want


def _read(data: bytes, *, c: bool):
    """(top, rows) or the exception, with the C reader or with numpy's."""
    try:
        return pickle_stream.read_pickle(io.BytesIO(data), c_reader=c)
    except (SnapshotRefused, UnsafePickleError) as exc:
        return type(exc), str(exc)


def _traces(top) -> list:
    traces = top.get("device_traces") if isinstance(top, dict) else None
    return traces if isinstance(traces, list) else []


def _same_rows(a, b, *, exact: bool = True) -> None:
    """The same rows; ``exact``: also the same frame, stack and string tables (ids in the same order),
    else each row's stack and metadata compared by what they name."""
    if isinstance(a[0], type) or isinstance(b[0], type):  # both refused, for the same reason
        assert a == b
        return
    (top_a, rows_a), (top_b, rows_b) = a, b
    assert len(_traces(top_a)) == len(_traces(top_b))
    for ta, tb in zip(_traces(top_a), _traces(top_b)):
        assert np.array_equal(rows_a.rows_of(ta), rows_b.rows_of(tb))
    for col in ("action", "addr", "size", "time"):
        assert np.array_equal(rows_a.column(col), rows_b.column(col)), col
    assert rows_a.streams == rows_b.streams and rows_a.extra_keys == rows_b.extra_keys
    if exact:
        assert np.array_equal(rows_a.column("stack"), rows_b.column("stack"))
        assert np.array_equal(rows_a.column("meta"), rows_b.column("meta"))
        assert rows_a.frames == rows_b.frames and rows_a.stacks == rows_b.stacks and rows_a.strings == rows_b.strings
        return

    def named(rows):
        stacks = [tuple(rows.frames[f] for f in st) for st in rows.stacks]
        return ([stacks[s] if s >= 0 else None for s in rows.column("stack").tolist()],
                [rows.strings[m] if m >= 0 else None for m in rows.column("meta").tolist()])
    assert named(rows_a) == named(rows_b)


def _synthetic(**kw) -> bytes:
    from benchmarks.bench_snapshot import write_torch_pickle

    buf = io.BytesIO()
    write_torch_pickle(buf, **kw)
    return buf.getvalue()


def test_the_c_reader_is_built_and_used() -> None:
    _require_c()  # without it, a 10M-event pickle takes about 7 s more to read
    machine = pickle_stream._Machine(io.BytesIO(b""), pickle_stream.Limits(), None)
    assert machine.crun is not None


def test_real_snapshots_scan_and_read_the_same(monkeypatch) -> None:
    """Every real snapshot of ../shared/snapshots/real and real2."""
    _require_c()
    paths = real_pickles(REAL) + real_pickles(REAL2)
    assert len(paths) >= 11
    compare = _Compare()
    monkeypatch.setattr(pickle_stream, "scan", compare)
    for path in paths:
        data = path.read_bytes()
        _same_rows(_read(data, c=True), _read(data, c=False))
    assert compare.candidates > 50_000


@pytest.mark.parametrize("kw", [dict(n_entries=30_000), dict(n_entries=8000, devices=3, other_entries=700, cpp=True),
                                dict(n_entries=5000, time_us=False, compile_context=False, oom=False)])
def test_synthetic_snapshots_scan_and_read_the_same(kw, monkeypatch) -> None:
    _require_c()
    data = _synthetic(**kw)
    compare = _Compare()
    monkeypatch.setattr(pickle_stream, "scan", compare)
    want = _read(data, c=False)
    assert compare.candidates >= kw["n_entries"] // 2  # the fast path ran, on most events
    _same_rows(_read(data, c=True), want)


def _layouts_of(data: bytes) -> list[Layout]:
    """The event layouts the reader learns from a pickle."""
    seen: list[list[Layout]] = []

    def grab(buf, lo, layouts, hi=None):
        seen.append(list(layouts))
        return scan(buf, lo, layouts, hi)

    saved = pickle_stream.scan
    pickle_stream.scan = grab
    try:
        pickle_stream.read_pickle(io.BytesIO(data), c_reader=False)
    finally:
        pickle_stream.scan = saved
    return seen[-1]


def test_damaged_buffers_scan_the_same() -> None:
    """Bytes flipped, cut and spliced where events are: the two scans still agree on every candidate,
    and reading the damaged pickle gives the same rows or the same refusal."""
    _require_c()
    data = _synthetic(n_entries=3000, devices=2, other_entries=300, cpp=True)
    layouts = _layouts_of(data)
    rng = random.Random(23)
    events = [i for i in range(len(data) - 3) if data[i:i + 3] == b"}\x94("]
    interesting = b"}\x94(hjKMJ\x8a\x8c\x94]eau(\x95N\x88\x89\x00\xff"
    for trial in range(400):
        buf = bytearray(data)
        at = rng.choice(events)
        for _ in range(rng.randint(1, 4)):
            p = at + rng.randint(0, 80)
            if p < len(buf):
                buf[p] = rng.choice(interesting) if rng.random() < 0.7 else rng.randrange(256)
        if trial % 5 == 0:
            buf = buf[:at + rng.randint(1, 120)]  # cut inside an event
        raw = bytes(buf)
        lo = max(0, at - 200)
        for hi in (len(raw), min(len(raw), at + rng.randint(0, 60))):
            _same_scan(scan_c(raw, lo, layouts, hi), scan(raw, lo, layouts, hi))
        if trial % 4 == 0:
            _same_rows(_read(raw, c=True), _read(raw, c=False), exact=False)


def test_edges_of_integers_and_frame_lists() -> None:
    """Integers of every encoding (LONG1 up to 8 bytes, negative ones) and frame lists at the scan's
    longest (MAX_FRAMES references) and one past it: same arrays, same rows."""
    _require_c()
    frames = [{"filename": f"f{i}.py", "line": i, "name": "g"} for i in range(600)]
    first = {"action": "alloc", "addr": 0, "size": 0, "stream": 0, "time_us": 0, "frames": frames}
    events = [{"action": "alloc", "addr": a, "size": s, "stream": 0, "time_us": t, "frames": list(frames[:k])}
              for _ in range(3)
              for a, s, t, k in ((1, 2, 3, 1), (255, 256, 65535, 2), (65536, -1, -(2**31), 511),
                                 (2**31, 2**55, 2**56 - 1, 512), (2**62, -(2**60), 2**63 - 1, 513),
                                 (-(2**63), 0, 2**40, 0), (7, 8, 9, 514))]
    data = pickle.dumps({"segments": [], "device_traces": [[first, first.copy(), *events]]}, protocol=4)
    layouts = _layouts_of(data)
    _same_scan(scan_c(data, 0, layouts), scan(data, 0, layouts))
    assert scan(data, 0, layouts).ok.sum() >= 10  # most events parsed by the scan, the long lists not
    _same_rows(_read(data, c=True), _read(data, c=False))


def test_hostile_layouts_and_bounds() -> None:
    """Layouts no reader learns (long references, one key, many keys) and every cut of a buffer: same
    arrays; bounds outside the buffer are refused, not read."""
    _require_c()
    ev = pickle.dumps([{"action": "alloc", "addr": 2**40, "size": -5, "frames": ["x"] * 3, "user_metadata": "m"}] * 3,
                      protocol=4)
    buf = ev * 3 + b"}\x94(" + b"\xff" * 40
    odd = [Layout(["size", "frames"], [b"h\x00", b"j\x01\x00\x00\x00"]), Layout(["frames"], [b""]),
           Layout(["user_metadata"] * 2 + ["x", "action", "device_free"], [b"h\x05", b"h\x06", b"", b"h\x01", b"h\x02"])]
    for cut in range(0, len(buf) + 1, 3):
        for lo in (0, 5, cut):
            _same_scan(scan_c(buf, lo, odd, cut), scan(buf, lo, odd, cut))
    from tbmem.snapshot import _creader as _pickle_scan

    with pytest.raises(ValueError):
        _pickle_scan.count(buf, 0, len(buf) + 1)
    with pytest.raises(ValueError):
        _pickle_scan.scan(buf, -1, 4, b"\x00", (), (), ())
    with pytest.raises(ValueError, match="layout spec"):
        _pickle_scan.scan(buf, 0, 4, b"\x01\x01\x09", (), (), ())
    with pytest.raises(ValueError, match="output arrays"):
        _pickle_scan.scan(buf, 0, len(buf), b"\x00", (), (), ())
    # the reader's runs: layouts without the keys every event has are read by the interpreter, not here;
    # bounds outside the buffer or the memo are refused
    from tbmem.snapshot.pickle_commit import State
    from tbmem.snapshot.pickle_rows import EventRows, Limits, Memo

    memo, rows = Memo(), EventRows(Limits())
    memo.extend(["alloc"] * 300)
    runner = pickle_crun.CRunner(memo, rows, State())
    for cut in range(0, len(buf) + 1, 7):
        assert runner.run(buf[:cut], 0, odd)[0] == 0
    outs, cbs = (*runner._cols, runner._entries), (int,) * 7
    with pytest.raises(ValueError, match="memo base"):
        _pickle_scan.run(runner._runner, cbs, buf, 0, len(buf), runner._spec, memo._slots, 10**6, outs)
    with pytest.raises(ValueError):
        _pickle_scan.run(runner._runner, cbs, buf, 0, len(buf) + 1, runner._spec, memo._slots, 1, outs)
    with pytest.raises(ValueError, match="memo base"):
        _pickle_scan.run(runner._runner, cbs, buf, 0, len(buf), runner._spec, memo._slots, 1, outs[:3])
    with pytest.raises(ValueError):
        _pickle_scan.run(object(), cbs, buf, 0, len(buf), runner._spec, memo._slots, 1, outs)
    with pytest.raises(ValueError, match="7 callbacks"):
        _pickle_scan.run(runner._runner, cbs[:6], buf, 0, len(buf), runner._spec, memo._slots, 1, outs)


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
