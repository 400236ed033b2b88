"""The one safe snapshot format (JSON, gzip) shared by the CUDA capture, the recorder and the viewer.

A snapshot is a list of *allocations* (intervals on an event axis) plus
tables that deduplicate strings, frames and stacks. Every alloc and every free
is one event; event ``i`` happened at ``time_us[i]`` microseconds after the
first event. Columns are plain integer arrays so that a million events stay
small and load fast in Python and in the browser::

    {"schema": "tbmem.snapshot", "version": 1, "source": "dispatch" | "cuda",
     "kind": "snapshot" | "oom", "device": "cpu", "rank": 0, "step": 12,
     "n_events": 4, "dropped": 0, "time_us": [0, 3, 9, 11], "t0_unix": 1.7e9,
     "strings": ["train.py", "forward"], "frames": [[0, 12, 1]],   # [file, line, name]
     "stacks": [[0]],                                              # frame ids, innermost first
     "categories": ["activation"],
     "allocs": {"start": [0, 1], "end": [2, -1], "size": [4096, 512],
                "category": [0, 0], "stack": [0, -1], "addr": [1, 2]},
     "meta": {"torch": "2.13.0"}}

``start == -1``: allocated before the first recorded event; ``end == -1``:
still alive when the snapshot was taken. Nothing in this format is executable,
and :func:`from_json` validates every index before anything uses it.

Example:
    >>> from tbmem.snapshot.schema import SnapshotBuilder, from_json, to_json
    >>> b = SnapshotBuilder(source="dispatch", device="cpu")
    >>> a = b.alloc(4096, category="activation", stack=[("train.py", 12, "forward")], time_us=0)
    >>> b.free(a, time_us=5)
    >>> snap = from_json(to_json(b.build(kind="snapshot", step=3)))
    >>> snap.n_events, snap.peak_bytes()
    (2, 4096)
"""

from __future__ import annotations

import gzip
import json
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np

__all__ = ["SCHEMA", "VERSION", "Snapshot", "SnapshotBuilder", "Frame", "to_json", "from_json",
           "read_json_gz", "encode_json_gz", "user_frame_index"]

SCHEMA = "tbmem.snapshot"
VERSION = 1
Frame = tuple[str, int, str]  # (filename, line, function name)
_COLUMNS = ("start", "end", "size", "category", "stack", "addr")
# frames from these path fragments are library internals, not "the line of code that allocated"
_INTERNAL = ("/torch/", "\\torch\\", "/tbmem/", "\\tbmem\\", "<frozen", "/phiml/", "/phi/")


@dataclass
class Snapshot:
    """A decoded snapshot: tables plus integer columns (numpy int64 arrays)."""

    source: str
    kind: str
    device: str
    rank: int
    step: int
    n_events: int
    dropped: int
    time_us: np.ndarray
    t0_unix: float
    strings: list[str]
    frames: list[list[int]]
    stacks: list[list[int]]
    categories: list[str]
    allocs: dict[str, np.ndarray]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def n_allocs(self) -> int:
        """Number of allocations (intervals)."""
        return int(self.allocs["size"].shape[0])

    def frame(self, frame_id: int) -> Frame:
        """(filename, line, name) of a frame id."""
        f = self.frames[frame_id]
        return self.strings[f[0]], int(f[1]), self.strings[f[2]]

    def stack_frames(self, stack_id: int) -> list[Frame]:
        """The frames of a stack id, innermost first ([] for -1)."""
        return [] if stack_id < 0 else [self.frame(f) for f in self.stacks[stack_id]]

    def timeline(self) -> np.ndarray:
        """Active bytes after each event (length ``n_events``), pre-existing allocations included."""
        a = self.allocs
        delta = np.zeros(self.n_events + 1, dtype=np.int64)
        base = int(a["size"][a["start"] < 0].sum())
        np.add.at(delta, a["start"][a["start"] >= 0], a["size"][a["start"] >= 0])
        np.add.at(delta, a["end"][a["end"] >= 0], -a["size"][a["end"] >= 0])
        return base + np.cumsum(delta[:-1])

    def peak(self) -> tuple[int, int]:
        """(event index, active bytes) at the peak; (-1, bytes alive before any event) if empty."""
        if self.n_events == 0:
            return -1, int(self.allocs["size"].sum())
        tl = self.timeline()
        i = int(np.argmax(tl))
        return i, int(tl[i])

    def peak_bytes(self) -> int:
        """Highest active bytes over the snapshot."""
        return self.peak()[1]

    def alive_at(self, event: int) -> np.ndarray:
        """Indices of the allocations alive right after ``event``."""
        a = self.allocs
        started = (a["start"] <= event)
        not_ended = (a["end"] < 0) | (a["end"] > event)
        return np.nonzero(started & not_ended)[0]


