"""The caching allocator's segments over time: what ``segments`` holds at the end, replayed back through
the trace's ``segment_alloc``/``segment_free`` and ``segment_map``/``segment_unmap`` events.

A *piece* is a range of device memory reserved from one event to another: one ``cudaMalloc``'d
segment, or one mapped range of an expandable segment (``segment_unmap`` may release part of
a range; the rest stays reserved). Ranges the trace frees without having reserved them, and
the parts of the final segments the trace never reserved, were reserved before the first
event (start -1). Pieces alive at the end take their final segment's stream, memory pool
(``segment_pool_id``: ``(0, 0)`` is the default pool; others are CUDA graphs' private pools
or ``torch.cuda.MemPool``\\s), kind and stack.

Example:
    >>> import numpy as np
    >>> from tbmem._internal.snapshot.cuda_segments import FinalSegment, segment_pieces
    >>> act = np.array([4, 5])                        # segment_alloc, segment_free
    >>> addr, size = np.array([0x1000, 0x1000]), np.array([2 << 20, 2 << 20])
    >>> final = [FinalSegment(addr=0x900000, size=20 << 20, stream=0, pool=(0, 0), stack=-1, flags=4)]
    >>> p = segment_pieces(act, addr, size, np.full(2, -1), {}, final)
    >>> c = {k: v.tolist() for k, v in p.cols.items()}
    >>> [(hex(a), s >> 20, b, e) for a, s, b, e in zip(c["addr"], c["size"], c["start"], c["end"])]
    [('0x900000', 20, -1, -1), ('0x1000', 2, 0, 1)]
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from tbmem._internal.snapshot.model import SEG_EXPANDABLE, SEG_LARGE, SEG_SMALL, SEGMENT_COLUMNS
from tbmem._internal.snapshot.pickle_rows import ACTION_CODE

__all__ = ["FinalSegment", "Pieces", "segment_pieces", "segment_flags"]

_RESERVE = (ACTION_CODE["segment_alloc"], ACTION_CODE["segment_map"])
_RELEASE = (ACTION_CODE["segment_free"], ACTION_CODE["segment_unmap"])
_MAP, _UNMAP = ACTION_CODE["segment_map"], ACTION_CODE["segment_unmap"]
_SMALL_SEGMENT = 2 << 20  # the small pool's segments (kSmallBuffer)


@dataclass(frozen=True)
class FinalSegment:
    """One entry of the snapshot's ``segments`` (the state when it was taken)."""

    addr: int
    size: int
    stream: int
    pool: tuple[int, int] | None
    stack: int
    flags: int


def segment_flags(seg: Mapping[str, Any]) -> int:
    """``SEG_*`` flags of a ``segments`` entry (expandable, small or large pool)."""
    flags = SEG_EXPANDABLE if seg.get("is_expandable") is True else 0
    kind = seg.get("segment_type")
    return flags | (SEG_SMALL if kind == "small" else SEG_LARGE if kind == "large" else 0)


@dataclass
class Pieces:
    """Segment pieces as columns (:data:`~tbmem._internal.snapshot.model.SEGMENT_COLUMNS`), with the raw
    stream ids and pool ids their ``stream``/``pool`` columns index."""

    cols: dict[str, np.ndarray]
    streams: list[int]
    pools: list[list[int]]


