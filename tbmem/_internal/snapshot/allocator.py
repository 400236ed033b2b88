"""The caching allocator's state at one event: every segment, the blocks in it, and where the reserved bytes went.

At an event, the reserved bytes split exactly (the viewer's allocator view computes the same
in the browser; this is its Python twin, used by ``stats`` and the tests)::

    reserved = allocated (by category) + pending free + internal fragmentation + external free

* *allocated*: the requested bytes of the live allocations inside segments, by category;
* *pending free*: those whose free was requested but not completed (a stream still used them);
* *internal fragmentation*: the allocator's rounding of live blocks (block size minus the
  request) plus the *inactive split*: free blocks inside segments that still hold a live block,
  reserved memory that cannot be given back while those blocks live;
* *external free*: segments with no live block at all (``torch.cuda.empty_cache()`` returns them).

Contiguous mapped ranges of an expandable segment count as one segment. Live allocations
whose address lies in no segment of the snapshot (a partial file) are reported apart, as
``outside_bytes``: they are not part of the reserved bytes.

Example:
    >>> import numpy as np
    >>> from tbmem._internal.snapshot.model import Device
    >>> a = {"start": np.array([-1]), "end": np.array([-1]), "size": np.array([1000]), "addr": np.array([4096]),
    ...      "round": np.array([24])}
    >>> s = {"addr": np.array([4096, 1 << 30]), "size": np.array([4096, 8192]), "start": np.array([-1, -1]),
    ...      "end": np.array([-1, -1]), "stream": np.array([0, 0]), "pool": np.array([0, 0]),
    ...      "stack": np.array([-1, -1]), "flags": np.array([2, 2])}
    >>> dev = Device(name="cuda:0", time_us=np.zeros(0, dtype=np.int64), allocs=a, segs=s, streams=[0], pools=[[0, 0]])
    >>> st = allocator_state(dev, -1, ["python code"])
    >>> st.by_category, st.rounding, st.inactive_split, st.free_segments, st.reserved
    ({'python code': 1000}, 24, 3072, 8192, 12288)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from tbmem._internal.snapshot.model import FLAG_PENDING_FREE, SEG_EXPANDABLE, Device

__all__ = ["AllocatorState", "SegmentState", "allocator_state", "pending_at"]


@dataclass
class SegmentState:
    """One segment at the event: its bytes split like the totals, and the live allocations in it."""

    addr: int
    size: int
    stream: int
    pool: list[int] | None
    flags: int
    stack: int
    allocated: int = 0
    pending_free: int = 0
    rounding: int = 0
    free: int = 0
    allocs: list[int] = field(default_factory=list)


@dataclass
class AllocatorState:
    """Where the reserved bytes of a device are at one event (see the module docstring); per segment
    as arrays (``seg_*``), and as :class:`SegmentState` objects through :attr:`segments`."""

    event: int
    reserved: int
    by_category: dict[str, int]
    pending_free: int
    rounding: int
    inactive_split: int
    free_segments: int
    outside_bytes: int
    seg: dict[str, np.ndarray]
    alloc_segment: np.ndarray  # per live allocation (``alive``): the index of its segment, -1 outside
    alive: np.ndarray
    alloc_rounding: np.ndarray  # per live allocation: its rounding (0 outside segments)
    alloc_pending: np.ndarray  # per live allocation: its free requested, not completed
    streams: list[int]
    pools: list[list[int]]

    @property
    def allocated(self) -> int:
        """What ``torch.cuda.memory_allocated()`` reports at this event: the live blocks as the allocator
        rounded them, pending frees left out (torch stops counting a block at its free request)."""
        live = ~self.alloc_pending
        return int(sum(self.by_category.values()) + self.alloc_rounding[live].sum()) + self.outside_bytes

    @property
    def internal_fragmentation(self) -> int:
        """Rounding plus inactive split."""
        return self.rounding + self.inactive_split

    @property
    def n_segments(self) -> int:
        """Segments (contiguous mapped ranges of an expandable segment count once)."""
        return int(self.seg["addr"].shape[0])

    @property
    def segments(self) -> list[SegmentState]:
        """Every segment, by address."""
        s = self.seg
        out = [SegmentState(addr=int(s["addr"][k]), size=int(s["size"][k]),
                            stream=self.streams[s["stream"][k]] if s["stream"][k] >= 0 else 0,
                            pool=self.pools[s["pool"][k]] if s["pool"][k] >= 0 else None, flags=int(s["flags"][k]),
                            stack=int(s["stack"][k]), allocated=int(s["allocated"][k]),
                            pending_free=int(s["pending"][k]),
                            rounding=int(s["rounding"][k]), free=int(s["free"][k])) for k in range(self.n_segments)]
        for i, k in zip(self.alive.tolist(), self.alloc_segment.tolist()):
            if k >= 0:
                out[k].allocs.append(i)
        return out

    def to_json(self) -> dict[str, Any]:
        """The ``explain`` object of ``stats --json``."""
        return {"event": self.event, "reserved_bytes": self.reserved, "allocated_bytes": self.allocated,
                "allocated_by_category": self.by_category,
                "pending_free_bytes": self.pending_free, "rounding_bytes": self.rounding,
                "inactive_split_bytes": self.inactive_split, "free_segment_bytes": self.free_segments,
                "outside_segments_bytes": self.outside_bytes, "segments": self.n_segments,
                "releasable_segments": int((self.seg["blocks"] == 0).sum())}


def pending_at(dev: Device, idx: np.ndarray, event: int) -> np.ndarray:
    """Whether each allocation ``idx`` (alive at ``event``) has a free requested but not completed:
    its ``free_requested`` came at or before the event, or (known only from the final state)
    it was pending when the snapshot was taken and the event is the last."""
    a = dev.allocs
    req = a["freereq"][idx]
    last = event >= dev.n_events - 1
    return ((req >= 0) & (req <= event)) | ((req < 0) & ((a["flags"][idx] & FLAG_PENDING_FREE) != 0) & last
                                            & (a["end"][idx] < 0))


def _merged_segments(dev: Device, event: int) -> dict[str, np.ndarray]:
    """The segments alive after ``event`` by address, contiguous ranges of an expandable one merged."""
    segs = dev.segs
    if segs is None:
        return {c: np.zeros(0, dtype=np.int64) for c in ("addr", "size", "stream", "pool", "flags", "stack")}
    live = dev.segments_alive_at(event)
    live = live[np.argsort(segs["addr"][live], kind="stable")]
    addr, size, flags, stream = segs["addr"][live], segs["size"][live], segs["flags"][live], segs["stream"][live]
    new = np.ones(live.shape[0], dtype=bool)
    exp = (flags & SEG_EXPANDABLE) != 0
    new[1:] = ~(exp[1:] & exp[:-1] & (addr[:-1] + size[:-1] == addr[1:]) & (stream[1:] == stream[:-1]))
    starts = np.flatnonzero(new)
    out = {c: segs[c][live][starts] for c in ("addr", "stream", "pool", "flags", "stack")}
    out["size"] = np.add.reduceat(size, starts) if starts.shape[0] else np.zeros(0, dtype=np.int64)
    return out


def _sums(index: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    out = np.zeros(n, dtype=np.int64)
    np.add.at(out, index, values)
    return out


def allocator_state(dev: Device, event: int, categories: Sequence[str]) -> AllocatorState:
    """The state right after ``event`` (-1: before the first event)."""
    a = dev.allocs
    alive = dev.alive_at(event)
    pending = pending_at(dev, alive, event)
    seg = _merged_segments(dev, event)
    n = seg["addr"].shape[0]
    ends = seg["addr"] + seg["size"]
    addr, size = a["addr"][alive], a["size"][alive]
    pos = np.searchsorted(seg["addr"], addr, side="right") - 1
    inside = (pos >= 0) & (addr < ends[np.maximum(pos, 0)]) if n else np.zeros(addr.shape[0], dtype=bool)
    pos = np.where(inside, pos, -1)
    cat = a["category"][alive]
    by_category = {categories[c]: int(size[inside & ~pending & (cat == c)].sum())
                   for c in np.unique(cat[inside & ~pending]).tolist()}
    # a block's extent: its size and rounding, never past the next block or its segment's end
    order = np.lexsort((addr, pos))
    nxt = np.zeros(order.shape[0], dtype=np.int64)
    if order.shape[0] and n:  # without segments nothing is inside one, and no extent is needed
        nxt[:-1] = np.where(pos[order][1:] == pos[order][:-1], addr[order][1:], ends[np.maximum(pos[order][:-1], 0)])
        nxt[-1] = ends[max(int(pos[order][-1]), 0)] if n else 0
    limit = np.empty(order.shape[0], dtype=np.int64)
    limit[order] = nxt
    rounding = np.where(inside, np.clip(np.minimum(a["round"][alive], limit - addr - size), 0, None), 0)
    p = np.maximum(pos, 0)
    seg["allocated"] = _sums(p[inside & ~pending], size[inside & ~pending], n)
    seg["pending"] = _sums(p[inside & pending], size[inside & pending], n)
    seg["rounding"] = _sums(p[inside], rounding[inside], n)
    seg["blocks"] = _sums(p[inside], np.ones(int(inside.sum()), dtype=np.int64), n)
    seg["free"] = seg["size"] - seg["allocated"] - seg["pending"] - seg["rounding"]
    held = seg["blocks"] > 0
    return AllocatorState(event=event, reserved=int(seg["size"].sum()), by_category=by_category,
                          pending_free=int(seg["pending"].sum()), rounding=int(seg["rounding"].sum()),
                          inactive_split=int(seg["free"][held].sum()), free_segments=int(seg["free"][~held].sum()),
                          outside_bytes=int(size[~inside].sum()), seg=seg, alloc_segment=pos, alive=alive,
                          alloc_rounding=rounding, alloc_pending=pending, streams=list(dev.streams),
                          pools=[list(q) for q in dev.pools])
