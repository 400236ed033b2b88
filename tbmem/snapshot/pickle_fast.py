"""The vectorised part of the snapshot pickle reader: many trace events parsed at once with numpy.

A torch trace event is a small dict pickled as ``EMPTY_DICT MEMOIZE MARK (key value)* SETITEMS``
whose keys, after the first event, are references to memoised strings: the same bytes in every
event of one layout. :func:`scan` finds every place in a buffer where an event of a learned
:class:`Layout` may start, parses all of them side by side (one numpy operation per field, not
per event), and records where each ends; :meth:`Scan.take` then hands the interpreter a run of
consecutive events starting where it stands, already decoded. An event the vectorised parser
cannot fully account for (an inline string where a reference is expected, a value it does not
decode, a FRAME header inside it) is simply not part of a run: the general interpreter in
:mod:`tbmem.snapshot.pickle_stream` reads it instead, so results never depend on this module.
:func:`scan` and :func:`~tbmem.snapshot.pickle_commit.commit` are the reader's Python path; where the
install compiled ``tbmem/snapshot/_creader.h``'s parts, the reader runs the same parser in C
(:mod:`tbmem.snapshot.pickle_crun`), and :func:`scan_c` exposes it candidate by candidate so that
tests check it gives the arrays :func:`scan` gives.

Example:
    >>> import struct
    >>> layout = Layout(["size", "frames"], [b"h\\x00", b"h\\x01"])
    >>> buf = b"}\\x94(h\\x00K\\x07h\\x01]\\x94u" * 2
    >>> s = scan(buf, 0, [layout])
    >>> int(s.chain[s.index_at(0)]), s.size[:2].tolist()
    (2, [7, 7])
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["Layout", "Scan", "scan", "scan_c", "pack_layouts", "c_parser_takes", "MAX_FRAMES"]

#: Longest frames list the vectorised parser follows (longer ones go to the interpreter).
MAX_FRAMES = 512
_K, _M, _J, _L1 = 0x4B, 0x4D, 0x4A, 0x8A
_H, _JJ = 0x68, 0x6A
_STR, _MEMO = 0x8C, 0x94
_NONE, _TRUE, _FALSE = 0x4E, 0x88, 0x89
_EMPTY_LIST, _MARK, _APPENDS, _APPEND, _SETITEMS = 0x5D, 0x28, 0x65, 0x61, 0x75


class Layout:
    """The keys of one kind of event, in file order, with the bytes of their memo references."""

    def __init__(self, keys: Sequence[str], key_refs: Sequence[bytes]) -> None:
        self.keys = list(keys)
        self.raw_refs = [bytes(r) for r in key_refs]
        if any(len(r) > 8 for r in self.raw_refs):
            raise ValueError("a key reference is at most 5 bytes (LONG_BINGET)")


class Scan:
    """Events parsed side by side in one buffer; rows are candidates in increasing position.

    Per candidate: ``start``/``end`` (buffer positions), ``ok`` (fully parsed), ``chain`` (how
    many ok candidates follow back to back from it), the field values ``addr``, ``size``,
    ``time`` (``has_time``), ``stream``, ``action_ref`` (memo index of the action string), and frames as
    either ``list_ref`` (memo index of an existing list, -1 if new) or the new list's frame
    memo references, the bytes ``span_pos .. span_pos + span_len`` of the buffer. ``inline`` counts the memo
    entries each event's inline strings add, ``inline_before_frames`` those written before
    its frames value; ``meta_ref``/``meta_inline`` carry ``user_metadata``.
    """

    def __init__(self, n: int) -> None:
        self.start = np.zeros(n, dtype=np.int64)
        self.end = np.zeros(n, dtype=np.int64)
        self.ok = np.zeros(n, dtype=bool)
        self.chain = np.zeros(n, dtype=np.int64)
        self.layout = np.zeros(n, dtype=np.int8)
        self.addr = np.zeros(n, dtype=np.int64)
        self.size = np.zeros(n, dtype=np.int64)
        self.time = np.zeros(n, dtype=np.int64)
        self.stream = np.zeros(n, dtype=np.int64)
        self.has_time = np.zeros(n, dtype=bool)
        self.action_ref = np.full(n, -1, dtype=np.int64)
        self.list_ref = np.full(n, -1, dtype=np.int64)
        self.span_pos = np.zeros(n, dtype=np.int64)  # a new frames list's reference bytes
        self.span_len = np.zeros(n, dtype=np.int64)
        self.span_hash = np.zeros((n, 2), dtype=np.uint64)  # two 64-bit hashes of those bytes
        self.inline = np.zeros(n, dtype=np.int64)
        self.inline_before_frames = np.zeros(n, dtype=np.int64)
        self.meta_ref = np.full(n, -1, dtype=np.int64)
        # per key of the layouts (by key name): position and length of an inline string value, -1 if none
        self.str_pos: dict[str, np.ndarray] = {}
        self.str_len: dict[str, np.ndarray] = {}

    def __len__(self) -> int:
        return int(self.start.shape[0])

    def finish(self, B: "_Bytes") -> None:
        """Compute the chains: events back to back, or separated only by a FRAME header (9 bytes)
        and/or the end of one batch of list items and the start of the next (``APPENDS MARK``)."""
        ok = self.ok
        n = len(self)
        link = np.zeros(n, dtype=bool)
        self.batch_end = np.zeros(n, dtype=bool)  # an APPENDS follows this event
        if n > 1:
            gap = self.start[1:] - self.end[:-1]
            w = B.word(self.end[:-1])
            first = w & _U8
            appends = (w & _U16) == np.uint64(0x2865)  # "e("
            frame_after = ((w >> _SH16) & _U8) == 0x95
            link[:-1] = ok[:-1] & ok[1:] & ((gap == 0) | ((gap == 9) & (first == 0x95)) | ((gap == 2) & appends)
                                          | ((gap == 11) & appends & frame_after))
            self.batch_end[:-1] = link[:-1] & appends & ((gap == 2) | (gap == 11))
        # chain[i] = 1 + number of consecutive links from i (0 when not ok)
        idx = np.arange(n)
        breaks = np.where(~link, idx, n)
        next_break = np.minimum.accumulate(breaks[::-1])[::-1]
        self.chain = np.where(ok, next_break - idx + 1, 0)
        self.chain = np.minimum(self.chain, n - idx)

    def index_at(self, pos: int) -> int:
        """Candidate index of an ok event starting at ``pos``, or -1."""
        i = int(np.searchsorted(self.start, pos))
        return i if i < len(self) and self.start[i] == pos and self.ok[i] else -1


class _Bytes:
    """The buffer, read 8 bytes at a time at any positions (little-endian words; zeros past the end)."""

    def __init__(self, buf: bytes, hi: int) -> None:
        self.hi = hi
        size = (hi + 8) // 8 * 8 + 16
        padded = np.zeros(size, dtype=np.uint8)
        padded[:hi] = np.frombuffer(buf, dtype=np.uint8, count=hi)
        self.byte = padded
        # a view whose element i is the 8 bytes from position i (unaligned, overlapping): one
        # gather per read instead of two aligned loads, two shifts and a select
        self._at = np.ndarray(shape=(size - 8,), dtype="<u8", buffer=padded, strides=(1,))
        self._last = size - 9

    def word(self, p: np.ndarray) -> np.ndarray:
        """The 8 bytes at each position, as uint64."""
        return self._at[np.minimum(p, self._last)]


_U8, _U16, _U32 = np.uint64(0xFF), np.uint64(0xFFFF), np.uint64(0xFFFFFFFF)
_SH8, _SH16 = np.uint64(8), np.uint64(16)


# per opcode byte: where an integer's bytes start, how many there are (LONG1: given by its next
# byte), whether they are signed; a reference's length
_INT_OFF = np.zeros(256, dtype=np.int64)
_INT_LEN = np.zeros(256, dtype=np.int64)
_INT_SIGNED = np.zeros(256, dtype=bool)
for _op, _off, _n, _signed in ((_K, 1, 1, False), (_M, 1, 2, False), (_J, 1, 4, True), (_L1, 2, 0, True)):
    _INT_OFF[_op], _INT_LEN[_op], _INT_SIGNED[_op] = _off, _n, _signed
_REF_LEN = np.zeros(256, dtype=np.int64)
_REF_LEN[_H], _REF_LEN[_JJ] = 2, 5
_REF_MASK = np.zeros(256, dtype=np.uint64)
_REF_MASK[_H], _REF_MASK[_JJ] = 0xFF, 0xFFFFFFFF
_MASKS = np.array([(1 << (8 * k)) - 1 for k in range(8)] + [(1 << 64) - 1], dtype=np.uint64)


def _int_at(B: _Bytes, p: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(value, length; 0 = not an integer opcode) of K, M, J and LONG1 (1-8 bytes) at ``p``."""
    op = (w & _U8).astype(np.intp)
    nb = _INT_LEN[op]
    long1 = op == _L1
    if long1.any():
        n1 = ((w >> _SH8) & _U8).astype(np.int64)
        nb = np.where(long1, np.where((n1 >= 1) & (n1 <= 8), n1, 0), nb)
    off = _INT_OFF[op]
    raw = B.word(p + off) & _MASKS[nb]
    val = raw.view(np.int64)
    neg = _INT_SIGNED[op] & (nb > 0) & (nb < 8) & (((raw >> (8 * np.maximum(nb, 1) - 1).astype(np.uint64))
                                                    & np.uint64(1)) == 1)
    if neg.any():
        val = val.copy()
        val[neg] -= np.left_shift(np.int64(1), 8 * nb[neg])
    return val, np.where(nb > 0, off + nb, 0)


