"""The one safe snapshot format (JSON, gzip) shared by the CUDA capture, the recorder and the viewer.

A snapshot holds, per device, a list of *allocations* (intervals on that device's event axis:
``start``/``end`` are event indices, -1 meaning before the first event / still alive at the
end) and the time of each event, plus tables shared by all devices that deduplicate strings,
frames and stacks. Version 2 (this one) stores every device; version 1 files (one device)
are still read. Integer columns are stored as little-endian base64 typed arrays, so ten
million events stay small and decode fast in Python and in the browser::

    {"schema": "tbmem.snapshot", "version": 2, "source": "cuda", "kind": "snapshot", "rank": 0,
     "step": 12, "t0_unix": 1757253255.2 | null, "strings": [...], "frames": [[file, line, name]],
     "stacks": [[frame ids, innermost first]], "categories": ["python code", ...],
     "default_device": 0, "meta": {...},
     "devices": [{"device": "cuda:0", "n_events": 4, "has_time": true, "dropped": 0,
                  "reserved_bytes": 2097152 | null, "segments": 1, "time_us": COLUMN,
                  "allocs": {"start", "end", "size", "category", "stack", "addr", "flags": COLUMN},
                  "ooms": [{"event", "requested_bytes", "free_bytes", "time_us"}],
                  "markers": [{"event", "label", "kind"}]}]}

``COLUMN`` is ``{"dtype": "<i4", "b64": "..."}`` (``<f8`` for values past 32 bits, exact up
to 2**53). ``time_us`` is relative to ``t0_unix`` (null: the trace has no clock, and
``has_time`` is false). Allocation ``flags``: 1 = its stack was recorded at the free, not
the allocation; 2 = its free was requested but not completed when the snapshot was taken.
Nothing in this format is executable, and :func:`from_json` validates every index.

Example:
    >>> from tbmem.snapshot.schema import SnapshotBuilder, from_json, to_json
    >>> b = SnapshotBuilder(source="dispatch", device="cpu")
    >>> a = b.alloc(4096, category="activation", stack=[("train.py", 12, "forward")], time_us=0)
    >>> b.free(a, time_us=5)
    >>> snap = from_json(to_json(b.build(kind="snapshot", step=3)))
    >>> snap.n_events, snap.peak_bytes(), [d.name for d in snap.devices]
    (2, 4096, ['cpu'])
"""

from __future__ import annotations

import base64
import gzip
import json
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np

from tbmem.snapshot.shape import check_document

__all__ = ["SCHEMA", "VERSION", "NotASnapshot", "Snapshot", "Device", "SnapshotBuilder", "Frame", "to_json", "from_json",
           "read_json_gz", "encode_json_gz", "encode_column", "decode_column", "FLAG_FREE_SITE",
           "FLAG_PENDING_FREE", "COLUMNS"]

SCHEMA = "tbmem.snapshot"
VERSION = 2
Frame = tuple[str, int, str]  # (filename, line, function name)
COLUMNS = ("start", "end", "size", "category", "stack", "addr", "flags")
FLAG_FREE_SITE = 1
FLAG_PENDING_FREE = 2


def _sum_by(index: np.ndarray, values: np.ndarray, length: int) -> np.ndarray:
    """Exact int64 sums of ``values`` grouped by ``index`` (0 <= index < length)."""
    out = np.zeros(length, dtype=np.int64)
    if index.shape[0] == 0:
        return out
    if np.bincount(index, minlength=length).max() <= 1:  # each event starts or ends one allocation
        out[index] = values
        return out
    order = np.argsort(index, kind="stable")
    idx, vals = index[order], values[order]
    starts = np.flatnonzero(np.concatenate(([True], idx[1:] != idx[:-1])))
    out[idx[starts]] = np.add.reduceat(vals, starts)
    return out


