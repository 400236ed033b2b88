"""Any snapshot tbmem reads, written as PyTorch's ``torch.cuda.memory._snapshot()`` document: the pickle
``torch.cuda._memory_viz`` (``trace_plot``, ``segment_plot``, ``stats``) and pytorch.org/memory_viz open.

The document is plain data (dicts, lists, strings, integers; no Python object), pickled with protocol 4,
so it holds no GLOBAL or REDUCE opcode: :func:`dumps_plain` checks that before anything is written. What
goes in, per device (``device_traces[i]`` is device ``i``: ``cuda:i``, or 0 for the CPU):

- ``device_traces``: an ``alloc`` at each allocation's event, ``free_requested`` and ``free_completed`` at its
  free (``free_requested`` at its own event where the snapshot recorded one), ``segment_alloc`` /
  ``segment_free`` for the allocator's segments, ``oom`` with ``device_free``; each with ``addr``, ``size``,
  ``stream``, ``time_us`` (Unix microseconds, where the snapshot has times) and ``frames`` (innermost first).
- ``segments``: the state when the snapshot was taken: each segment with its blocks, the allocations alive
  in it (``active_allocated``, or ``active_pending_free``) and ``inactive`` blocks for the gaps. A snapshot
  without segments (a CPU recording: there is no caching allocator) has one segment per allocation alive
  at the end, exactly its size, so ``stats`` reads reserved = allocated.

Addresses are the recorded ones where every allocation has one that no other allocation alive at the
same time shares; else (CPU recordings key allocations by storage, not address) every allocation gets an
address of its own, never reused.

Example:
    >>> import pickletools
    >>> from tbmem._internal.snapshot.schema import SnapshotBuilder
    >>> from tbmem._internal.snapshot.torch_format import dumps_plain, torch_snapshot
    >>> b = SnapshotBuilder(source="dispatch", device="cpu")
    >>> a = b.alloc(2048, category="activation", stack=[("/home/u/train.py", 9, "forward")], time_us=0)
    >>> doc = torch_snapshot(b.build(kind="snapshot", step=1))
    >>> [e["action"] for e in doc["device_traces"][0]], doc["segments"][0]["blocks"][0]["size"]
    (['alloc'], 2048)
    >>> {op.name for op, _, _ in pickletools.genops(dumps_plain(doc))} & {"GLOBAL", "STACK_GLOBAL", "REDUCE"}
    set()
"""

from __future__ import annotations

import pickle
import pickletools
import re
from typing import Any

import numpy as np

from tbmem._internal.snapshot.model import FLAG_PENDING_FREE, SEG_SMALL, Device, Snapshot

__all__ = ["torch_snapshot", "dumps_plain", "PROTOCOL", "device_ordinal"]

#: The pickle protocol written (memory_viz's JavaScript reader takes protocols up to 4).
PROTOCOL = 4
_REFUSED = {"GLOBAL", "STACK_GLOBAL", "REDUCE", "INST", "OBJ", "NEWOBJ", "NEWOBJ_EX", "BUILD", "EXT1", "EXT2",
            "EXT4", "PERSID", "BINPERSID"}
_BASE = 0x7F0000000000  # where invented addresses start (the range CUDA's own allocations use)
_ALIGN = 512


def device_ordinal(name: str, index: int) -> int:
    """The device number of a device name (``cuda:3`` -> 3); a name without one (``cpu``): ``index``."""
    m = re.search(r":(\d+)$", name or "")
    return int(m.group(1)) if m else index


def _frames(snap: Snapshot, stack: int, cache: dict[int, list[dict[str, Any]]] | None = None
            ) -> list[dict[str, Any]]:
    """A stack's frames as torch writes them (the same list object for one stack: pickled once, memoised)."""
    if cache is not None and stack in cache:
        return cache[stack]
    frames = [{"filename": f, "line": int(line), "name": n} for f, line, n in snap.stack_frames(int(stack))]
    if cache is not None:
        cache[stack] = frames
    return frames