class SnapshotBuilder:
    """Accumulates allocations in event order and builds a :class:`Snapshot`.

    Args:
        source: ``"dispatch"`` or ``"cuda"`` (what captured it).
        device: Device name, e.g. ``"cpu"`` or ``"cuda:0"``.
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
        self.cols: dict[str, list[int]] = {c: [] for c in _COLUMNS}
        self.time_us: list[int] = []
        self.dropped = 0
        self.t0_unix = time.time()
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

    def _event(self, time_us: int) -> int:
        self.time_us.append(int(time_us))
        return len(self.time_us) - 1

    def alloc(self, size: int, *, category: str = "unknown", stack: Sequence[Frame] | None = None,
              time_us: int | None = None, addr: int = 0, preexisting: bool = False,
              stack_id: int | None = None) -> int:
        """Record an allocation; returns its index (pass it to :meth:`free`)."""
        c = self.cols
        start = -1 if preexisting else self._event(time_us if time_us is not None else 0)
        c["start"].append(start)
        c["end"].append(-1)
        c["size"].append(int(size))
        c["category"].append(self.category_id(category))
        c["stack"].append(stack_id if stack_id is not None else self.stack_id(stack))
        c["addr"].append(int(addr))
        return len(c["size"]) - 1

    def free(self, index: int, *, time_us: int | None = None) -> None:
        """Record the free of allocation ``index``."""
        self.cols["end"][index] = self._event(time_us if time_us is not None else 0)

    def build(self, *, kind: str, step: int, rank: int = 0) -> Snapshot:
        """The snapshot of everything recorded (times made relative to the first event)."""
        t = np.asarray(self.time_us, dtype=np.int64)
        if t.size:
            t = np.maximum.accumulate(t - t[0])  # clocks of different threads may step back
        return Snapshot(
            source=self.source, kind=kind, device=self.device, rank=int(rank), step=int(step),
            n_events=len(self.time_us), dropped=int(self.dropped), time_us=t, t0_unix=float(self.t0_unix),
            strings=list(self.strings), frames=[list(f) for f in self.frames],
            stacks=[list(s) for s in self.stacks], categories=list(self.categories),
            allocs={k: np.asarray(v, dtype=np.int64) for k, v in self.cols.items()}, meta=dict(self.meta),
        )


def to_json(snap: Snapshot) -> dict[str, Any]:
    """The JSON-ready dict of a snapshot (the on-disk and in-page format)."""
    return {
        "schema": SCHEMA, "version": VERSION, "source": snap.source, "kind": snap.kind,
        "device": snap.device, "rank": snap.rank, "step": snap.step, "n_events": snap.n_events,
        "dropped": snap.dropped, "t0_unix": snap.t0_unix, "time_us": snap.time_us.tolist(),
        "strings": snap.strings, "frames": snap.frames, "stacks": snap.stacks,
        "categories": snap.categories, "allocs": {k: snap.allocs[k].tolist() for k in _COLUMNS},
        "meta": snap.meta,
    }


def _int_array(value: Any, name: str) -> np.ndarray:
    if not isinstance(value, list):
        raise ValueError(f"snapshot field {name} must be a list")
    try:
        arr = np.asarray(value, dtype=np.int64)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValueError(f"snapshot field {name} must hold integers") from exc
    if arr.ndim != 1:
        raise ValueError(f"snapshot field {name} must be a flat list of integers")
    return arr


def from_json(doc: Any) -> Snapshot:
    """Validate a parsed JSON document and decode it; ValueError names what is wrong."""
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise ValueError(f"not a {SCHEMA} document")
    if doc.get("version") != VERSION:
        raise ValueError(f"unsupported {SCHEMA} version {doc.get('version')!r} (this tbmem reads {VERSION})")
    strings = doc.get("strings", [])
    if not isinstance(strings, list) or not all(isinstance(s, str) for s in strings):
        raise ValueError("snapshot field strings must be a list of strings")
    frames = doc.get("frames", [])
    if not isinstance(frames, list) or not all(
            isinstance(f, list) and len(f) == 3 and all(isinstance(x, int) for x in f)
            and 0 <= f[0] < len(strings) and 0 <= f[2] < len(strings) for f in frames):
        raise ValueError("snapshot field frames must be [string id, line, string id] triples")
    stacks = doc.get("stacks", [])
    if not isinstance(stacks, list) or not all(
            isinstance(s, list) and all(isinstance(x, int) and 0 <= x < len(frames) for x in s) for s in stacks):
        raise ValueError("snapshot field stacks must be lists of frame ids")
    categories = [str(c) for c in doc.get("categories", [])]
    raw = doc.get("allocs")
    if not isinstance(raw, dict):
        raise ValueError("snapshot field allocs is missing")
    allocs = {c: _int_array(raw.get(c, []), f"allocs.{c}") for c in _COLUMNS}
    n = allocs["size"].shape[0]
    if any(allocs[c].shape[0] != n for c in _COLUMNS):
        raise ValueError("snapshot columns allocs.* differ in length")
    time_us = _int_array(doc.get("time_us", []), "time_us")
    n_events = int(doc.get("n_events", time_us.shape[0]))
    if time_us.shape[0] != n_events:
        raise ValueError("snapshot field time_us must have n_events entries")
    if n and (allocs["start"].min() < -1 or allocs["start"].max() >= n_events or allocs["end"].min() < -1
              or allocs["end"].max() >= n_events or allocs["size"].min() < 0
              or allocs["category"].min() < 0 or allocs["category"].max() >= max(len(categories), 1)
              or allocs["stack"].min() < -1 or allocs["stack"].max() >= len(stacks)):
        raise ValueError("snapshot columns allocs.* hold out-of-range indices")
    if not categories:
        categories = ["unknown"]
    meta = doc.get("meta", {})
    return Snapshot(
        source=str(doc.get("source", "")), kind=str(doc.get("kind", "snapshot")),
        device=str(doc.get("device", "")), rank=int(doc.get("rank", 0)), step=int(doc.get("step", 0)),
        n_events=n_events, dropped=int(doc.get("dropped", 0)), time_us=time_us,
        t0_unix=float(doc.get("t0_unix", 0.0)), strings=list(strings), frames=frames, stacks=stacks,
        categories=categories, allocs=allocs, meta=meta if isinstance(meta, dict) else {},
    )


def encode_json_gz(snap: Snapshot) -> bytes:
    """The gzip-compressed compact JSON bytes of a snapshot."""
    text = json.dumps(to_json(snap), separators=(",", ":"), ensure_ascii=False)
    return gzip.compress(text.encode("utf-8"), compresslevel=6, mtime=0)


def read_json_gz(path: str) -> Snapshot:
    """Load and validate a ``.json.gz`` (or plain ``.json``) snapshot file."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return from_json(json.load(fh))


def user_frame_index(snap: Snapshot, stack_id: int) -> int:
    """Frame id of the innermost frame outside torch/tbmem (the user's line); -1 if none."""
    if stack_id < 0:
        return -1
    frames = snap.stacks[stack_id]
    for fid in frames:
        filename = snap.strings[snap.frames[fid][0]]
        if not any(p in filename for p in _INTERNAL):
            return fid
    return frames[0] if frames else -1
