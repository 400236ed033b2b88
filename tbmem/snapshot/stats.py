"""What ``tbmem snapshot stats`` prints: every device, its peak, OOMs and where the memory was allocated.

The *frame* of an allocation is the innermost Python frame of user code in its stack
(:mod:`tbmem.snapshot.frames` decides what is user code); C++ frames are never chosen. An
allocation known only from its free (made before the trace began) has no allocation site:
its frame is ``null``, and the text says which stack was recorded at the free.

``stats_doc`` is the ``--json`` document, one object::

    {"devices": [{"device": "cuda:1", "reserved_bytes": int, "allocated_bytes": int,
                  "peak_bytes": int, "trace_events": int,
                  "ooms": [{"requested_bytes": int, "free_bytes": int|null, "time_us": int|null}],
                  "top_allocations": [{"bytes": int, "category": str,
                                       "frame": {"filename": str, "line": int, "name": str}|null,
                                       "alive_at_peak": bool}]}]}

``reserved_bytes`` is the sum of the segments (0 when the file has none), ``allocated_bytes``
the bytes alive when the snapshot was taken, ``peak_bytes`` the highest bytes alive including
the memory alive before the first event, ``time_us`` Unix time in microseconds.

Example:
    >>> from tbmem.snapshot.schema import SnapshotBuilder
    >>> from tbmem.snapshot.stats import stats_doc
    >>> b = SnapshotBuilder(source="dispatch", device="cpu")
    >>> _ = b.alloc(2048, category="activation", stack=[("/home/u/train.py", 9, "forward")], time_us=0)
    >>> d = stats_doc(b.build(kind="snapshot", step=1))["devices"][0]
    >>> d["peak_bytes"], d["top_allocations"][0]["frame"]
    (2048, {'filename': '/home/u/train.py', 'line': 9, 'name': 'forward'})
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tbmem.snapshot.frames import KINDS, FrameClassifier
from tbmem.snapshot.schema import FLAG_FREE_SITE, Device, Snapshot

__all__ = ["attribution", "stats_doc", "stats_text", "frame_kinds"]


def frame_kinds(snap: Snapshot, *, site_packages_are_library: bool = False) -> np.ndarray:
    """Kind code (index into :data:`~tbmem.snapshot.frames.KINDS`) of every frame of ``snap``."""
    roots = snap.meta.get("library_roots")
    stdlibs = snap.meta.get("stdlib_roots")
    fc = FrameClassifier.for_paths((snap.strings[f[0]] for f in snap.frames),
                                   extra_roots=roots if isinstance(roots, list) else (),
                                   extra_stdlibs=stdlibs if isinstance(stdlibs, list) else (),
                                   site_packages_are_library=site_packages_are_library)
    return np.array([KINDS.index(fc.kind(snap.strings[f[0]])) for f in snap.frames], dtype=np.int64)


def attribution(snap: Snapshot, kinds: np.ndarray | None = None) -> np.ndarray:
    """Per stack: the frame id of its innermost user Python frame, -1 when it has none."""
    kinds = frame_kinds(snap) if kinds is None else kinds
    out = np.full(len(snap.stacks), -1, dtype=np.int64)
    for sid, stack in enumerate(snap.stacks):
        for fid in stack:
            if kinds[fid] == 0:
                out[sid] = fid
                break
    return out


def _devices(snap: Snapshot, device: str | None) -> list[Device]:
    return [snap.devices[snap.device_index(device)]] if device is not None else list(snap.devices)


def _frame_doc(snap: Snapshot, fid: int) -> dict[str, Any] | None:
    if fid < 0:
        return None
    filename, line, name = snap.frame(fid)
    return {"filename": filename, "line": line, "name": name}


def _top(dev: Device, top: int) -> np.ndarray:
    return np.argsort(-dev.allocs["size"], kind="stable")[:top]


def stats_doc(snap: Snapshot, *, top: int = 10, device: str | None = None) -> dict[str, Any]:
    """The ``--json`` document (see the module docstring)."""
    user = attribution(snap)
    out = []
    for dev in _devices(snap, device):
        a = dev.allocs
        peak_event, peak = dev.peak()
        alive = np.zeros(dev.n_allocs, dtype=bool)
        alive[dev.alive_at(peak_event)] = True
        rows = []
        for i in _top(dev, top).tolist():
            sid = int(a["stack"][i])
            free_site = bool(a["flags"][i] & FLAG_FREE_SITE)
            rows.append({"bytes": int(a["size"][i]), "category": snap.categories[int(a["category"][i])],
                         "frame": None if free_site or sid < 0 else _frame_doc(snap, int(user[sid])),
                         "alive_at_peak": bool(alive[i])})
        ooms = [{"requested_bytes": int(o["requested_bytes"]),
                 "free_bytes": None if o.get("free_bytes") is None else int(o["free_bytes"]),
                 "time_us": None if o.get("time_us") is None else int(o["time_us"])} for o in dev.ooms]
        out.append({"device": dev.name, "reserved_bytes": int(dev.reserved_bytes or 0),
                    "allocated_bytes": dev.final_bytes(), "peak_bytes": int(peak), "trace_events": dev.n_events,
                    "ooms": ooms, "top_allocations": rows})
    return {"devices": out}


def _fmt(n: float) -> str:
    from tbmem.snapshot.readers import format_bytes

    return format_bytes(n)


def _when(dev: Device, event: int) -> str:
    if event < 0:
        return "before the first event"
    if dev.has_time:
        return f"event {event} (+{dev.time_us[event] / 1e6:.3f} s)"
    return f"event {event} (the trace has no times)"


def _label(snap: Snapshot, fid: int, cpp_first: int = -1) -> str:
    if fid < 0:
        return "(no user frame)" if cpp_first < 0 else f"(no user frame; innermost: {_frame_text(snap, cpp_first)})"
    return _frame_text(snap, fid)


def _frame_text(snap: Snapshot, fid: int) -> str:
    filename, line, name = snap.frame(fid)
    return f"{name} ({filename}:{line})"


def _table(title: str, header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    out = ["", title, "  ".join(h.ljust(w) for h, w in zip(header, widths))]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return out


def stats_text(snap: Snapshot, *, top: int = 10, device: str | None = None, cpp: bool = False) -> str:
    """Terminal text: per device, totals, OOMs, top allocations, top frames and categories.

    ``cpp``: name the innermost frame of any kind when a stack has no user frame.
    """
    kinds = frame_kinds(snap)
    user = attribution(snap, kinds)
    devices = _devices(snap, device)
    when = "" if snap.t0_unix is None else f", trace began at Unix time {snap.t0_unix:.3f}"
    lines = [f"{snap.kind} step {snap.step} rank {snap.rank}: {snap.source}, {len(snap.devices)} device(s) "
             f"({', '.join(d.name for d in snap.devices)}){when}"]
    if "exception" in snap.meta:
        lines.append(f"exception: {snap.meta['exception']}")
    for dev in devices:
        a = dev.allocs
        peak_event, peak = dev.peak()
        alive = np.zeros(dev.n_allocs, dtype=bool)
        alive[dev.alive_at(peak_event)] = True
        reserved = "no segments" if dev.reserved_bytes is None else f"reserved {_fmt(dev.reserved_bytes)}"
        lines += ["", f"== {dev.name}" + (" (default)" if dev is snap.main and len(snap.devices) > 1 else "")
                  + f": {reserved}, allocated {_fmt(dev.final_bytes())} at the end, peak {_fmt(peak)} at "
                  f"{_when(dev, peak_event)}, {dev.n_events} events, {dev.n_allocs} allocations"
                  + (f" ({dev.dropped} older events dropped)" if dev.dropped else "")]
        lines.append(f"   alive before the first event (baseline): {_fmt(dev.baseline_bytes())}")
        for o in dev.ooms:
            free = "free memory not reported" if o.get("free_bytes") is None else f"{_fmt(o['free_bytes'])} free"
            lines.append(f"   OUT OF MEMORY at {_when(dev, int(o['event']))}: requested "
                         f"{_fmt(o['requested_bytes'])}, {free}")
        for m in dev.markers:
            if m.get("kind") == "note":
                lines.append(f"   note: {m['label']}")

        def site(i: int) -> str:
            sid = int(a["stack"][i])
            if sid < 0:
                return "(no stack recorded)"
            inner = next((f for f in snap.stacks[sid] if cpp or kinds[f] == 1), -1) if user[sid] < 0 else -1
            text = _label(snap, int(user[sid]), inner)
            return f"(allocated before the trace; stack of its free) {text}" if a["flags"][i] & FLAG_FREE_SITE else text

        order = _top(dev, top).tolist()
        lines += _table(f"Top {len(order)} allocations by size", ("size", "category", "at peak", "allocated at"), [
            (_fmt(int(a["size"][i])), snap.categories[int(a["category"][i])], "yes" if alive[i] else "no", site(i))
            for i in order])
        by_frame: dict[tuple[int, bool], list[int]] = {}
        for i, (s, size, flag) in enumerate(zip(a["stack"].tolist(), a["size"].tolist(), a["flags"].tolist())):
            key = (int(user[s]) if s >= 0 else -2, bool(flag & FLAG_FREE_SITE))
            row = by_frame.setdefault(key, [0, 0, 0])
            row[0] += 1
            row[1] += size
            row[2] += size if alive[i] else 0
        frames = sorted(by_frame.items(), key=lambda kv: (-kv[1][2], -kv[1][1]))[:top]

        def flabel(key: tuple[int, bool]) -> str:
            fid, free = key
            text = "(no stack recorded)" if fid == -2 else _label(snap, fid)
            return f"(stack of the free) {text}" if free else text

        lines += _table("Top frames (innermost user code)", ("at peak", "allocated", "count", "frame"),
                        [(_fmt(r[2]), _fmt(r[1]), str(r[0]), flabel(k)) for k, r in frames])
        cats = []
        for c, name in enumerate(snap.categories):
            m = a["category"] == c
            if m.any():
                cats.append((int(a["size"][m & alive].sum()), int(a["size"][m].sum()), int(m.sum()), name))
        cats.sort(reverse=True)
        lines += _table("By category", ("at peak", "allocated", "count", "category"),
                        [(_fmt(p), _fmt(t), str(n), name) for p, t, n, name in cats])
    return "\n".join(lines)
