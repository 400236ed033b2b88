"""A decoded snapshot in memory: shared tables and, per device, allocations and segments as intervals.

An allocation runs from event ``start`` to event ``end`` (-1: before the first event / still
alive at the end); so does a *segment piece*, a range of device memory the caching allocator
had reserved (``cudaMalloc``'d, or mapped for an expandable segment). Memory alive before the
first event (the *baseline*) is part of every point of the timeline, and the state before
the first event is a candidate for the peak like the state after each event.

Example:
    >>> import numpy as np
    >>> from tbmem._internal.snapshot.model import Device
    >>> a = {"start": np.array([-1, 0]), "end": np.array([0, -1]), "size": np.array([8, 4])}
    >>> d = Device(name="cuda:0", time_us=np.array([5]), allocs=a)
    >>> d.timeline().tolist(), d.peak(), d.baseline_bytes()
    ([4], (-1, 8), 8)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tbmem._internal.snapshot.columns import sum_by

__all__ = ["Snapshot", "Device", "Frame", "COLUMNS", "EXTRA_COLUMNS", "SEGMENT_COLUMNS", "FLAG_FREE_SITE",
           "FLAG_PENDING_FREE",
           "SEG_EXPANDABLE", "SEG_SMALL", "SEG_LARGE", "empty_columns"]

#: Columns of every allocation table.
COLUMNS = ("start", "end", "size", "category", "stack", "addr", "flags")
#: Optional allocation columns and their default: the event of its ``free_requested`` (-1: none
#: or not known) and the allocator's rounding (block size minus the requested size).
EXTRA_COLUMNS = {"freereq": -1, "round": 0}
#: Columns of a segment table: address, bytes, interval, index into ``streams``, index into
#: ``pools``, stack of the segment's allocation (-1 none), flags (``SEG_*``).
SEGMENT_COLUMNS = ("addr", "size", "start", "end", "stream", "pool", "stack", "flags")
FLAG_FREE_SITE = 1
FLAG_PENDING_FREE = 2
SEG_EXPANDABLE, SEG_SMALL, SEG_LARGE = 1, 2, 4
Frame = tuple[str, int, str]  # (filename, line, function name)


def empty_columns(names: Any) -> dict[str, np.ndarray]:
    """Zero-length int64 columns."""
    return {c: np.zeros(0, dtype=np.int64) for c in names}


@dataclass
class Device:
    """One device's allocations, segments and events.

    ``segs`` is None where the snapshot has no allocator segments (a CPU recording, an old
    file); ``streams`` are the raw stream ids its ``stream`` column indexes, ``pools`` the
    memory pool ids (``[0, 0]``: the default pool; others are CUDA-graph or ``MemPool`` pools).
    """

    name: str
    time_us: np.ndarray
    allocs: dict[str, np.ndarray]
    has_time: bool = True
    dropped: int = 0
    reserved_bytes: int | None = None
    segments: int = 0
    ooms: list[dict[str, Any]] = field(default_factory=list)
    markers: list[dict[str, Any]] = field(default_factory=list)
    segs: dict[str, np.ndarray] | None = None
    streams: list[int] = field(default_factory=list)
    pools: list[list[int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        m = self.allocs["size"].shape[0]
        for c in COLUMNS:
            if c not in self.allocs:
                self.allocs[c] = np.zeros(m, dtype=np.int64)
        for c, default in EXTRA_COLUMNS.items():
            if c not in self.allocs:
                self.allocs[c] = np.full(m, default, dtype=np.int64)

    @property
    def n_events(self) -> int:
        """Events on this device's axis."""
        return int(self.time_us.shape[0])

    @property
    def n_allocs(self) -> int:
        """Allocations (intervals)."""
        return int(self.allocs["size"].shape[0])

    def baseline_bytes(self) -> int:
        """Bytes of allocations made before the first event (alive when the trace began)."""
        a = self.allocs
        return int(a["size"][a["start"] < 0].sum())

    def timeline(self) -> np.ndarray:
        """Bytes alive after each event (length ``n_events``), the baseline included."""
        return _running(self.allocs, self.n_events, self.baseline_bytes())

    def peak(self) -> tuple[int, int]:
        """(event, bytes) at the highest point; event -1 is the state before the first event,
        which wins ties (it came first) and is the only point when there are no events."""
        base = self.baseline_bytes()
        if self.n_events == 0:
            return -1, base
        tl = self.timeline()
        i = int(np.argmax(tl))
        return (-1, base) if base >= int(tl[i]) else (i, int(tl[i]))

    def peak_bytes(self) -> int:
        """Highest bytes alive."""
        return self.peak()[1]

    def final_bytes(self) -> int:
        """Bytes alive after the last event (when the snapshot was taken)."""
        return int(self.allocs["size"][self.allocs["end"] < 0].sum())

    def alive_at(self, event: int) -> np.ndarray:
        """Indices of the allocations alive right after ``event`` (-1: before the first event)."""
        return _alive(self.allocs, event)

    # --- segments -----------------------------------------------------------------------------
    def baseline_reserved(self) -> int:
        """Bytes reserved before the first event (0 without segments)."""
        if self.segs is None:
            return 0
        return int(self.segs["size"][self.segs["start"] < 0].sum())

    def reserved_timeline(self) -> np.ndarray | None:
        """Bytes reserved after each event, or None where the snapshot has no segments."""
        if self.segs is None:
            return None
        return _running(self.segs, self.n_events, self.baseline_reserved())

    def segments_alive_at(self, event: int) -> np.ndarray:
        """Indices of the segment pieces reserved right after ``event`` ([] without segments)."""
        if self.segs is None:
            return np.zeros(0, dtype=np.int64)
        return _alive(self.segs, event)


