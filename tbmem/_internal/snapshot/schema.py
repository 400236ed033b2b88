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
                  "allocs": {"start", "end", "size", "category", "stack", "addr", "flags",
                             "freereq", "round": COLUMN},
                  "segs": {"addr", "size", "start", "end", "stream", "pool", "stack", "flags": COLUMN},
                  "streams": [stream id], "pools": [[int, int]],
                  "ooms": [{"event", "requested_bytes", "free_bytes", "time_us"}],
                  "markers": [{"event", "label", "kind"}]}]}

``COLUMN`` is ``{"dtype": "<i4", "b64": "..."}`` (``<f8`` for values past 32 bits, exact up
to 2**53). ``time_us`` is relative to ``t0_unix`` (null: the trace has no clock, and
``has_time`` is false). Allocation ``flags``: 1 = its stack was recorded at the free, not
the allocation; 2 = its free was requested but not completed when the snapshot was taken.
``freereq`` is the event of an allocation's ``free_requested`` (-1: none, or not known) and
``round`` the allocator's rounding (its block's size minus the requested ``size``); files
without them read as -1 and 0. ``segs`` (optional; absent where the capture has no allocator
segments) holds the *segment pieces*: device memory reserved from ``start`` to ``end`` at
``addr`` (one per ``cudaMalloc``, or per mapped range of an expandable segment), with the
index of its stream and memory pool, the stack of its allocation and flags (1 expandable,
2 small pool, 4 large pool). Nothing in this format is executable, and :func:`from_json` validates every index.

Example:
    >>> from tbmem._internal.snapshot.schema import SnapshotBuilder, from_json, to_json
    >>> b = SnapshotBuilder(source="dispatch", device="cpu")
    >>> a = b.alloc(4096, category="activation", stack=[("train.py", 12, "forward")], time_us=0)
    >>> b.free(a, time_us=5)
    >>> snap = from_json(to_json(b.build(kind="snapshot", step=3)))
    >>> snap.n_events, snap.peak_bytes(), [d.name for d in snap.devices]
    (2, 4096, ['cpu'])