class _Live:
    """The reserved ranges right now, sorted by address: [addr, end, start event, stream, stack, flags, pool]."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.items: list[list[int]] = []

    def add(self, item: list[int]) -> None:
        i = bisect.bisect_left(self.starts, item[0])
        self.starts.insert(i, item[0])
        self.items.insert(i, item)

    def take(self, lo: int, hi: int) -> list[list[int]]:
        """Remove and return every range overlapping [lo, hi)."""
        i = max(bisect.bisect_right(self.starts, lo) - 1, 0)
        j = bisect.bisect_left(self.starts, hi)
        hit = [(k, it) for k, it in enumerate(self.items[i:j], start=i) if it[1] > lo and it[0] < hi]
        for k, _it in reversed(hit):
            del self.starts[k]
            del self.items[k]
        return [it for _k, it in hit]


def _paired_segments(act: np.ndarray, addr: np.ndarray, size: np.ndarray, stack: np.ndarray,
                     streams: Mapping[int, int],
                     pools: Mapping[int, int]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """``segment_alloc``/``segment_free`` (whole ``cudaMalloc``'d segments) paired by address, vectorised:
    (closed pieces, pieces still reserved at the end) as columns addr, size, start, end, stream, stack, flags,
    pool (the ``pool_id`` of the event that reserved it, else of the one that released it; -1 not known)."""
    ev = np.flatnonzero(((act == _RESERVE[0]) | (act == _RELEASE[0])) & (size > 0))
    o = ev[np.argsort(addr[ev], kind="stable")]
    a, g, m = act[o], addr[o], o.shape[0]
    same_next = np.zeros(m, dtype=bool)
    same_next[:-1] = g[1:] == g[:-1]
    is_alloc = a == _RESERVE[0]
    nxt = np.minimum(np.arange(m) + 1, max(m - 1, 0))
    prev_alloc = np.zeros(m, dtype=bool)
    prev_alloc[1:] = is_alloc[:-1] & same_next[:-1]
    closed = is_alloc & same_next  # ended by the next event of the address (its free, or a new reservation)
    lone = (a == _RELEASE[0]) & ~prev_alloc  # released, reserved before the trace
    still = is_alloc & ~same_next
    stream = np.array([streams.get(int(e), 0) for e in o.tolist()], dtype=np.int64) if streams else np.zeros(m, np.int64)
    pool = np.array([pools.get(int(e), -1) for e in o.tolist()], dtype=np.int64) if pools else np.full(m, -1)
    sz = size[o]
    kind = np.where(sz == _SMALL_SEGMENT, SEG_SMALL, SEG_LARGE)

    def cols(mask: np.ndarray, start: np.ndarray, end: np.ndarray, st: np.ndarray, flags: np.ndarray,
             pl: np.ndarray) -> dict:
        return {"addr": g[mask], "size": sz[mask], "start": start[mask], "end": end[mask], "stream": stream[mask],
                "stack": st[mask].astype(np.int64), "flags": flags[mask], "pool": pl[mask]}

    st = stack[o]
    done = cols(closed, o, o[nxt], st, kind, np.where(pool >= 0, pool, pool[nxt]))
    gone = cols(lone, np.full(m, -1), o, np.full(m, -1), np.zeros(m, dtype=np.int64), pool)
    return {c: np.concatenate((done[c], gone[c])) for c in done}, cols(still, o, np.full(m, -1), st, kind, pool)


def segment_pieces(act: np.ndarray, addr: np.ndarray, size: np.ndarray, stack: np.ndarray,
                   streams: Mapping[int, int], final: list[FinalSegment],
                   pools: Mapping[int, tuple[int, int]] | None = None) -> Pieces:
    """The pieces of one device: segment events (positions on its axis; ``streams`` maps a
    position to its stream where not 0, ``pools`` to the event's ``pool_id`` where the trace has
    one) and its final ``segments``. A piece's pool is its final segment's, else its events'."""
    pool_ids: dict[tuple[int, int], int] = {}
    codes = {pos: pool_ids.setdefault((int(p[0]), int(p[1])), len(pool_ids)) for pos, p in (pools or {}).items()}
    closed, open_ = _paired_segments(act, addr, size, stack, streams, codes)
    rows: list[tuple[int, ...]] = []  # addr, size, start, end, stream, stack, flags, pool
    live = _Live()
    # expandable segments map and unmap ranges that need not match: replayed range by range
    for ev in np.flatnonzero(((act == _MAP) | (act == _UNMAP)) & (size > 0)).tolist():
        a, s = int(addr[ev]), int(size[ev])
        code = int(act[ev])
        gone = live.take(a, a + s)
        if code == _MAP:
            for it in gone:  # mapped again without an unmap in the trace: the old range ended here
                rows.append((it[0], it[1] - it[0], it[2], ev, it[3], it[4], it[5], it[6]))
            live.add([a, a + s, ev, streams.get(ev, 0), int(stack[ev]), SEG_EXPANDABLE, codes.get(ev, -1)])
            continue
        covered = a
        for it in sorted(gone):
            lo, hi = max(it[0], a), min(it[1], a + s)
            if lo > covered:  # unmapped without being mapped in the trace: mapped before it
                rows.append((covered, lo - covered, -1, ev, streams.get(ev, 0), -1, SEG_EXPANDABLE, codes.get(ev, -1)))
            rows.append((lo, hi - lo, it[2], ev, it[3], it[4], it[5], it[6]))
            if it[0] < lo:
                live.add([it[0], lo, *it[2:]])
            if it[1] > hi:
                live.add([hi, it[1], *it[2:]])
            covered = max(covered, hi)
        if covered < a + s:
            rows.append((covered, a + s - covered, -1, ev, streams.get(ev, 0), -1, SEG_EXPANDABLE, codes.get(ev, -1)))
    for c, k in (("addr", 0), ("size", 1), ("start", 2), ("end", 3), ("stream", 4), ("stack", 5), ("flags", 6),
                 ("pool", 7)):
        closed[c] = np.concatenate((closed[c], np.array([r[k] for r in rows], dtype=np.int64)))
    items = live.items
    still = {"addr": np.concatenate((open_["addr"], np.array([it[0] for it in items], dtype=np.int64))),
             "end": np.concatenate((open_["addr"] + open_["size"], np.array([it[1] for it in items], dtype=np.int64)))}
    for c, k in (("start", 2), ("stream", 3), ("stack", 4), ("flags", 5), ("pool", 6)):
        still[c] = np.concatenate((open_[c], np.array([it[k] for it in items], dtype=np.int64)))
    order = np.argsort(still["addr"], kind="stable")
    still = {c: v[order] for c, v in still.items()}
    return _with_final(closed, still, sorted(final, key=lambda f: f.addr), pool_ids)


def _cut(still: dict[str, np.ndarray], which: np.ndarray, f_addr: np.ndarray, f_end: np.ndarray) -> dict:
    """``still`` with the ranges ``which`` cut at every final segment edge inside them."""
    edges = np.unique(np.concatenate((f_addr, f_end)))
    pieces = []
    for k in which.tolist():
        lo, hi = int(still["addr"][k]), int(still["end"][k])
        cuts = [lo, *edges[(edges > lo) & (edges < hi)].tolist(), hi]
        pieces += [(a, b, k) for a, b in zip(cuts[:-1], cuts[1:])]
    keep = np.ones(still["addr"].shape[0], dtype=bool)
    keep[which] = False
    src = np.array([k for _a, _b, k in pieces], dtype=np.int64)
    out = {c: np.concatenate((v[keep], v[src])) for c, v in still.items()}
    out["addr"][keep.sum():] = [a for a, _b, _k in pieces]
    out["end"][keep.sum():] = [b for _a, b, _k in pieces]
    order = np.argsort(out["addr"], kind="stable")
    return {c: v[order] for c, v in out.items()}


def _with_final(closed: dict[str, np.ndarray], still: dict[str, np.ndarray], final: list[FinalSegment],
                pool_ids: dict[tuple[int, int], int]) -> Pieces:
    """What is reserved at the end: the final segments, with the pieces the trace reserved inside them
    (their start); parts of a final segment no piece covers were reserved before the trace."""
    n_f = len(final)
    f_addr = np.array([f.addr for f in final], dtype=np.int64)
    f_end = f_addr + np.array([f.size for f in final], dtype=np.int64)
    la, le = still["addr"], still["end"]
    j = np.searchsorted(f_addr, la, side="right") - 1
    jj = np.maximum(j, 0)
    inside = (j >= 0) & (le <= f_end[jj] if n_f else False)
    nxt = np.minimum(j + 1, max(n_f - 1, 0))
    touches = ((j >= 0) & (la < f_end[jj] if n_f else False)) | ((j + 1 < n_f) & (f_addr[nxt] < le if n_f else False))
    if bool(np.any(~inside & touches)):  # a range straddling a final segment's edge: cut it there
        return _with_final(closed, _cut(still, np.flatnonzero(~inside & touches), f_addr, f_end), final, pool_ids)
    f_pool = np.array([-1 if f.pool is None else pool_ids.setdefault(f.pool, len(pool_ids)) for f in final], np.int64)
    f_stream = np.array([f.stream for f in final], dtype=np.int64)
    f_stack = np.array([f.stack for f in final], dtype=np.int64)
    f_flags = np.array([f.flags for f in final], dtype=np.int64)
    ins = np.flatnonzero(inside)
    ji = j[ins]
    parts = [{"addr": closed["addr"], "size": closed["size"], "start": closed["start"], "end": closed["end"],
              "stream": closed["stream"], "pool": closed["pool"],
              "stack": closed["stack"], "flags": closed["flags"]}]
    out_ = ~inside  # reserved in the trace, never released, yet not among the final segments
    parts.append({"addr": la[out_], "size": le[out_] - la[out_], "start": still["start"][out_],
                  "end": np.full(int(out_.sum()), -1), "stream": still["stream"][out_],
                  "pool": still["pool"][out_], "stack": still["stack"][out_], "flags": still["flags"][out_]})
    parts.append({"addr": la[ins], "size": le[ins] - la[ins], "start": still["start"][ins],
                  "end": np.full(ins.shape[0], -1), "stream": f_stream[ji],
                  "pool": np.where(f_pool[ji] >= 0, f_pool[ji], still["pool"][ins]) if ins.shape[0] else f_pool[ji],
                  "stack": np.where(still["stack"][ins] >= 0, still["stack"][ins], f_stack[ji]), "flags": f_flags[ji]})
    # the uncovered parts of each final segment: before each inside piece, and after the last
    first_in_group = np.ones(ins.shape[0], dtype=bool)
    first_in_group[1:] = ji[1:] != ji[:-1]
    prev_end = np.where(first_in_group, f_addr[ji] if n_f else 0, np.concatenate(([0], le[ins][:-1])))
    gap_lo = np.concatenate((prev_end, f_addr))
    gap_hi = np.concatenate((la[ins], f_end))
    owner = np.concatenate((ji, np.arange(n_f)))
    last_end = f_addr.copy()
    if ins.shape[0]:
        last_end[ji] = le[ins]  # ascending within a group: the last write is the last piece's end
    gap_lo[ins.shape[0]:] = last_end
    keep = gap_hi > gap_lo
    parts.append({"addr": gap_lo[keep], "size": (gap_hi - gap_lo)[keep], "start": np.full(int(keep.sum()), -1),
                  "end": np.full(int(keep.sum()), -1), "stream": f_stream[owner[keep]], "pool": f_pool[owner[keep]],
                  "stack": f_stack[owner[keep]], "flags": f_flags[owner[keep]]})
    cols = {c: np.concatenate([np.asarray(p[c], dtype=np.int64) for p in parts]) for c in SEGMENT_COLUMNS}
    values, index = np.unique(cols["stream"], return_inverse=True)
    first = np.full(values.shape[0], cols["stream"].shape[0])
    np.minimum.at(first, index.reshape(-1), np.arange(index.shape[0]))
    rank = np.argsort(np.argsort(first, kind="stable"), kind="stable")  # stream ids in order of appearance
    cols["stream"] = rank[index.reshape(-1)] if index.shape[0] else cols["stream"]
    streams = [int(values[k]) for k in np.argsort(first, kind="stable").tolist()]
    order = np.lexsort((cols["addr"], cols["start"]))
    return Pieces(cols={c: v[order] for c, v in cols.items()}, streams=streams, pools=[list(p) for p in pool_ids])