def _ref_at(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(memo index, length; -1, 0 = not a reference) of BINGET/LONG_BINGET."""
    op = (w & _U8).astype(np.intp)
    length = _REF_LEN[op]
    return np.where(length > 0, ((w >> _SH8) & _REF_MASK[op]).view(np.int64), -1), length


def _key_matches(w: np.ndarray, ref: bytes) -> np.ndarray:
    value = np.uint64(int.from_bytes(ref, "little"))
    mask = np.uint64((1 << (8 * len(ref))) - 1)
    return (w & mask) == value


def _parse_layout(B: _Bytes, cand: np.ndarray, layout: Layout, out: Scan, rows: np.ndarray) -> None:
    n = cand.shape[0]
    p = cand + 3
    ok = np.ones(n, dtype=bool)
    time_seen = False
    for key, ref in zip(layout.keys, layout.raw_refs):
        ok &= _key_matches(B.word(p), ref)
        p = p + len(ref)
        w = B.word(p)
        if key == "frames":
            _parse_frames(B, p, w, ok, out, rows)
            p = out.end[rows]
            continue
        if key in ("addr", "device_free", "size", "time_us", "stream"):
            val, length = _int_at(B, p, w)
            ok &= length > 0
            if key in ("addr", "device_free"):
                out.addr[rows] = val
            elif key == "size":
                out.size[rows] = val
            elif key == "time_us":
                out.time[rows] = val
                time_seen = True
            else:
                out.stream[rows] = val
            p = p + length
            continue
        # any other value: a memo reference, an inline short string, None/True/False or an integer
        op = w & _U8
        idx, rlen = _ref_at(w)
        is_str = op == _STR
        slen = ((w >> _SH8) & _U8).astype(np.int64) + 3
        if is_str.any():
            ok &= ~is_str | (B.byte[np.minimum(p + slen - 1, B.hi)] == _MEMO)
        single = (op == _NONE) | (op == _TRUE) | (op == _FALSE)
        _ival, ilen = _int_at(B, p, w)
        length = np.where(rlen > 0, rlen, np.where(is_str, slen, np.where(single, 1, ilen)))
        ok &= length > 0
        if key == "action":
            ok &= rlen > 0  # the action string itself must be a reference (inline: first occurrence)
            out.action_ref[rows] = idx
        else:
            out.inline[rows] += is_str
            if key not in out.str_pos:
                out.str_pos[key] = np.full(len(out), -1, dtype=np.int64)
                out.str_len[key] = np.zeros(len(out), dtype=np.int64)
            out.str_pos[key][rows] = np.where(is_str, p + 2, -1)
            out.str_len[key][rows] = np.where(is_str, slen - 3, 0)
            if key == "user_metadata":
                out.meta_ref[rows] = np.where(rlen > 0, idx, -1)
        p = p + length
    ok &= B.byte[np.minimum(p, B.hi)] == _SETITEMS
    end = p + 1
    ok &= end <= B.hi
    out.ok[rows] = ok & out.ok[rows]
    out.end[rows] = end
    out.has_time[rows] = time_seen
    if not time_seen:
        out.time[rows] = 0


_P1, _P2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xC2B2AE3D27D4EB4F)


def _hash_spans(B: _Bytes, pos: np.ndarray, length: np.ndarray) -> np.ndarray:
    """Two independent 64-bit hashes of each byte span (equal spans, equal hashes), shape (n, 2)."""
    n = pos.shape[0]
    h1 = length.astype(np.uint64) * _P2
    h2 = length.astype(np.uint64) ^ _P1
    active = np.flatnonzero(length > 0)
    k = 0
    while active.shape[0]:
        left = length[active] - 8 * k
        w = B.word(pos[active] + 8 * k)
        tail = left < 8
        if tail.any():
            bits = (8 * np.where(tail, left, 0)).astype(np.uint64)
            w = np.where(tail, w & ((np.uint64(1) << bits) - np.uint64(1)), w)
        h1[active] = (h1[active] ^ w) * _P1
        h2[active] = (h2[active] + w) * _P2 ^ (h2[active] >> np.uint64(29))
        active = active[left > 8]
        k += 1
    return np.stack([h1, h2], axis=1) if n else np.zeros((0, 2), dtype=np.uint64)


def _parse_frames(B: _Bytes, p: np.ndarray, w: np.ndarray, ok: np.ndarray, out: Scan, rows: np.ndarray) -> None:
    """The frames value: a reference to a list seen before, or a new list of frame references."""
    op = w & _U8
    idx, rlen = _ref_at(w)
    out.list_ref[rows] = idx
    end = p + rlen
    new = op == _EMPTY_LIST
    ok &= (rlen > 0) | (new & (((w >> _SH8) & _U8) == _MEMO))
    q = p + 2
    c = (w >> _SH16) & _U8
    multi = new & (c == _MARK)
    single = new & ((c == _H) | (c == _JJ))
    empty = new & ~multi & ~single
    end = np.where(empty, q, end)
    span_pos = np.where(multi, q + 1, q)
    span_len = np.zeros(p.shape[0], dtype=np.int64)
    if single.any():
        s = np.flatnonzero(single)
        _r, l = _ref_at(B.word(q[s]))
        after = q[s] + l
        ok[s] &= B.byte[np.minimum(after, B.hi)] == _APPEND
        span_len[s] = l
        end[s] = after + 1
    if multi.any():
        m = np.flatnonzero(multi)
        pos = q[m] + 1
        active = np.arange(m.shape[0])
        depth = 0
        while active.shape[0] and depth <= MAX_FRAMES:
            pa = pos[active]
            wa = B.word(pa)
            stop = (wa & _U8) == _APPENDS
            _r, l = _ref_at(wa)
            bad = ~stop & (l == 0)
            ok[m[active[bad]]] = False
            done = active[stop]
            end[m[done]] = pos[done] + 1
            span_len[m[done]] = pos[done] - span_pos[m[done]]
            go = ~stop & ~bad
            pos[active[go]] = pa[go] + l[go]
            active = active[go]
            depth += 1
        ok[m[active]] = False  # longer than MAX_FRAMES: left to the interpreter
    out.end[rows] = end
    out.span_pos[rows] = np.where(new, span_pos, 0)
    out.span_len[rows] = np.where(new, span_len, 0)
    out.span_hash[rows] = _hash_spans(B, out.span_pos[rows], out.span_len[rows])
    out.inline_before_frames[rows] = out.inline[rows]
    out.ok[rows] = ok


def scan(buf: bytes, lo: int, layouts: Sequence[Layout], hi: int | None = None) -> Scan:
    """Parse every candidate event in ``buf[lo:hi]`` for the given layouts (first match wins)."""
    hi = len(buf) if hi is None else hi
    B = _Bytes(buf, hi)
    cand = lo + np.flatnonzero(B.byte[lo:hi] == 0x7D)
    w = B.word(cand)
    cand = cand[((w >> _SH8) & _U8 == _MEMO) & ((w >> _SH16) & _U8 == _MARK)]
    out = Scan(cand.shape[0])
    out.start[:] = cand
    assigned = np.zeros(cand.shape[0], dtype=bool)
    w = B.word(cand + 3)
    for li, layout in enumerate(layouts):
        match = ~assigned & _key_matches(w, layout.raw_refs[0])
        rows = np.flatnonzero(match)
        if rows.shape[0] == 0:
            continue
        assigned |= match
        out.layout[rows] = li
        out.ok[rows] = True
        _parse_layout(B, cand[rows], layout, out, rows)
    out.ok &= assigned
    out.finish(B)
    return out


try:  # the same parser in C (tbmem/snapshot/_creader.h), where the install could compile it
    from tbmem.snapshot import _creader as _C
except ImportError:  # pragma: no cover - no C compiler at install time
    _C = None  # type: ignore[assignment]
_KIND = {"frames": 0, "addr": 1, "device_free": 1, "size": 2, "time_us": 3, "stream": 4, "action": 5,
         "user_metadata": 7}


def pack_layouts(layouts: Sequence[Layout]) -> tuple[bytes, list[str], list[set[int]]]:
    """The layouts as the C parser reads them, the names of their other keys (whose inline strings are
    kept), and for each such name the layouts that have it."""
    spec = bytearray((len(layouts),))
    names: list[str] = []
    where: list[set[int]] = []
    for li, layout in enumerate(layouts):
        spec.append(len(layout.keys))
        for key, ref in zip(layout.keys, layout.raw_refs):
            kind = _KIND.get(key, 6)
            gen = 0
            if kind >= 6:
                if key not in names:
                    names.append(key)
                    where.append(set())
                gen = names.index(key)
                where[gen].add(li)
            spec += bytes((kind, gen, len(ref))) + ref.ljust(8, b"\0")
    return bytes(spec), names, where


def c_parser_takes(layouts: Sequence[Layout]) -> bool:
    """Whether the C parser is built and its fixed bounds hold these layouts (64 of 64 keys at most)."""
    return _C is not None and 0 < len(layouts) <= 64 and all(0 < len(x.keys) <= 64 for x in layouts) \
        and len({k for x in layouts for k in x.keys if _KIND.get(k, 6) >= 6}) <= 64


def scan_c(buf: bytes, lo: int, layouts: Sequence[Layout], hi: int | None = None) -> Scan:
    """:func:`scan` by the C parser, candidate by candidate: the same arrays (tests compare them; the
    reader itself runs the C parser through :mod:`tbmem.snapshot.pickle_crun`)."""
    hi = len(buf) if hi is None else hi
    if not c_parser_takes(layouts):
        raise ValueError("the C parser is not built, or these layouts are beyond its bounds")
    spec, names, where = pack_layouts(layouts)
    n = _C.count(buf, lo, hi)
    out = Scan(n)
    out.batch_end = np.zeros(n, dtype=bool)
    pos = [np.full(n, -1, dtype=np.int64) for _ in names]
    lens = [np.zeros(n, dtype=np.int64) for _ in names]
    used = _C.scan(buf, lo, hi, spec, (
        out.start, out.end, out.ok.view(np.uint8), out.layout, out.addr, out.size, out.time, out.stream,
        out.has_time.view(np.uint8), out.action_ref, out.list_ref, out.span_pos, out.span_len, out.span_hash,
        out.inline, out.inline_before_frames, out.meta_ref, out.chain, out.batch_end.view(np.uint8)),
        tuple(pos), tuple(lens))
    for g, name in enumerate(names):
        if any(used[li] for li in where[g]):  # as scan: the keys of layouts that had a candidate
            out.str_pos[name] = pos[g]
            out.str_len[name] = lens[g]
    return out
