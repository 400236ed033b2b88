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
    >>> from tbmem.snapshot.cuda_segments import FinalSegment, segment_pieces
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

from tbmem.snapshot.model import SEG_EXPANDABLE, SEG_LARGE, SEG_SMALL, SEGMENT_COLUMNS
from tbmem.snapshot.pickle_rows import ACTION_CODE

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
    """Segment pieces as columns (:data:`~tbmem.snapshot.model.SEGMENT_COLUMNS`), with the raw
    stream ids and pool ids their ``stream``/``pool`` columns index."""

    cols: dict[str, np.ndarray]
    streams: list[int]
    pools: list[list[int]]


class _Live:
    """The reserved ranges right now, sorted by address: [addr, end, start event, stream, stack, flags]."""

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


def segment_pieces(act: np.ndarray, addr: np.ndarray, size: np.ndarray, stack: np.ndarray,
                   streams: Mapping[int, int], final: list[FinalSegment]) -> Pieces:
    """The pieces of one device: segment events (positions on its axis; ``streams`` maps a
    position to its stream where not 0) and its final ``segments``."""
    rows: list[tuple[int, int, int, int, int, int, int]] = []  # addr, size, start, end, stream, stack, flags
    live = _Live()
    for ev in np.flatnonzero(np.isin(act, _RESERVE + _RELEASE)).tolist():
        a, s = int(addr[ev]), int(size[ev])
        if s <= 0:
            continue
        code = int(act[ev])
        gone = live.take(a, a + s)
        if code in _RESERVE:
            for it in gone:  # reserved again without a release in the trace: the old range ended here
                rows.append((it[0], it[1] - it[0], it[2], ev, it[3], it[4], it[5]))
            flags = SEG_EXPANDABLE if code == _MAP else (SEG_SMALL if s == _SMALL_SEGMENT else SEG_LARGE)
            live.add([a, a + s, ev, streams.get(ev, 0), int(stack[ev]), flags])
            continue
        covered = a
        for it in sorted(gone):
            lo, hi = max(it[0], a), min(it[1], a + s)
            if lo > covered:  # released without being reserved in the trace: reserved before it
                rows.append((covered, lo - covered, -1, ev, streams.get(ev, 0), -1, _released_flags(code)))
            rows.append((lo, hi - lo, it[2], ev, it[3], it[4], it[5]))
            if it[0] < lo:
                live.add([it[0], lo, *it[2:]])
            if it[1] > hi:
                live.add([hi, it[1], *it[2:]])
            covered = max(covered, hi)
        if covered < a + s:
            rows.append((covered, a + s - covered, -1, ev, streams.get(ev, 0), -1, _released_flags(code)))
    pool_ids: dict[tuple[int, int], int] = {}
    stream_ids: dict[int, int] = {}
    out: list[tuple[int, ...]] = []

    def sid(stream: int) -> int:
        return stream_ids.setdefault(stream, len(stream_ids))

    for a, s, start, end, stream, st, flags in rows:
        out.append((a, s, start, end, sid(stream), -1, st, flags))
    # what is reserved at the end: the final segments, with what the trace reserved inside them
    # (one sweep over both, sorted by address)
    items, j = live.items, 0

    def unknown(it: list[int]) -> None:  # reserved in the trace, never released, not a final segment
        out.append((it[0], it[1] - it[0], it[2], -1, sid(it[3]), -1, it[4], it[5]))

    for seg in sorted(final, key=lambda f: f.addr):
        pool = -1 if seg.pool is None else pool_ids.setdefault(seg.pool, len(pool_ids))
        cursor, end = seg.addr, seg.addr + seg.size
        while j < len(items) and items[j][1] <= seg.addr:
            unknown(items[j])
            j += 1
        while j < len(items) and items[j][0] < end:
            it = items[j]
            lo, hi = max(it[0], seg.addr), min(it[1], end)
            if it[0] < lo:
                unknown([it[0], lo, *it[2:]])
            if lo > cursor:
                out.append((cursor, lo - cursor, -1, -1, sid(seg.stream), pool, seg.stack, seg.flags))
            out.append((lo, hi - lo, it[2], -1, sid(seg.stream), pool, it[4] if it[4] >= 0 else seg.stack,
                        seg.flags))
            cursor = hi
            if it[1] > hi:  # the rest lies beyond this segment
                items[j] = [hi, it[1], *it[2:]]
                break
            j += 1
        if cursor < end:
            out.append((cursor, end - cursor, -1, -1, sid(seg.stream), pool, seg.stack, seg.flags))
    for it in items[j:]:
        unknown(it)
    arr = np.array(out, dtype=np.int64).reshape(-1, len(SEGMENT_COLUMNS))
    order = np.lexsort((arr[:, 0], arr[:, 2])) if arr.shape[0] else np.zeros(0, dtype=np.int64)
    cols = {c: np.ascontiguousarray(arr[order, k]) for k, c in enumerate(SEGMENT_COLUMNS)}
    return Pieces(cols=cols, streams=list(stream_ids), pools=[list(p) for p in pool_ids])


def _released_flags(code: int) -> int:
    return SEG_EXPANDABLE if code == _UNMAP else 0