@dataclass
class Device:
    """One device's allocations and events."""

    name: str
    time_us: np.ndarray
    allocs: dict[str, np.ndarray]
    has_time: bool = True
    dropped: int = 0
    reserved_bytes: int | None = None
    segments: int = 0
    ooms: list[dict[str, Any]] = field(default_factory=list)
    markers: list[dict[str, Any]] = field(default_factory=list)

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
        a = self.allocs
        s, e, size = a["start"], a["end"], a["size"]
        n = self.n_events
        # integer sums: bincount would go through float64, inexact past 2**53 bytes in total
        up = np.zeros(n + 1, dtype=np.int64)
        live = s >= 0
        up += _sum_by(s[live], size[live], n + 1)
        ended = e >= 0
        up -= _sum_by(e[ended], size[ended], n + 1)
        return self.baseline_bytes() + np.cumsum(up[:-1])

    def peak(self) -> tuple[int, int]:
        """(event, bytes) at the highest point; (-1, baseline) when there are no events."""
        if self.n_events == 0:
            return -1, int(self.allocs["size"][self.allocs["end"] < 0].sum())
        tl = self.timeline()
        i = int(np.argmax(tl))
        return i, int(tl[i])

    def peak_bytes(self) -> int:
        """Highest bytes alive."""
        return self.peak()[1]

    def final_bytes(self) -> int:
        """Bytes alive after the last event (when the snapshot was taken)."""
        return int(self.allocs["size"][self.allocs["end"] < 0].sum())

    def alive_at(self, event: int) -> np.ndarray:
        """Indices of the allocations alive right after ``event``."""
        a = self.allocs
        return np.nonzero((a["start"] <= event) & ((a["end"] < 0) | (a["end"] > event)))[0]


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


