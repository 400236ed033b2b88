"""The synthetic torch snapshot pickle of ``benchmarks/bench_snapshot.py``, written opcode by opcode.

A 10M-entry dict would take 6 GB to build in Python, so :func:`write_torch_pickle` streams
protocol-4 opcodes, byte for byte what CPython's pickler writes for the same objects
(tests/snapshot/test_synthetic.py checks that): a training loop (:func:`simulate`) of forward,
backward and optimizer phases with realistic stacks, addresses from a model of the caching
allocator (segments reserved and released in the trace, and the final ``segments`` the state
that trace leaves), memory allocated before the trace and a final ``oom``.
"""

from __future__ import annotations

import struct

from benchmarks._snapshot_program import simulate

__all__ = ["PickleWriter", "write_container", "write_torch_pickle", "simulate"]

PROTO, FRAME, STOP = b"\x80", b"\x95", b"."
MARK, EMPTY_DICT, EMPTY_LIST, MEMOIZE = b"(", b"}", b"]", b"\x94"
SETITEMS, SETITEM, APPENDS, APPEND = b"u", b"s", b"e", b"a"
BINGET, LONG_BINGET = b"h", b"j"
NEWTRUE, NEWFALSE, NONE = b"\x88", b"\x89", b"N"
TUPLE2 = b"\x86"
_FRAME_TARGET = 64 * 1024


class PickleWriter:
    """Writes protocol-4 pickle opcodes exactly as CPython's pickler would for the same object graph.

    Sharing is explicit: objects passed with the same ``key`` are one object (written once, then
    referenced from the memo), as the pickler does for one object reached twice.
    """

    def __init__(self, fh) -> None:
        self.fh = fh
        self.memo: dict = {}
        self.frame = bytearray()
        self.fh.write(PROTO + b"\x04")

    # framing: a frame ends after a complete object once it holds 64 KiB (CPython's rule)
    def boundary(self) -> None:
        if len(self.frame) >= _FRAME_TARGET:
            self.commit()

    def commit(self) -> None:
        if self.frame:
            self.fh.write(FRAME + struct.pack("<Q", len(self.frame)) + self.frame)
            self.frame = bytearray()

    def finish(self) -> None:
        self.frame += STOP
        self.commit()

    def _get(self, idx: int) -> None:
        self.frame += BINGET + bytes((idx,)) if idx < 256 else LONG_BINGET + struct.pack("<I", idx)

    def _memoize(self, key) -> None:
        self.frame += MEMOIZE
        self.memo[key if key is not None else object()] = len(self.memo)

    # CPython's save() checks for a frame boundary before writing any object, memo references included
    def ref(self, key) -> bool:
        """Write a memo reference if ``key`` was written before."""
        idx = self.memo.get(key)
        if idx is None:
            return False
        self.boundary()
        self._get(idx)
        return True

    def str(self, s: str, key=None) -> None:
        if key is None and len(s) <= 1 and s <= "\xff":
            key = ("s", s)  # CPython has one object per empty or one-character latin-1 string
        if key is not None and self.ref(key):
            return
        self.boundary()
        data = s.encode("utf-8", "surrogatepass")
        if len(data) < 256:
            self.frame += b"\x8c" + bytes((len(data),)) + data
        else:
            self.frame += b"X" + struct.pack("<I", len(data)) + data
        self._memoize(key)

    def int(self, v: int) -> None:
        self.boundary()
        if 0 <= v < 256:
            self.frame += b"K" + bytes((v,))
        elif 0 <= v < 65536:
            self.frame += b"M" + struct.pack("<H", v)
        elif -(2 ** 31) <= v < 2 ** 31:
            self.frame += b"J" + struct.pack("<i", v)
        else:
            n = (v.bit_length() >> 3) + 1
            data = v.to_bytes(n, "little", signed=True)
            if v < 0 and n > 1 and data[-1] == 0xFF and (data[-2] & 0x80):
                data = data[:-1]
            self.frame += b"\x8a" + bytes((len(data),)) + data

    def bool(self, v: bool) -> None:
        self.boundary()
        self.frame += NEWTRUE if v else NEWFALSE

    def tuple2(self, a: int, b: int, key=None) -> None:
        if key is not None and self.ref(key):
            return
        self.boundary()
        self.int(a)
        self.int(b)
        self.frame += TUPLE2
        self._memoize(key)

    def begin_dict(self, key=None) -> None:
        self.boundary()
        self.frame += EMPTY_DICT
        self._memoize(key)

    def begin_list(self, key=None) -> None:
        self.boundary()
        self.frame += EMPTY_LIST
        self._memoize(key)

    def raw(self, b: bytes) -> None:
        self.frame += b

    def end(self) -> None:
        pass


