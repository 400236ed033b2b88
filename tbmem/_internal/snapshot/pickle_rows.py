"""Trace events as integer columns: what the streaming pickle reader produces instead of dicts.

:class:`EventRows` stores one row per allocator event (action code, address, size, time,
stack id, metadata id) in numpy blocks, plus the tables the rows refer to: frames
``(filename, line, name)``, stacks (tuples of frame ids, innermost first) and strings.
:class:`Limits` bounds what one file may make the reader hold, and
:class:`SnapshotRefused` says which limit a file broke (or how it is malformed).

Example:
    >>> from tbmem._internal.snapshot.pickle_rows import EventRows, Limits
    >>> rows = EventRows(Limits())
    >>> rows.add_dict({"action": "alloc", "addr": 64, "size": 512, "time_us": 3,
    ...                "frames": [{"filename": "train.py", "line": 9, "name": "step"}]})
    >>> rows.count, rows.column("size").tolist(), rows.frames
    (1, [512], [('train.py', 9, 'step')])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Limits", "SnapshotRefused", "EventRows", "TraceRef", "StackRef", "ACTIONS", "ACTION_CODE",
           "NO_TIME", "EVENT", "ROW", "Memo", "POOL_ACTIONS"]

#: Allocator actions in the order of their codes in :class:`EventRows` (0 = anything else).
ACTIONS = ("other", "alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
           "segment_map", "segment_unmap", "snapshot", "oom")
ACTION_CODE = {name: i for i, name in enumerate(ACTIONS)}
#: ``time`` of an event that has no ``time_us``.
NO_TIME = np.iinfo(np.int64).min
_COLUMNS = {"action": np.int8, "addr": np.int64, "size": np.int64, "time": np.int64, "stack": np.int32,
            "meta": np.int32}
_SEGMENT_ACTIONS = tuple(ACTION_CODE[a] for a in ("segment_alloc", "segment_free", "segment_map", "segment_unmap"))
#: The events whose ``pool_id`` is kept: a segment's memory pool, the pool an out-of-memory request was for.
POOL_ACTIONS = (*_SEGMENT_ACTIONS, ACTION_CODE["oom"])
_KNOWN_EVENT_KEYS = {"action", "addr", "size", "stream", "time_us", "frames", "device_free",
                     "compile_context", "user_metadata", "pool_id"}


class SnapshotRefused(ValueError):
    """The file is not read: it is malformed, truncated, or over one of the reader's limits."""


@dataclass(frozen=True, kw_only=True)
class Limits:
    """What one snapshot file may make the reader hold.

    Attributes:
        max_string_bytes: Longest string or bytes value.
        max_int_bytes: Longest integer encoding (16 bytes: up to 2**127).
        max_objects: Containers and strings kept outside the trace rows.
        max_container: Items in one list, tuple or dict outside the trace rows.
        max_events: Trace events over all devices.
        max_bytes: Largest allocation, segment or free-memory value (2**48 = 256 TiB); larger
            sizes are not memory, and sums of them would overflow 64-bit counters.
        max_decompressed_bytes: Decompressed size of a gzip JSON file.
        max_gzip_ratio: Decompressed over compressed size of a gzip JSON file beyond 64 MiB
            (whitespace bombs compress 1000:1; snapshots less than 20:1).
    """

    max_string_bytes: int = 64 * 2**20
    max_int_bytes: int = 16
    max_objects: int = 30_000_000
    max_container: int = 50_000_000
    max_events: int = 500_000_000
    max_bytes: int = 2**48
    max_decompressed_bytes: int = 16 * 2**30
    max_gzip_ratio: float = 50.0

    def __post_init__(self) -> None:
        for name in ("max_string_bytes", "max_int_bytes", "max_objects", "max_container", "max_events",
                     "max_bytes", "max_decompressed_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Limits.{name} must be an integer >= 1, got {value!r}")
        if isinstance(self.max_gzip_ratio, bool) or not isinstance(self.max_gzip_ratio, (int, float)) \
                or self.max_gzip_ratio <= 1:
            raise ValueError(f"Limits.max_gzip_ratio must be a number > 1, got {self.max_gzip_ratio!r}")