class SnapshotBuilder:
    """Accumulates allocations in event order and builds a :class:`Snapshot` (one device per
    distinct ``device`` passed to :meth:`alloc`).

    Args:
        source: ``"dispatch"``, ``"allocator"`` (tbmem's CPU allocator recorder) or ``"cuda"``
            (what captured it).
        device: Default device name, e.g. ``"cpu"``.
    """

    def __init__(self, *, source: str, device: str) -> None:
        self.source = source
        self.device = device
        self.strings: list[str] = []
        self._string_ids: dict[str, int] = {}
        self.frames: list[list[int]] = []
        self._frame_ids: dict[Frame, int] = {}
        self.stacks: list[list[int]] = []
        self._stack_ids: dict[tuple[int, ...], int] = {}
        self.categories: list[str] = []
        self._category_ids: dict[str, int] = {}
        self.cols: dict[str, list[int]] = {c: [] for c in (*COLUMNS, "device")}
        self.time_us: list[int] = []
        self.dropped = 0
        self.devices: list[str] = []
        self._device_ids: dict[str, int] = {}
        self.markers: list[tuple[int, str, str]] = []  # (event index it precedes, label, kind)
        # wall clock minus the event clock (time.perf_counter), so that t0_unix is the first event's
        self.clock_offset_us = time.time() * 1e6 - time.perf_counter() * 1e6
        self.has_time = False
        self.meta: dict[str, Any] = {}

    def _string(self, s: str) -> int:
        sid = self._string_ids.get(s)
        if sid is None:
            sid = self._string_ids[s] = len(self.strings)
            self.strings.append(s)
        return sid

    def frame_id(self, frame: Frame) -> int:
        """Intern one (filename, line, name) frame."""
        fid = self._frame_ids.get(frame)
        if fid is None:
            fid = self._frame_ids[frame] = len(self.frames)
            self.frames.append([self._string(str(frame[0])), int(frame[1]), self._string(str(frame[2]))])
        return fid

    def stack_id(self, frames: Iterable[Frame] | None) -> int:
        """Intern a stack (innermost frame first); -1 for no stack."""
        if not frames:
            return -1
        key = tuple(self.frame_id(f) for f in frames)
        sid = self._stack_ids.get(key)
        if sid is None:
            sid = self._stack_ids[key] = len(self.stacks)
            self.stacks.append(list(key))
        return sid

    def category_id(self, name: str) -> int:
        """Intern a category name."""
        cid = self._category_ids.get(name)
        if cid is None:
            cid = self._category_ids[name] = len(self.categories)
            self.categories.append(name)
        return cid

    def device_id(self, name: str) -> int:
        """Intern a device name."""
        did = self._device_ids.get(name)
        if did is None:
            did = self._device_ids[name] = len(self.devices)
            self.devices.append(name)
        return did

    def _event(self, time_us: int | None) -> int:
        if time_us is not None:
            self.has_time = True
        self.time_us.append(int(time_us) if time_us is not None else 0)
        return len(self.time_us) - 1

    def alloc(self, size: int, *, category: str = "unknown", stack: Sequence[Frame] | None = None,
              time_us: int | None = None, addr: int = 0, preexisting: bool = False,
              stack_id: int | None = None, device: str | None = None, flags: int = 0) -> int:
        """Record an allocation; returns its index (pass it to :meth:`free`)."""
        c = self.cols
        c["start"].append(-1 if preexisting else self._event(time_us))
        c["end"].append(-1)
        c["size"].append(int(size))
        c["category"].append(self.category_id(category))
        c["stack"].append(stack_id if stack_id is not None else self.stack_id(stack))
        c["addr"].append(int(addr))
        c["flags"].append(int(flags))
        c["device"].append(self.device_id(device or self.device))
        return len(c["size"]) - 1

    def free(self, index: int, *, time_us: int | None = None) -> None:
        """Record the free of allocation ``index``."""
        self.cols["end"][index] = self._event(time_us)

    def mark(self, label: str, *, kind: str = "step", time_us: int | None = None) -> None:
        """A marker (a step boundary, a phase) before the next event."""
        if time_us is not None:
            self.has_time = True
        self.markers.append((len(self.time_us), str(label), str(kind)))

    def build(self, *, kind: str, step: int, rank: int = 0) -> Snapshot:
        """The snapshot of everything recorded, one device per device seen."""
        t = np.asarray(self.time_us, dtype=np.int64)
        t0_unix: float | None = None
        if t.size and self.has_time:
            t0_unix = (float(t[0]) + self.clock_offset_us) / 1e6
            t = np.maximum.accumulate(t - t[0])  # clocks of different threads may step back
        cols = {k: np.asarray(v, dtype=np.int64) for k, v in self.cols.items()}
        names = self.devices or [self.device]
        devices = []
        for did, name in enumerate(names):
            mine = cols["device"] == did
            a = {k: cols[k][mine] for k in COLUMNS}
            used = np.unique(np.concatenate([a["start"][a["start"] >= 0], a["end"][a["end"] >= 0]]))
            a["start"] = np.where(a["start"] >= 0, np.searchsorted(used, a["start"]), -1)
            a["end"] = np.where(a["end"] >= 0, np.searchsorted(used, a["end"]), -1)
            markers = [{"event": int(min(np.searchsorted(used, ev), max(used.shape[0] - 1, 0))),
                        "label": label, "kind": mk} for ev, label, mk in self.markers]
            devices.append(Device(name=name, time_us=t[used] if t.size else np.zeros(0, dtype=np.int64),
                                  allocs=a, has_time=self.has_time, dropped=int(self.dropped),
                                  markers=markers))
        snap = Snapshot(source=self.source, kind=kind, rank=int(rank), step=int(step), t0_unix=t0_unix,
                        strings=list(self.strings), frames=[list(f) for f in self.frames],
                        stacks=[list(s) for s in self.stacks], categories=list(self.categories) or ["unknown"],
                        devices=devices, meta=dict(self.meta))
        snap.default_device = snap.choose_default()
        return snap


# --- columns -----------------------------------------------------------------------------------
def _dtype_for(arr: np.ndarray) -> str:
    if arr.size == 0:
        return "<i4"
    lo, hi = int(arr.min()), int(arr.max())
    if -2**7 <= lo and hi < 2**7:
        return "<i1"
    if -2**15 <= lo and hi < 2**15:
        return "<i2"
    if -2**31 <= lo and hi < 2**31:
        return "<i4"
    if -2**53 <= lo and hi <= 2**53:
        return "<f8"
    raise ValueError("a column holds values beyond 2**53, which the format cannot store exactly")