def write_container(w: PickleWriter, items: list, write_item, setitems: bool) -> None:
    """Items as CPython's C pickler batches them: one item: item APPEND; more: MARK <=1000 items APPENDS..."""
    if not items:
        return
    if len(items) == 1:
        write_item(items[0])
        w.raw(SETITEM if setitems else APPEND)
        return
    for i in range(0, len(items), 1000):
        w.raw(MARK)
        for it in items[i:i + 1000]:
            write_item(it)
        w.raw(SETITEMS if setitems else APPENDS)


#: The pools of ``write_torch_pickle(pool_id=...)``'s events (their integers pickled in each width).
POOL_IDS = ((0, 0), (0, 300), (70_000, 1), (2**40, 2))
_ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "oom")


def _pass1(n, seed, cpp, empty_cache_every):
    it = simulate(n, seed=seed, cpp=cpp, empty_cache_every=empty_cache_every)
    _, baseline, pool = next(it)
    end = None
    for ev in it:
        if ev[0] == "end":
            end = ev
    return baseline, pool, end[3], end[2]


def write_torch_pickle(fh, n_entries: int, *, devices: int = 1, other_entries: int = 2000, seed: int = 0,
                       cpp: bool = False, time_us: bool = True, compile_context: bool = True,
                       oom: bool = True, empty_cache_every: int = 200_000, pool_id: str | None = None) -> dict:
    """Stream a torch-format snapshot pickle of about ``n_entries`` trace entries on cuda:0
    (``other_entries`` on each further device). Returns facts about what was written.

    ``pool_id`` (torch >= 2.11 writes one on every event): ``"inline"`` a new tuple per event,
    ``"shared"`` one tuple object per pool (memo references after the first); each event's pool is
    :data:`POOL_IDS` picked by its address, one byte, two bytes, four and eight bytes wide."""
    w = PickleWriter(fh)
    sizes = [n_entries] + [other_entries] * (devices - 1)
    plans = [_pass1(n, seed + d, cpp, empty_cache_every) for d, n in enumerate(sizes)]
    facts = {"entries": [0] * devices}

    def key(name):
        w.str(name, key=("k", name))

    def frame(pool, fid):
        if w.ref(("f", id(pool), fid)):
            return
        name, filename, line = pool.frames[fid]
        w.begin_dict(("f", id(pool), fid))
        w.raw(MARK)
        key("name"); w.str(name)
        key("filename"); w.str(filename)
        key("line"); w.int(line)
        w.raw(SETITEMS)
        w.end()

    def frames(pool, d, ctx):
        if ctx[0] < 0:
            w.begin_list(None)
            w.end()
            return
        k = ("c", d, ctx[0])
        if w.ref(k):
            return
        w.begin_list(k)
        write_container(w, list(pool.stacks[ctx[1]]), lambda fid: frame(pool, fid), False)
        w.end()

    w.begin_dict(None)
    w.raw(MARK)
    key("segments")
    w.begin_list(None)
    segs = []
    for d, (_baseline, pool, final, _t) in enumerate(plans):
        segs += [(d, seg, pool) for seg in final]

    def segment(item):
        d, (addr, total, kind, ctx, blocks), pool = item
        used = [b for b in blocks if b[2]]
        allocated = sum(b[1] for b in used)
        w.begin_dict(None)
        w.raw(MARK)
        for k, v in (("device", d), ("address", addr), ("total_size", total), ("allocated_size", allocated),
                     ("active_size", allocated), ("requested_size", sum(b[2] for b in used)), ("stream", 0)):
            key(k); w.int(v)
        key("segment_type"); w.str(kind, key=("s", kind))
        key("segment_pool_id"); w.tuple2(0, 0)
        key("is_expandable"); w.bool(False)
        key("frames"); frames(pool, d, ctx)
        key("blocks")
        w.begin_list(None)

        def block(b):
            baddr, bsize, req, bctx = b
            state = "active_allocated" if req else "inactive"
            w.begin_dict(None)
            w.raw(MARK)
            key("address"); w.int(baddr)
            key("size"); w.int(bsize)
            key("requested_size"); w.int(req)
            key("state"); w.str(state, key=("s", state))
            key("frames"); frames(pool, d, bctx if req else (-1, -1))
            w.raw(SETITEMS)
            w.end()
        write_container(w, blocks, block, False)
        w.end()
        w.raw(SETITEMS)
        w.end()
    write_container(w, segs, segment, False)
    w.end()
    key("device_traces")
    w.begin_list(None)
    traces = []
    for d, n in enumerate(sizes):
        traces.append((d, n))

    def trace(item):
        d, n = item
        pool = plans[d][1]
        w.begin_list(None)
        it = simulate(n, seed=seed + d, cpp=cpp, empty_cache_every=empty_cache_every)
        next(it)
        events = []
        last_t = [0]

        def gen():
            for ev in it:
                if ev[0] == "end":
                    last_t[0] = ev[2]
                    break
                yield ev
            if oom and d == 0:
                yield ("oom", 3 << 20, 80 << 30, last_t[0] + 5, (10 ** 12, pool.by_kind["forward"][0]))

        def event(ev):
            action, addr, size, t, ctx = ev
            facts["entries"][d] += 1
            w.begin_dict(None)
            w.raw(MARK)
            key("action"); w.str(action, key=("s", action))
            key("device_free" if action == "oom" else "addr"); w.int(addr)
            key("size"); w.int(size)
            key("stream"); w.int(0)
            _pool_id(w, key, addr, pool_id)
            if time_us:
                key("time_us"); w.int(t)
            if compile_context:
                key("compile_context"); w.str("N/A")
            key("frames"); frames(pool, d, ctx)
            w.raw(SETITEMS)
            w.end()
        _write_stream(w, gen(), event)
        w.end()
    write_container(w, traces, trace, False)
    w.end()
    key("allocator_settings")
    w.begin_dict(None)
    w.raw(MARK)
    key("PYTORCH_CUDA_ALLOC_CONF"); w.str("")
    key("max_split_size"); w.int(-1)
    key("expandable_segments"); w.bool(False)
    w.raw(SETITEMS)
    w.end()
    key("external_annotations")
    w.begin_list(None)
    w.end()
    w.raw(SETITEMS)
    w.end()
    w.finish()
    return facts


def _pool_id(w: PickleWriter, key, addr: int, style: str | None) -> None:
    """An event's ``pool_id`` (see :func:`write_torch_pickle`), nothing when ``style`` is None."""
    if style is not None:
        pa, pb = POOL_IDS[(addr >> 21) % len(POOL_IDS)]
        key("pool_id")
        w.tuple2(pa, pb, key=("p", pa, pb) if style == "shared" else None)


def _write_stream(w, items, write_item):
    """write_container for an iterator of unknown length (C pickler batching, one item -> APPEND)."""
    first = next(items, None)
    if first is None:
        return
    second = next(items, None)
    if second is None:
        write_item(first)
        w.raw(APPEND)
        return
    pending = [first, second]
    done = False
    while not done:
        w.raw(MARK)
        count = 0
        for it in pending:
            write_item(it)
            count += 1
        pending = []
        for it in items:
            write_item(it)
            count += 1
            if count == 1000:
                break
        else:
            done = True
        w.raw(APPENDS)
        if not done:
            nxt = next(items, None)
            if nxt is None:
                done = True
            else:
                pending = [nxt]