class TraceRef:
    """A device trace read as rows: ranges of row indices (``range`` objects, which no pickle of plain
    data holds) and leftover items (event dicts built by the general interpreter), in trace order."""

    __slots__ = ("items",)

    def __init__(self) -> None:
        self.items: list[Any] = []

    def add_rows(self, start: int, n: int) -> None:
        """Append the rows ``start .. start + n - 1``."""
        last = self.items[-1] if self.items else None
        if type(last) is range and last.stop == start:
            self.items[-1] = range(last.start, start + n)
        elif n > 0:
            self.items.append(range(start, start + n))


class _Row:
    """Stands for a trace event turned into a row, among the items of a list being built."""

    __slots__ = ()


ROW = _Row()


class StackRef:
    """A frames list replaced by its stack id (kept in the memo for later references to the list)."""

    __slots__ = ("sid",)

    def __init__(self, sid: int) -> None:
        self.sid = sid


class _Event:
    """Memo entry of an event turned into a row; a second reference to it is refused."""

    __slots__ = ()


EVENT = _Event()


class Memo:
    """The pickle memo: per index, the position of its object in a table of distinct objects (int32).

    A 10M-event trace stores about 30M memo entries (each event dict, its inline strings, its
    new frames lists): as positions they take 4 bytes each, and the vectorised parser appends a
    run's entries as one array (:meth:`extend_slots`) instead of one Python object each.
    """

    def __init__(self) -> None:
        self._slots = np.zeros(1 << 12, dtype=np.int32)
        self._n = 0
        self.objects: list[Any] = [EVENT]  # slot 0: an event turned into a row
        self._by_id: dict[int, int] = {id(EVENT): 0}  # the objects list keeps every object alive

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, idx: int) -> Any:
        if not 0 <= idx < self._n:
            raise IndexError(idx)
        return self.objects[self._slots[idx]]

    def __setitem__(self, idx: int, value: Any) -> None:
        if not 0 <= idx < self._n:
            raise IndexError(idx)
        self._slots[idx] = self.slot(value)

    def slot(self, value: Any) -> int:
        """The slot of ``value`` (added to the table the first time it is seen)."""
        k = self._by_id.get(id(value))
        if k is None:
            k = self._by_id[id(value)] = len(self.objects)
            self.objects.append(value)
        return k

    def _grow(self, n: int) -> None:
        if self._n + n > self._slots.shape[0]:
            bigger = np.zeros(max(2 * self._slots.shape[0], self._n + n), dtype=np.int32)
            bigger[:self._n] = self._slots[:self._n]
            self._slots = bigger

    def append(self, value: Any) -> None:
        """Store the next entry."""
        self._grow(1)
        self._slots[self._n] = self.slot(value)
        self._n += 1

    def extend(self, values: Any) -> None:
        """Store the next entries."""
        for v in values:
            self.append(v)

    def extend_slots(self, slots: np.ndarray) -> None:
        """Store the next entries given as slots (of objects already in the table)."""
        self._grow(slots.shape[0])
        self._slots[self._n:self._n + slots.shape[0]] = slots
        self._n += slots.shape[0]