"""

from __future__ import annotations

import gzip
import json
import time
from typing import Any, Iterable, Sequence

import numpy as np

from tbmem._internal.snapshot.columns import decode_column, encode_column
from tbmem._internal.snapshot.model import (COLUMNS, EXTRA_COLUMNS, FLAG_FREE_SITE, FLAG_PENDING_FREE, SEGMENT_COLUMNS, Device,
                                  Frame, Snapshot, empty_columns)
from tbmem._internal.snapshot.shape import check_document

__all__ = ["SCHEMA", "VERSION", "NotASnapshot", "Snapshot", "Device", "SnapshotBuilder", "Frame", "to_json", "from_json",
           "read_json_gz", "encode_json_gz", "encode_column", "decode_column", "FLAG_FREE_SITE",
           "FLAG_PENDING_FREE", "COLUMNS", "EXTRA_COLUMNS", "SEGMENT_COLUMNS"]

SCHEMA = "tbmem.snapshot"
VERSION = 2


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
        # lists while events are added one by one, or arrays a recorder read back whole sets at once
        # (tbmem._internal.snapshot.cpu_recorder): build() takes either
        self.cols: dict[str, Any] = {c: [] for c in (*COLUMNS, "device")}
        self.time_us: Any = []
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


# --- JSON ----------------------------------------------------------------------------------------
def _device_json(d: Device, compress: bool) -> dict[str, Any]:
    out = {"device": d.name, "n_events": d.n_events, "has_time": bool(d.has_time), "dropped": int(d.dropped),
           "reserved_bytes": d.reserved_bytes, "segments": int(d.segments),
           "time_us": encode_column(d.time_us, compress=compress),
           "allocs": {k: encode_column(d.allocs[k], compress=compress) for k in (*COLUMNS, *EXTRA_COLUMNS)},
           "ooms": d.ooms, "markers": d.markers}
    if d.segs is not None:
        out["segs"] = {k: encode_column(d.segs[k], compress=compress) for k in SEGMENT_COLUMNS}
        out["streams"] = [int(s) for s in d.streams]
        out["pools"] = [list(p) for p in d.pools]
    return out


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
    defaults = {**{c: 0 for c in COLUMNS}, **EXTRA_COLUMNS}
    a = {c: decode_column(allocs_raw[c], f"devices[{i}].allocs.{c}", m) if c in allocs_raw
         else np.full(m, default, dtype=np.int64) for c, default in defaults.items()}
    if m and (_outside(a["start"], -1, n) or _outside(a["end"], -1, n) or a["size"].min() < 0
              or _outside(a["category"], 0, max(n_cat, 1)) or _outside(a["stack"], -1, n_stacks)
              or _outside(a["freereq"], -1, n) or a["round"].min() < 0):
        raise ValueError(f"snapshot columns devices[{i}].allocs.* hold out-of-range indices")
    ooms = raw.get("ooms", [])
    markers = raw.get("markers", [])
    if not isinstance(ooms, list) or not all(isinstance(o, dict) for o in ooms):
        raise ValueError(f"snapshot field devices[{i}].ooms must be a list of objects")
    if not isinstance(markers, list) or not all(
            isinstance(mk, dict) and isinstance(mk.get("label"), str) and isinstance(mk.get("event"), int)
            and -1 <= mk["event"] < max(n, 1) for mk in markers):
        raise ValueError(f"snapshot field devices[{i}].markers must be [{{event, label, kind}}] within the events")
    segs, streams, pools = _segments_from_json(raw, n, n_stacks, i)
    return Device(name=str(raw.get("device", f"device{i}")), time_us=time_us, allocs=a,
                  has_time=bool(raw.get("has_time", True)), dropped=_int(raw.get("dropped", 0), "dropped", lo=0),
                  reserved_bytes=_int(raw.get("reserved_bytes"), "reserved_bytes", lo=0, none=True),
                  segments=_int(raw.get("segments", 0), "segments", lo=0), ooms=ooms, markers=markers,
                  segs=segs, streams=streams, pools=pools)


def _outside(col: np.ndarray, lo: int, hi: int) -> bool:
    """Whether a non-empty column holds a value outside ``lo <= v < hi``."""
    return bool(col.shape[0]) and (int(col.min()) < lo or int(col.max()) >= hi)


def _segments_from_json(raw: dict[str, Any], n: int, n_stacks: int, i: int) -> tuple[Any, list[int], list[list[int]]]:
    """A device's optional segment table (None where the file has none), streams and pools, validated."""
    if raw.get("segs") is None:
        return None, [], []
    where = f"devices[{i}]"
    seg_raw = raw["segs"]
    streams, pools = raw.get("streams", []), raw.get("pools", [])
    if not isinstance(seg_raw, dict) or not all(c in seg_raw for c in SEGMENT_COLUMNS):
        raise ValueError(f"snapshot field {where}.segs must hold the columns {', '.join(SEGMENT_COLUMNS)}")
    if not isinstance(streams, list) or not all(isinstance(s, int) and not isinstance(s, bool) for s in streams):
        raise ValueError(f"snapshot field {where}.streams must be a list of integers")
    if not isinstance(pools, list) or not all(
            isinstance(p, list) and len(p) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in p)
            for p in pools):
        raise ValueError(f"snapshot field {where}.pools must be a list of [integer, integer] pairs")
    k = decode_column(seg_raw["size"], f"{where}.segs.size").shape[0]
    segs = {c: decode_column(seg_raw[c], f"{where}.segs.{c}", k) for c in SEGMENT_COLUMNS}
    if k and (_outside(segs["start"], -1, n) or _outside(segs["end"], -1, n) or segs["size"].min() < 0
              or segs["addr"].min() < 0 or _outside(segs["stream"], -1, len(streams))
              or _outside(segs["pool"], -1, len(pools)) or _outside(segs["stack"], -1, n_stacks)):
        raise ValueError(f"snapshot columns {where}.segs.* hold out-of-range indices")
    return segs, streams, pools


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
    check_document(doc)  # the fields used as they are (tbmem._internal.snapshot.shape)
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
        devices = [Device(name="", time_us=np.zeros(0, dtype=np.int64), allocs=empty_columns(COLUMNS))]
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

    from tbmem._internal.snapshot.pickle_rows import Limits

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