def encode_column(arr: np.ndarray, *, compress: bool = False) -> dict[str, str]:
    """A column as ``{"dtype", "b64"}`` (or ``"z"``: zlib-compressed, for the viewer page)."""
    dtype = _dtype_for(arr)
    raw = np.ascontiguousarray(arr, dtype=dtype).tobytes()
    if compress:
        import zlib

        return {"dtype": dtype, "z": base64.b64encode(zlib.compress(raw, 1)).decode("ascii")}
    return {"dtype": dtype, "b64": base64.b64encode(raw).decode("ascii")}


def decode_column(doc: Any, name: str, length: int | None = None) -> np.ndarray:
    """The int64 array of an encoded column (or a plain list of integers)."""
    if isinstance(doc, list):
        try:
            arr = np.asarray(doc, dtype=np.int64)
        except (TypeError, ValueError, OverflowError) as exc:
            raise ValueError(f"snapshot field {name} must hold integers") from exc
        if arr.ndim != 1:
            raise ValueError(f"snapshot field {name} must be a flat list of integers")
    elif isinstance(doc, dict) and doc.get("dtype") in ("<i1", "<i2", "<i4", "<f8") and "b64" in doc:
        try:
            raw = base64.b64decode(doc["b64"], validate=True)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"snapshot field {name} is not valid base64") from exc
        width = int(doc["dtype"][2])
        if len(raw) % width:
            raise ValueError(f"snapshot field {name} has a partial value")
        arr = np.frombuffer(raw, dtype=doc["dtype"])
        if doc["dtype"] == "<f8":
            if not np.all(np.isfinite(arr)) or np.any(np.abs(arr) > 2**53) or np.any(arr != np.round(arr)):
                raise ValueError(f"snapshot field {name} holds values that are not exact integers")
        arr = arr.astype(np.int64)
    else:
        raise ValueError(f"snapshot field {name} must be a list of integers or an encoded column")
    if length is not None and arr.shape[0] != length:
        raise ValueError(f"snapshot field {name} has {arr.shape[0]} values, expected {length}")
    return arr


# --- JSON ----------------------------------------------------------------------------------------
def _device_json(d: Device, compress: bool) -> dict[str, Any]:
    return {"device": d.name, "n_events": d.n_events, "has_time": bool(d.has_time), "dropped": int(d.dropped),
            "reserved_bytes": d.reserved_bytes, "segments": int(d.segments),
            "time_us": encode_column(d.time_us, compress=compress),
            "allocs": {k: encode_column(d.allocs[k], compress=compress) for k in COLUMNS},
            "ooms": d.ooms, "markers": d.markers}


def to_json(snap: Snapshot, *, compress: bool = False) -> dict[str, Any]:
    """The JSON-ready dict of a snapshot (the on-disk format; ``compress`` for the viewer page)."""
    return {
        "schema": SCHEMA, "version": VERSION, "source": snap.source, "kind": snap.kind, "rank": snap.rank,
        "step": snap.step, "t0_unix": snap.t0_unix, "strings": snap.strings, "frames": snap.frames,
        "stacks": snap.stacks, "categories": snap.categories, "default_device": snap.default_device,
        "meta": snap.meta, "devices": [_device_json(d, compress) for d in snap.devices],
    }


def _int(value: Any, name: str, *, lo: int | None = None, none: bool = False) -> Any:
    if none and value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or (lo is not None and value < lo):
        raise ValueError(f"snapshot field {name} must be an integer" + (f" >= {lo}" if lo is not None else ""))
    return value