@dataclass
class Snapshot:
    """A decoded snapshot: shared tables plus one :class:`Device` per device.

    The attributes ``device``, ``n_events``, ``time_us``, ``allocs``, ``dropped`` and the
    methods ``timeline``, ``peak``, ``peak_bytes`` and ``alive_at`` are those of the default
    device (the one with an out-of-memory event, else the largest peak).
    """

    source: str
    kind: str
    rank: int
    step: int
    t0_unix: float | None
    strings: list[str]
    frames: list[list[int]]
    stacks: list[list[int]]
    categories: list[str]
    devices: list[Device]
    meta: dict[str, Any] = field(default_factory=dict)
    default_device: int = 0

    # --- the default device ------------------------------------------------------------------
    @property
    def main(self) -> Device:
        """The default device."""
        return self.devices[self.default_device]

    @property
    def device(self) -> str:
        """Name of the default device."""
        return self.main.name

    @property
    def n_events(self) -> int:
        """Events of the default device."""
        return self.main.n_events

    @property
    def time_us(self) -> np.ndarray:
        """Event times of the default device."""
        return self.main.time_us

    @property
    def allocs(self) -> dict[str, np.ndarray]:
        """Allocation columns of the default device."""
        return self.main.allocs

    @property
    def dropped(self) -> int:
        """Events dropped before the trace (default device)."""
        return self.main.dropped

    @property
    def n_allocs(self) -> int:
        """Allocations of the default device."""
        return self.main.n_allocs

    def timeline(self) -> np.ndarray:
        """:meth:`Device.timeline` of the default device."""
        return self.main.timeline()

    def peak(self) -> tuple[int, int]:
        """:meth:`Device.peak` of the default device."""
        return self.main.peak()

    def peak_bytes(self) -> int:
        """:meth:`Device.peak_bytes` of the default device."""
        return self.main.peak_bytes()

    def alive_at(self, event: int) -> np.ndarray:
        """:meth:`Device.alive_at` of the default device."""
        return self.main.alive_at(event)

    # --- tables -------------------------------------------------------------------------------
    def frame(self, frame_id: int) -> Frame:
        """(filename, line, name) of a frame id."""
        f = self.frames[frame_id]
        return self.strings[f[0]], int(f[1]), self.strings[f[2]]

    def stack_frames(self, stack_id: int) -> list[Frame]:
        """The frames of a stack id, innermost first ([] for -1)."""
        return [] if stack_id < 0 else [self.frame(f) for f in self.stacks[stack_id]]

    def device_index(self, name: str) -> int:
        """Index of a device by name (``cuda:1``, or ``1``); ValueError names the devices."""
        names = [d.name for d in self.devices]
        for candidate in (name, f"cuda:{name}"):
            if candidate in names:
                return names.index(candidate)
        raise ValueError(f"no device {name!r} in this snapshot (devices: {', '.join(names) or 'none'})")

    def choose_default(self) -> int:
        """The out-of-memory device, else the one with the largest peak (ties: the lowest index)."""
        for i, d in enumerate(self.devices):
            if d.ooms:
                return i
        peaks = [d.peak_bytes() for d in self.devices]
        return int(np.argmax(peaks)) if peaks else 0



def _running(cols: dict[str, np.ndarray], n: int, base: int) -> np.ndarray:
    s, e, size = cols["start"], cols["end"], cols["size"]
    up = np.zeros(n + 1, dtype=np.int64)
    live = s >= 0
    up += sum_by(s[live], size[live], n + 1)
    ended = e >= 0
    up -= sum_by(e[ended], size[ended], n + 1)
    return base + np.cumsum(up[:-1])


def _alive(cols: dict[str, np.ndarray], event: int) -> np.ndarray:
    return np.nonzero((cols["start"] <= event) & ((cols["end"] < 0) | (cols["end"] > event)))[0]
