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
    >>> from tbmem.snapshot.model import Device
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

from tbmem.snapshot.model import FLAG_PENDING_FREE, SEG_EXPANDABLE, Device

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
    """Where the reserved bytes of a device are at one event (see the module docstring)."""

    event: int
    reserved: int
    by_category: dict[str, int]
    pending_free: int
    rounding: int
    inactive_split: int
    free_segments: int
    outside_bytes: int
    segments: list[SegmentState]

    @property
    def internal_fragmentation(self) -> int:
        """Rounding plus inactive split."""
        return self.rounding + self.inactive_split

    def to_json(self) -> dict[str, Any]:
        """The ``explain`` object of ``stats --json``."""
        return {"event": self.event, "reserved_bytes": self.reserved, "allocated_by_category": self.by_category,
                "pending_free_bytes": self.pending_free, "rounding_bytes": self.rounding,
                "inactive_split_bytes": self.inactive_split, "free_segment_bytes": self.free_segments,
                "outside_segments_bytes": self.outside_bytes, "segments": len(self.segments),
                "releasable_segments": sum(1 for s in self.segments if not s.allocs)}


def pending_at(dev: Device, idx: np.ndarray, event: int) -> np.ndarray:
    """Whether each allocation ``idx`` (alive at ``event``) has a free requested but not completed:
    its ``free_requested`` came at or before the event, or (known only from the final state)
    it was pending when the snapshot was taken and the event is the last."""
    a = dev.allocs
    req = a["freereq"][idx]
    last = event >= dev.n_events - 1
    return ((req >= 0) & (req <= event)) | ((req < 0) & ((a["flags"][idx] & FLAG_PENDING_FREE) != 0) & last
                                            & (a["end"][idx] < 0))


def _merged_segments(dev: Device, event: int) -> list[SegmentState]:
    segs = dev.segs
    assert segs is not None
    live = dev.segments_alive_at(event)
    live = live[np.argsort(segs["addr"][live], kind="stable")]
    out: list[SegmentState] = []
    for i in live.tolist():
        addr, size, flags = int(segs["addr"][i]), int(segs["size"][i]), int(segs["flags"][i])
        stream, pool = int(segs["stream"][i]), int(segs["pool"][i])
        prev = out[-1] if out else None
        if prev is not None and flags & SEG_EXPANDABLE and prev.flags & SEG_EXPANDABLE \
                and prev.addr + prev.size == addr and prev.stream == (dev.streams[stream] if stream >= 0 else 0):
            prev.size += size
            continue
        out.append(SegmentState(addr=addr, size=size, stream=dev.streams[stream] if stream >= 0 else 0,
                                pool=dev.pools[pool] if pool >= 0 else None, flags=flags, stack=int(segs["stack"][i])))
    return out


def allocator_state(dev: Device, event: int, categories: Sequence[str]) -> AllocatorState:
    """The state right after ``event`` (-1: before the first event)."""
    a = dev.allocs
    alive = dev.alive_at(event)
    pending = pending_at(dev, alive, event)
    segments = _merged_segments(dev, event) if dev.segs is not None else []
    starts = np.array([s.addr for s in segments], dtype=np.int64)
    ends = np.array([s.addr + s.size for s in segments], dtype=np.int64)
    addr = a["addr"][alive]
    pos = np.searchsorted(starts, addr, side="right") - 1
    inside = (pos >= 0) & (addr < ends[np.maximum(pos, 0)] if ends.shape[0] else np.zeros(addr.shape[0], dtype=bool))
    by_category: dict[str, int] = {}
    for c in np.unique(a["category"][alive[inside & ~pending]]).tolist():
        mine = inside & ~pending & (a["category"][alive] == c)
        by_category[categories[c]] = int(a["size"][alive[mine]].sum())
    # a block's extent: its size and rounding, never past the next block or its segment's end
    order = np.lexsort((addr, pos))
    for k, j in enumerate(order.tolist()):
        if not inside[j]:
            continue
        seg = segments[int(pos[j])]
        i = int(alive[j])
        size = int(a["size"][i])
        nxt = order[k + 1] if k + 1 < order.shape[0] else -1
        limit = int(addr[nxt]) if nxt >= 0 and inside[nxt] and pos[nxt] == pos[j] else seg.addr + seg.size
        rounding = max(0, min(int(a["round"][i]), limit - int(addr[j]) - size))
        seg.allocs.append(i)
        seg.rounding += rounding
        if pending[j]:
            seg.pending_free += size
        else:
            seg.allocated += size
    inactive = free = 0
    for seg in segments:
        seg.free = seg.size - seg.allocated - seg.pending_free - seg.rounding
        if seg.allocs:
            inactive += seg.free
        else:
            free += seg.free
    return AllocatorState(event=event, reserved=int(sum(s.size for s in segments)), by_category=by_category,
                          pending_free=int(sum(s.pending_free for s in segments)),
                          rounding=int(sum(s.rounding for s in segments)), inactive_split=int(inactive),
                          free_segments=int(free), outside_bytes=int(a["size"][alive[~inside]].sum()),
                          segments=segments)