def _addresses(dev: Device) -> np.ndarray:
    """The recorded addresses when they identify the allocations alive together; else invented ones."""
    a = dev.allocs
    addr = a["addr"].astype(np.int64)
    n = dev.n_allocs
    if n and bool((addr > 0).all()):
        order = np.lexsort((a["start"], addr))
        start, end = a["start"][order], np.where(a["end"][order] < 0, np.iinfo(np.int64).max, a["end"][order])
        same = addr[order][1:] == addr[order][:-1]
        if not bool((same & (start[1:] < end[:-1])).any()):  # no two alive at once at one address
            return addr
    sizes = (a["size"] + a["round"] + _ALIGN - 1) // _ALIGN * _ALIGN
    return _BASE + np.concatenate([[0], np.cumsum(np.maximum(sizes, _ALIGN))[:-1]]).astype(np.int64)


def _trace(snap: Snapshot, dev: Device, addr: np.ndarray) -> list[dict[str, Any]]:
    a = dev.allocs
    t0 = 0 if snap.t0_unix is None else int(round(snap.t0_unix * 1e6))
    rows: list[tuple[int, int, dict[str, Any]]] = []  # (event, order within the event, entry)
    cache: dict[int, list[dict[str, Any]]] = {}

    def entry(action: str, event: int, address: int, size: int, stream: int, stack: int) -> dict[str, Any]:
        e: dict[str, Any] = {"action": action, "addr": int(address), "size": int(size), "stream": int(stream),
                             "frames": _frames(snap, stack, cache) if stack >= 0 else []}
        if dev.has_time and 0 <= event < dev.n_events:
            e["time_us"] = t0 + int(dev.time_us[event])
        return e

    addrs = addr.tolist()
    # trace entries carry the bytes asked for (torch records ``orig_size``); blocks say what was rounded to
    for i, (size, stack, start, end, freereq) in enumerate(zip(
            a["size"].tolist(), a["stack"].tolist(), a["start"].tolist(), a["end"].tolist(), a["freereq"].tolist())):
        if start >= 0:
            rows.append((start, 1, entry("alloc", start, addrs[i], size, 0, stack)))
        if end >= 0:
            req = freereq if 0 <= freereq <= end else end
            rows.append((req, 2, entry("free_requested", req, addrs[i], size, 0, stack)))
            rows.append((end, 3, entry("free_completed", end, addrs[i], size, 0, stack)))
    if dev.segs is not None:
        s = dev.segs
        for j in range(int(s["size"].shape[0])):
            stream = dev.streams[int(s["stream"][j])] if 0 <= int(s["stream"][j]) < len(dev.streams) else 0
            if int(s["start"][j]) >= 0:
                rows.append((int(s["start"][j]), 0, entry("segment_alloc", int(s["start"][j]), s["addr"][j],
                                                          s["size"][j], stream, int(s["stack"][j]))))
            if int(s["end"][j]) >= 0:
                rows.append((int(s["end"][j]), 4, entry("segment_free", int(s["end"][j]), s["addr"][j],
                                                        s["size"][j], stream, -1)))
    for o in dev.ooms:
        ev = int(o.get("event", -1))
        e = entry("oom", ev, 0, int(o["requested_bytes"]), 0, -1)
        e["device_free"] = int(o.get("free_bytes") or 0)
        rows.append((ev, 5, e))
    rows.sort(key=lambda r: (r[0], r[1]))
    return [r[2] for r in rows]  # sorted by event: one event's entries in the order torch writes them


def _block(snap: Snapshot, dev: Device, i: int, address: int) -> dict[str, Any]:
    a = dev.allocs
    pending = bool(int(a["flags"][i]) & FLAG_PENDING_FREE)
    return {"address": int(address), "size": int(a["size"][i] + a["round"][i]), "requested_size": int(a["size"][i]),
            "state": "active_pending_free" if pending else "active_allocated",
            "frames": _frames(snap, int(a["stack"][i])) if int(a["stack"][i]) >= 0 else []}