def _device_from_json(raw: Any, n_cat: int, n_stacks: int, i: int) -> Device:
    if not isinstance(raw, dict):
        raise ValueError(f"snapshot field devices[{i}] must be an object")
    n = _int(raw.get("n_events", 0), f"devices[{i}].n_events", lo=0)
    time_us = decode_column(raw.get("time_us", []), f"devices[{i}].time_us", n)
    allocs_raw = raw.get("allocs")
    if not isinstance(allocs_raw, dict):
        raise ValueError(f"snapshot field devices[{i}].allocs is missing")
    sizes = decode_column(allocs_raw.get("size", []), f"devices[{i}].allocs.size")
    m = sizes.shape[0]
    a = {c: decode_column(allocs_raw[c], f"devices[{i}].allocs.{c}", m) if c in allocs_raw
         else np.zeros(m, dtype=np.int64) for c in COLUMNS}
    if m and (a["start"].min() < -1 or a["start"].max() >= n or a["end"].min() < -1 or a["end"].max() >= n
              or a["size"].min() < 0 or a["category"].min() < 0 or a["category"].max() >= max(n_cat, 1)
              or a["stack"].min() < -1 or a["stack"].max() >= n_stacks):
        raise ValueError(f"snapshot columns devices[{i}].allocs.* hold out-of-range indices")
    ooms = raw.get("ooms", [])
    markers = raw.get("markers", [])
    if not isinstance(ooms, list) or not all(isinstance(o, dict) for o in ooms):
        raise ValueError(f"snapshot field devices[{i}].ooms must be a list of objects")
    if not isinstance(markers, list) or not all(
            isinstance(mk, dict) and isinstance(mk.get("label"), str) and isinstance(mk.get("event"), int)
            and -1 <= mk["event"] < max(n, 1) for mk in markers):
        raise ValueError(f"snapshot field devices[{i}].markers must be [{{event, label, kind}}] within the events")
    return Device(name=str(raw.get("device", f"device{i}")), time_us=time_us, allocs=a,
                  has_time=bool(raw.get("has_time", True)), dropped=_int(raw.get("dropped", 0), "dropped", lo=0),
                  reserved_bytes=_int(raw.get("reserved_bytes"), "reserved_bytes", lo=0, none=True),
                  segments=_int(raw.get("segments", 0), "segments", lo=0), ooms=ooms, markers=markers)


def _v1_to_v2(doc: dict[str, Any]) -> dict[str, Any]:
    """A version 1 document (one device, plain integer lists) in version 2's shape."""
    meta = doc.get("meta", {}) if isinstance(doc.get("meta"), dict) else {}
    allocs = doc.get("allocs")
    if not isinstance(allocs, dict):
        raise ValueError("snapshot field allocs is missing")
    n = doc.get("n_events", len(doc.get("time_us", []) or []))
    oom = [{"event": -1, "requested_bytes": o.get("size"), "free_bytes": o.get("device_free"), "time_us": None}
           for o in meta.get("oom_events", []) if isinstance(o, dict)]
    dev = {"device": doc.get("device", ""), "n_events": n, "has_time": True, "dropped": doc.get("dropped", 0),
           "reserved_bytes": meta.get("reserved_bytes"), "segments": meta.get("segments", 0),
           "time_us": doc.get("time_us", []), "allocs": dict(allocs), "ooms": oom, "markers": []}
    out = dict(doc)
    out["devices"] = [dev]
    out["t0_unix"] = doc.get("t0_unix")
    return out


class NotASnapshot(ValueError):
    """The file or document is something else than a tbmem snapshot (not UTF-8, another schema)."""