class EventRows:
    """Trace events as integer columns, with the frame, stack and string tables they refer to.

    Columns: ``action`` (code into :data:`ACTIONS`), ``addr`` (``device_free`` for ``oom``),
    ``size``, ``time`` (:data:`NO_TIME` when absent), ``stack`` (index into :attr:`stacks`, -1
    none), ``meta`` (index into :attr:`strings` of a non-empty ``user_metadata``, -1 none).
    The ``stream`` of segment events (the allocator's segments belong to one stream) is kept
    in :attr:`streams` by row, not as a column: blocks take their segment's. So is the ``pool_id``
    (torch >= 2.11 writes it on every event: the memory pool, ``(0, 0)`` the default one) of segment
    and ``oom`` events, in :attr:`pools` as an index into :attr:`pool_ids`.
    """

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._blocks: dict[str, list[np.ndarray]] = {c: [] for c in _COLUMNS}
        self._pending: dict[str, list[int]] = {c: [] for c in _COLUMNS}
        self._count = 0
        self.frames: list[tuple[str, int, str]] = []
        self._frame_ids: dict[Any, int] = {}
        self.stacks: list[tuple[int, ...]] = []
        self._stack_ids: dict[tuple[int, ...], int] = {}
        self._list_stacks: dict[int, tuple[Any, int]] = {}
        self.strings: list[str] = []
        self._string_ids: dict[str, int] = {}
        self.extra_keys: set[str] = set()
        self.streams: dict[int, int] = {}
        self.pools: dict[int, int] = {}
        self.pool_ids: list[tuple[int, int]] = []
        self._pool_index: dict[tuple[int, int], int] = {}
        self.trace_refs: dict[int, tuple[list, TraceRef]] = {}

    @property
    def count(self) -> int:
        """Rows so far."""
        return self._count

    def column(self, name: str) -> np.ndarray:
        """One column over all rows (its blocks are joined once and kept joined, not copied again)."""
        self._flush()
        blocks = self._blocks[name]
        if len(blocks) > 1:
            blocks[:] = [np.concatenate(blocks)]
        return blocks[0] if blocks else np.zeros(0, dtype=_COLUMNS[name])

    def _flush(self) -> None:
        if self._pending["action"]:
            for c, dtype in _COLUMNS.items():
                self._blocks[c].append(np.asarray(self._pending[c], dtype=dtype))
                self._pending[c] = []

    # --- tables -----------------------------------------------------------------------------------
    def string_id(self, s: str) -> int:
        """Intern a string."""
        sid = self._string_ids.get(s)
        if sid is None:
            sid = self._string_ids[s] = len(self.strings)
            self.strings.append(s)
        return sid

    def frame_id(self, f: Any) -> int:
        """Frame id of a frame dict ``{"filename", "line", "name"}``."""
        if isinstance(f, dict):
            key: Any = (f.get("filename"), f.get("line"), f.get("name"))
        else:
            key = (None, None, f"<{type(f).__name__} in a frames list>")
        fid = self._frame_ids.get(key)
        if fid is None:
            filename, line, name = key
            line = line if isinstance(line, int) and not isinstance(line, bool) and 0 <= line < 2**31 else 0
            fid = self._frame_ids[key] = len(self.frames)
            self.frames.append((filename if isinstance(filename, str) else "??", line,
                                name if isinstance(name, str) else "??"))
        return fid

    def intern_stack(self, key: tuple[int, ...]) -> int:
        """Stack id of a tuple of frame ids."""
        sid = self._stack_ids.get(key)
        if sid is None:
            sid = self._stack_ids[key] = len(self.stacks)
            self.stacks.append(key)
        return sid

    def stack_id(self, frames: Any) -> int:
        """Stack id of a frames value: a list of frame dicts or a :class:`StackRef`; -1 otherwise."""
        if type(frames) is StackRef:
            return frames.sid
        if not isinstance(frames, list):
            return -1
        hit = self._list_stacks.get(id(frames))
        if hit is not None and hit[0] is frames:
            return hit[1]
        sid = self.intern_stack(tuple(self.frame_id(f) for f in frames))
        self._list_stacks[id(frames)] = (frames, sid)  # holding the list keeps its id unique
        return sid

    def pool_index(self, value: Any) -> int:
        """Index into :attr:`pool_ids` of a ``pool_id`` value (a pair of integers, each 0 .. 2**63 - 1);
        -1 for anything else."""
        if type(value) not in (tuple, list) or len(value) != 2:
            return -1
        a, b = value
        if type(a) is not int or type(b) is not int or not (0 <= a < 2**63 and 0 <= b < 2**63):
            return -1
        key = (a, b)
        k = self._pool_index.get(key)
        if k is None:
            k = self._pool_index[key] = len(self.pool_ids)
            self.pool_ids.append(key)
        return k

    # --- rows -------------------------------------------------------------------------------------
    def _grow(self, n: int) -> None:
        if self._count + n > self.limits.max_events:
            raise SnapshotRefused(f"more than {self.limits.max_events:,} trace events (Limits.max_events)")
        self._count += n

    def add(self, action: int, addr: int, size: int, time: int, stack: int, meta: int, stream: int = 0,
            pool: int = -1) -> None:
        """Append one row (``pool``: an index into :attr:`pool_ids`, -1 none)."""
        if action in _SEGMENT_ACTIONS and stream:
            self.streams[self._count] = stream
        if pool >= 0 and action in POOL_ACTIONS:
            self.pools[self._count] = pool
        self._grow(1)
        p = self._pending
        p["action"].append(action)
        p["addr"].append(addr)
        p["size"].append(size)
        p["time"].append(time)
        p["stack"].append(stack)
        p["meta"].append(meta)

    def add_block(self, *, stream: np.ndarray | None = None, pool: np.ndarray | None = None,
                  **cols: np.ndarray) -> None:
        """Append many rows at once (one array per column, equal lengths; ``stream`` and ``pool`` optional)."""
        n = int(cols["action"].shape[0])
        if stream is not None:
            seg = np.flatnonzero(np.isin(cols["action"], _SEGMENT_ACTIONS) & (stream != 0))
            for i, value in zip(seg.tolist(), stream[seg].tolist()):
                self.streams[self._count + i] = value
        if pool is not None:
            kept = np.flatnonzero(np.isin(cols["action"], POOL_ACTIONS) & (pool >= 0))
            for i, value in zip(kept.tolist(), pool[kept].tolist()):
                self.pools[self._count + i] = value
        self._grow(n)
        self._flush()
        for c, dtype in _COLUMNS.items():
            self._blocks[c].append(np.asarray(cols[c], dtype=dtype))

    def add_dict(self, e: Any) -> None:
        """Append the row of an event dict built by the general interpreter."""
        if not isinstance(e, dict):
            raise SnapshotRefused(f"a device trace holds a {type(e).__name__}, not an event dict")
        action = e.get("action")
        code = ACTION_CODE.get(action, 0) if isinstance(action, str) else 0
        t = e.get("time_us")
        meta = e.get("user_metadata")
        self.add(code, _int64(e.get("device_free" if action == "oom" else "addr", 0), "addr"),
                 _int64(e.get("size", 0), "size"), NO_TIME if t is None else _int64(t, "time_us"),
                 self.stack_id(e.get("frames")), self.string_id(meta) if isinstance(meta, str) and meta else -1,
                 _int64(e.get("stream", 0), "stream"), self.pool_index(e.get("pool_id")))
        for k in e:
            if isinstance(k, str) and k not in _KNOWN_EVENT_KEYS and len(self.extra_keys) < 64:
                self.extra_keys.add(k)

    def append_items(self, target: list, items: list, rows_end: int | None = None) -> None:
        """APPENDS of ``items`` to the list ``target``, where :data:`ROW` stands for an event already a
        row: the ``ROW`` items are the rows just before ``rows_end`` (default: the last ones), in order."""
        hit = self.trace_refs.get(id(target))
        n = items.count(ROW)
        if hit is None and not n:
            if len(target) + len(items) > self.limits.max_container:
                raise SnapshotRefused(f"a list of more than {self.limits.max_container:,} items")
            target.extend(items)
            return
        if hit is None:
            # the first events of a device trace turned into rows: from now on the list's items
            # are kept in a TraceRef (the list object stays, empty, where the file put it)
            ref = TraceRef()
            ref.items.extend(target)
            target.clear()
            self.trace_refs[id(target)] = (target, ref)
        else:
            ref = hit[1]
        row = (self.count if rows_end is None else rows_end) - n
        if n == len(items):
            ref.add_rows(row, n)
            return
        for x in items:
            if x is ROW:
                ref.add_rows(row, 1)
                row += 1
            else:
                ref.items.append(x)

    def rows_of(self, trace: Any) -> np.ndarray:
        """Row indices of one device trace (a list of event dicts, or one read as rows), in order."""
        hit = self.trace_refs.get(id(trace))
        if hit is not None and hit[0] is trace:
            trace = hit[1]
        if isinstance(trace, TraceRef):
            parts: list[np.ndarray] = []
            for item in trace.items:
                if type(item) is range:
                    parts.append(np.arange(item.start, item.stop, dtype=np.int64))
                else:
                    parts.append(np.array([self.count], dtype=np.int64))
                    self.add_dict(item)
            if len(parts) == 1:
                return parts[0]
            return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        if isinstance(trace, list):
            start = self.count
            for e in trace:
                self.add_dict(e)
            return np.arange(start, self.count, dtype=np.int64)
        raise SnapshotRefused(f"a device trace is a {type(trace).__name__}, not a list")


def _int64(value: Any, name: str) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise SnapshotRefused(f"event field {name} is a {type(value).__name__}, not an integer")
    if not -(2 ** 63) <= value < 2 ** 63:  # as the C runs read them: int64, its least value included
        raise SnapshotRefused(f"event field {name} = {value} does not fit in 64 bits")
    return value