def _segments(snap: Snapshot, dev: Device, ordinal: int, addr: np.ndarray) -> list[dict[str, Any]]:
    alive = dev.alive_at(dev.n_events - 1) if dev.n_events else dev.alive_at(-1)
    out = []
    if dev.segs is None:  # no caching allocator: each live allocation is its own segment
        for i in sorted(alive.tolist(), key=lambda k: int(addr[k])):
            b = _block(snap, dev, i, int(addr[i]))
            out.append(_segment(ordinal, int(addr[i]), b["size"], 0, "large", [b]))
        return out
    s = dev.segs
    live = sorted(alive.tolist(), key=lambda k: int(addr[k]))
    for j in dev.segments_alive_at(dev.n_events - 1 if dev.n_events else -1).tolist():
        lo, size = int(s["addr"][j]), int(s["size"][j])
        stream = dev.streams[int(s["stream"][j])] if 0 <= int(s["stream"][j]) < len(dev.streams) else 0
        blocks, at = [], lo
        for i in live:
            if lo <= int(addr[i]) < lo + size:
                b = _block(snap, dev, i, int(addr[i]))
                if b["address"] > at:
                    blocks.append(_gap(at, b["address"] - at))
                blocks.append(b)
                at = b["address"] + b["size"]
        if at < lo + size:
            blocks.append(_gap(at, lo + size - at))
        kind = "small" if int(s["flags"][j]) & SEG_SMALL else "large"
        out.append(_segment(ordinal, lo, size, stream, kind, blocks))
    return out


def _gap(address: int, size: int) -> dict[str, Any]:
    return {"address": address, "size": size, "requested_size": 0, "state": "inactive", "frames": []}


def _segment(ordinal: int, address: int, size: int, stream: int, kind: str, blocks: list[dict[str, Any]]
             ) -> dict[str, Any]:
    active = [b for b in blocks if b["state"] != "inactive"]
    return {"device": ordinal, "address": address, "total_size": size, "stream": int(stream), "segment_type": kind,
            "segment_pool_id": [0, 0], "is_expandable": False, "frames": [],
            "allocated_size": sum(b["size"] for b in active if b["state"] == "active_allocated"),
            "active_size": sum(b["size"] for b in active),
            "requested_size": sum(b["requested_size"] for b in active), "blocks": blocks}


def torch_snapshot(snap: Snapshot) -> dict[str, Any]:
    """The ``_snapshot()`` document of ``snap`` (see the module docstring): plain data only."""
    ordinals = [device_ordinal(d.name, i) for i, d in enumerate(snap.devices)]
    traces: list[list[dict[str, Any]]] = [[] for _ in range(max(ordinals, default=-1) + 1)]
    segments: list[dict[str, Any]] = []
    for dev, ordinal in zip(snap.devices, ordinals):
        addr = _addresses(dev)
        traces[ordinal] = _trace(snap, dev, addr)
        segments += _segments(snap, dev, ordinal, addr)
    return {"segments": segments, "device_traces": traces,
            "allocator_settings": {}, "external_annotations": [],
            "tbmem": {"source": snap.source, "kind": snap.kind, "rank": int(snap.rank), "step": int(snap.step),
                      "devices": [d.name for d in snap.devices]}}


def dumps_plain(doc: Any) -> bytes:
    """``doc`` pickled with :data:`PROTOCOL`; ValueError if the pickle would name a Python object
    (a GLOBAL, REDUCE or similar opcode: a numpy integer left in, say)."""
    data = pickle.dumps(doc, protocol=PROTOCOL)
    named = {op.name for op, _, _ in pickletools.genops(data)} & _REFUSED
    if named:
        raise ValueError(f"the snapshot document is not plain data: its pickle has {', '.join(sorted(named))}")
    return data