def from_json(doc: Any) -> Snapshot:
    """Validate a parsed JSON document and decode it; ValueError names what is wrong."""
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise NotASnapshot(f"not a {SCHEMA} document")
    check_document(doc)  # the fields used as they are (tbmem.snapshot.shape)
    if doc.get("version") == 1:
        doc = _v1_to_v2(doc)
    elif doc.get("version") != VERSION:
        raise ValueError(f"unsupported {SCHEMA} version {doc.get('version')!r} (this tbmem reads 1 and {VERSION})")
    strings = doc.get("strings", [])
    if not isinstance(strings, list) or not all(isinstance(s, str) for s in strings):
        raise ValueError("snapshot field strings must be a list of strings")
    frames = doc.get("frames", [])
    if not isinstance(frames, list) or not all(
            isinstance(f, list) and len(f) == 3 and all(isinstance(x, int) and not isinstance(x, bool) for x in f)
            and 0 <= f[0] < len(strings) and 0 <= f[2] < len(strings) for f in frames):
        raise ValueError("snapshot field frames must be [string id, line, string id] triples")
    stacks = doc.get("stacks", [])
    if not isinstance(stacks, list) or not all(
            isinstance(s, list) and all(isinstance(x, int) and 0 <= x < len(frames) for x in s) for s in stacks):
        raise ValueError("snapshot field stacks must be lists of frame ids")
    categories = [str(c) for c in doc.get("categories", [])] or ["unknown"]
    raw_devices = doc.get("devices")
    if not isinstance(raw_devices, list):
        raise ValueError("snapshot field devices must be a list")
    devices = [_device_from_json(d, len(categories), len(stacks), i) for i, d in enumerate(raw_devices)]
    if not devices:
        devices = [Device(name="", time_us=np.zeros(0, dtype=np.int64),
                          allocs={c: np.zeros(0, dtype=np.int64) for c in COLUMNS})]
    t0 = doc.get("t0_unix")
    if t0 is not None and (isinstance(t0, bool) or not isinstance(t0, (int, float))):
        raise ValueError("snapshot field t0_unix must be a number or null")
    meta = doc.get("meta", {})
    default = doc.get("default_device", 0)
    if isinstance(default, bool) or not isinstance(default, int) or not 0 <= default < len(devices):
        raise ValueError("snapshot field default_device is not one of its devices")
    return Snapshot(source=str(doc.get("source", "")), kind=str(doc.get("kind", "snapshot")),
                    rank=_int(doc.get("rank", 0), "rank"), step=_int(doc.get("step", 0), "step"),
                    t0_unix=None if t0 is None else float(t0), strings=list(strings), frames=frames,
                    stacks=stacks, categories=categories, devices=devices,
                    meta=meta if isinstance(meta, dict) else {}, default_device=default)


def encode_json_gz(snap: Snapshot) -> bytes:
    """The gzip-compressed compact JSON bytes of a snapshot."""
    text = json.dumps(to_json(snap), separators=(",", ":"), ensure_ascii=False)
    return gzip.compress(text.encode("utf-8"), compresslevel=6, mtime=0)


def read_json_gz(path: str, *, max_bytes: int | None = None, max_ratio: float | None = None,
                 fileobj: Any = None) -> Snapshot:
    """Load and validate a ``.json.gz`` (or plain ``.json``) snapshot file.

    ``max_bytes``/``max_ratio`` bound the decompressed size (whole or per compressed byte past
    64 MiB); a file over either is refused with ValueError before it is parsed. ``fileobj``: the
    file already open (binary, at its start); ``path`` then only names it.
    """
    import os

    from tbmem.snapshot.pickle_rows import Limits

    limits = Limits()
    max_bytes = limits.max_decompressed_bytes if max_bytes is None else max_bytes
    max_ratio = limits.max_gzip_ratio if max_ratio is None else max_ratio
    size = os.fstat(fileobj.fileno()).st_size if fileobj is not None else os.path.getsize(path)
    if not str(path).endswith(".gz"):
        if size > max_bytes:
            raise ValueError(f"{path} is {size:,} bytes, over the limit of {max_bytes:,}")
        if fileobj is not None:
            data = fileobj.read(max_bytes + 1)
        else:
            with open(path, "rb") as fh:
                data = fh.read()
    else:
        allowed = min(max_bytes, max(64 * 2**20, int(size * max_ratio)))
        chunks, total = [], 0
        with gzip.GzipFile(path, "rb", fileobj=fileobj) as fh:
            while True:
                chunk = fh.read(1 << 20)
                if not chunk:
                    break
                total += len(chunk)
                if total > allowed:
                    raise ValueError(
                        f"{path} decompresses to more than {allowed:,} bytes ({size:,} on disk, over "
                        f"{max_ratio:g}x its size or {max_bytes:,} bytes): refusing a likely gzip bomb")
                chunks.append(chunk)
        data = b"".join(chunks)
    try:
        doc = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise NotASnapshot(f"{path} is not UTF-8 JSON") from exc
    return from_json(doc)
