"""What ``tbmem snapshot stats`` prints: every device, its peak, OOMs and where the memory was allocated.

The *frame* of an allocation is the innermost Python frame of user code in its stack
(:mod:`tbmem._internal.snapshot.frames` decides what is user code); C++ frames and torch.compile's
generated files are never chosen: an allocation in generated code is named by the model's
line the stack carries after it, and ``generated`` names the generated frame. An
allocation known only from its free (made before the trace began) has no allocation site:
its frame is ``null``, and the text says which stack was recorded at the free.

``stats_doc`` is the ``--json`` document, one object::

    {"devices": [{"device": "cuda:1", "reserved_bytes": int, "allocated_bytes": int, "requested_bytes": int,
                  "peak_bytes": int, "peak_event": int, "baseline_bytes": int, "trace_events": int,
                  "ooms": [{"requested_bytes": int, "free_bytes": int|null, "time_us": int|null,
                            ...tbmem.oom.explain.OomExplanation.to_json()}],
                  "top_allocations": [{"bytes": int, "category": str,
                                       "frame": {"filename": str, "line": int, "name": str}|null,
                                       "generated": {"filename": str, "line": int, "name": str}|null,
                                       "alive_at_peak": bool}],
                  "explain": {...} | null,
                  "pools": [{"pool": [int, int]|null, "reserved_bytes": int, "most_reserved_bytes": int,
                             "allocated_bytes": int, "segments": int}]}]}

``reserved_bytes`` is the sum of the segments (0 when the file has none); ``allocated_bytes`` what
``torch.cuda.memory_allocated()`` said when the snapshot was taken (the live blocks as the caching
allocator rounded them, pending frees left out; without segments, the bytes alive), ``requested_bytes``
the bytes those allocations asked for (pending frees included: what the timeline draws); ``peak_bytes`` the
highest bytes alive including the memory alive before the first event (``baseline_bytes``;
``peak_event`` -1 when the peak is that state), ``time_us`` Unix time in microseconds.
``explain`` (null without segments) splits the reserved bytes when the snapshot was taken:
:meth:`tbmem._internal.snapshot.allocator.AllocatorState.to_json`.

Example:
    >>> from tbmem._internal.snapshot.schema import SnapshotBuilder
    >>> from tbmem._internal.snapshot.stats import stats_doc
    >>> b = SnapshotBuilder(source="dispatch", device="cpu")
    >>> _ = b.alloc(2048, category="activation", stack=[("/home/u/train.py", 9, "forward")], time_us=0)
    >>> d = stats_doc(b.build(kind="snapshot", step=1))["devices"][0]
    >>> d["peak_bytes"], d["top_allocations"][0]["frame"]
    (2048, {'filename': '/home/u/train.py', 'line': 9, 'name': 'forward'})
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tbmem._internal.snapshot.allocator import allocator_state
from tbmem._internal.snapshot.frames import KINDS, FrameClassifier
from tbmem._internal.snapshot.model import FLAG_FREE_SITE, Device, Snapshot
from tbmem._internal.snapshot.units import format_bytes

__all__ = ["attribution", "generated_frames", "stats_doc", "stats_text", "frame_kinds", "explain_text", "when",
           "format_bytes"]
_USER, _LIBRARY, _CPP, _GENERATED, _INTERNAL = range(len(KINDS))


def frame_kinds(snap: Snapshot, *, site_packages_are_library: bool = False) -> np.ndarray:
    """Kind code (index into :data:`~tbmem._internal.snapshot.frames.KINDS`) of every frame of ``snap``."""
    roots = snap.meta.get("library_roots")
    stdlibs = snap.meta.get("stdlib_roots")
    fc = FrameClassifier.for_paths((snap.strings[f[0]] for f in snap.frames),
                                   extra_roots=roots if isinstance(roots, list) else (),
                                   extra_stdlibs=stdlibs if isinstance(stdlibs, list) else (),
                                   site_packages_are_library=site_packages_are_library)
    return np.array([KINDS.index(fc.kind_of(snap.strings[f[0]], snap.strings[f[2]])) for f in snap.frames],
                    dtype=np.int64)


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


def generated_frames(snap: Snapshot, kinds: np.ndarray) -> np.ndarray:
    """Per stack: its innermost generated frame (torch.compile's code) before its user frame, -1 if none."""
    out = np.full(len(snap.stacks), -1, dtype=np.int64)
    for sid, stack in enumerate(snap.stacks):
        for fid in stack:
            if kinds[fid] == _USER:
                break
            if kinds[fid] == _GENERATED:
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
    kinds = frame_kinds(snap)
    user = attribution(snap, kinds)
    gen = generated_frames(snap, kinds)
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
                         "generated": None if free_site or sid < 0 else _frame_doc(snap, int(gen[sid])),
                         "alive_at_peak": bool(alive[i])})
        ooms = [{"requested_bytes": int(o["requested_bytes"]),
                 "free_bytes": None if o.get("free_bytes") is None else int(o["free_bytes"]),
                 "time_us": None if o.get("time_us") is None else int(o["time_us"])} for o in dev.ooms]
        for o, why in zip(ooms, _oom_explanations(snap, dev, user)):  # issue 38: each OOM explained
            o.update({k: v for k, v in why.to_json().items() if k not in o})
        explain = _explain(snap, dev)
        pools = pools_doc(dev, explain)
        out.append({"device": dev.name, "reserved_bytes": int(dev.reserved_bytes or 0),
                    "allocated_bytes": explain.allocated if explain else dev.final_bytes(),
                    "requested_bytes": dev.final_bytes(), "peak_bytes": int(peak), "peak_event": int(peak_event),
                    "baseline_bytes": dev.baseline_bytes(), "trace_events": dev.n_events,
                    "ooms": ooms, "top_allocations": rows, "explain": explain.to_json() if explain else None,
                    "pools": pools})
    return {"devices": out}


def pools_doc(dev: Device, state: Any) -> list[dict[str, Any]]:
    """Per memory pool (``pool`` ``[0, 0]`` the default one, CUDA graphs' and ``MemPool`` objects' private ones,
    null where neither the final segments nor the trace's ``pool_id`` say): its reserved bytes at the
    end (in ``segments``), the most it reserved at once, and the bytes its live allocations requested at the
    end, pending frees left out (``state``: the allocator's state at the last event). Empty without segments."""
    segs = dev.segs
    if segs is None or not segs["size"].shape[0]:
        return []
    codes = np.unique(segs["pool"])
    allocated: dict[int, int] = {}
    count: dict[int, int] = {}
    if state is not None:  # contiguous mapped ranges of an expandable segment are one segment there
        for k, a in zip(state.seg["pool"].tolist(), state.seg["allocated"].tolist()):
            allocated[int(k)] = allocated.get(int(k), 0) + int(a)
            count[int(k)] = count.get(int(k), 0) + 1
    out = []
    for code in codes.tolist():
        m = segs["pool"] == code
        start, end, size = segs["start"][m], segs["end"][m], segs["size"][m]
        # reserved over the events: +size at its start (-1: before the first), -size at its end
        at = np.concatenate((start, end[end >= 0]))
        delta = np.concatenate((size, -size[end >= 0]))
        order = np.lexsort((delta, at))  # at one event, releases before reservations
        most = int(np.cumsum(delta[order]).max(initial=0))
        out.append({"pool": dev.pools[code] if code >= 0 else None, "reserved_bytes": int(size[end < 0].sum()),
                    "most_reserved_bytes": most, "allocated_bytes": allocated.get(int(code), 0),
                    "segments": count.get(int(code), 0)})
    return sorted(out, key=lambda p: (p["pool"] is not None, p["pool"] or []))


def _oom_explanations(snap: Snapshot, dev: Device, user: np.ndarray) -> list[Any]:
    from tbmem._internal.oom.census import oom_census
    from tbmem._internal.oom.explain import explain_device
    return [explain_device(dev, o, categories=snap.categories, strings=snap.strings, frames=snap.frames,
                           stacks=snap.stacks, settings=snap.meta.get("allocator_settings"), site_of_stack=user,
                           rank=snap.rank, step=snap.step, census=oom_census(snap)) for o in dev.ooms]


def when(dev: Device, event: int) -> str:
    """``before the first event`` or ``at event N (+t s)``."""
    if event < 0:
        return "before the first event" if dev.n_events else "when the snapshot was taken (it has no trace events)"
    if dev.has_time:
        return f"at event {event} (+{dev.time_us[event] / 1e6:.3f} s)"
    return f"at event {event} (the trace has no times)"


def _explain(snap: Snapshot, dev: Device) -> Any:
    return allocator_state(dev, dev.n_events - 1, snap.categories) if dev.segs is not None else None


def explain_text(state: Any) -> str:
    """``reserved = allocated by category + pending free + internal fragmentation + external free``."""
    cats = " + ".join(f"{name} {format_bytes(b)}" for name, b in sorted(state.by_category.items(), key=lambda kv: -kv[1]))
    text = (f"reserved {format_bytes(state.reserved)} = allocated {format_bytes(sum(state.by_category.values()))}"
            + (f" ({cats})" if len(state.by_category) > 1 else "")
            + f" + pending free {format_bytes(state.pending_free)} + internal fragmentation "
            f"{format_bytes(state.internal_fragmentation)} (rounding {format_bytes(state.rounding)}, inactive split "
            f"{format_bytes(state.inactive_split)}) + external free {format_bytes(state.free_segments)} "
            f"({int((state.seg['blocks'] == 0).sum())} of {state.n_segments} segments hold nothing)")
    if state.outside_bytes:
        text += f"; {format_bytes(state.outside_bytes)} allocated outside every segment of the file"
    return text


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
    """Terminal text: per device, totals, where the reserved bytes are, OOMs, top allocations,
    top frames and categories.

    ``cpp``: when a stack has no user frame, name its innermost C++ frame if it has no Python one
    (never the stack capture's or the interpreter's own frames).
    """
    kinds = frame_kinds(snap)
    user = attribution(snap, kinds)
    gen = generated_frames(snap, kinds)
    began = "" if snap.t0_unix is None else f", trace began at Unix time {snap.t0_unix:.3f}"
    names = [d.name for d in snap.devices if d.name]
    lines = [f"{snap.kind} step {snap.step} rank {snap.rank}: {snap.source}, "
             + (f"{len(names)} device(s) ({', '.join(names)}){began}" if names else
                "no device: the snapshot holds no segments and no trace events")]
    if "exception" in snap.meta:
        lines.append(f"exception: {snap.meta['exception']}")
    for dev in _devices(snap, device) if names else []:
        lines += _device_text(snap, dev, kinds, user, gen, top, cpp)
    return "\n".join(lines)


def _site(snap: Snapshot, kinds: np.ndarray, user: np.ndarray, gen: np.ndarray, sid: int, free: bool,
          cpp: bool) -> str:
    if sid < 0:
        return "(no stack recorded)"
    text = _label(snap, int(user[sid]), _inner(snap, kinds, sid, cpp) if user[sid] < 0 else -1)
    if gen[sid] >= 0 and user[sid] >= 0:
        text += f" [in torch.compile's generated code: {_frame_text(snap, int(gen[sid]))}]"
    return f"(allocated before the trace; stack of its free) {text}" if free else text


def _inner(snap: Snapshot, kinds: np.ndarray, sid: int, cpp: bool) -> int:
    """A stack without a user frame: its innermost generated, else library Python, else (``cpp``)
    C++ frame that is not the stack capture's or the interpreter's."""
    for wanted in ((_GENERATED,), (_LIBRARY,), (_CPP,) if cpp else ()):
        for fid in snap.stacks[sid]:
            if kinds[fid] in wanted:
                return int(fid)
    return -1


def _device_text(snap: Snapshot, dev: Device, kinds: np.ndarray, user: np.ndarray, gen: np.ndarray, top: int,
                 cpp: bool) -> list[str]:
    a = dev.allocs
    peak_event, peak = dev.peak()
    alive = np.zeros(dev.n_allocs, dtype=bool)
    alive[dev.alive_at(peak_event)] = True
    reserved = "no segments" if dev.reserved_bytes is None else f"reserved {format_bytes(dev.reserved_bytes)}"
    lines = ["", f"== {dev.name}" + (" (default)" if dev is snap.main and len(snap.devices) > 1 else "")
             + f": {reserved}, allocated {format_bytes(dev.final_bytes())} at the end, peak {format_bytes(peak)} "
             f"{when(dev, peak_event)}, {dev.n_events} events, {dev.n_allocs} allocations"
             + (f" ({dev.dropped} older events dropped)" if dev.dropped else "")]
    if dev.n_events:
        lines.append(f"   alive before the first event (baseline): {format_bytes(dev.baseline_bytes())}")
    explain = _explain(snap, dev)
    if explain is not None:
        lines.append(f"   when the snapshot was taken: {explain_text(explain)}")
    for o in dev.ooms:
        free = "free memory not reported" if o.get("free_bytes") is None else f"{format_bytes(o['free_bytes'])} free"
        lines.append(f"   OUT OF MEMORY {when(dev, int(o['event']))}: requested {format_bytes(o['requested_bytes'])}, {free}")
    if dev.ooms:  # issue 38: why, in numbers
        from tbmem._internal.oom.text import explanation_text
        lines += ["   " + line for why in _oom_explanations(snap, dev, user) for line in explanation_text(why).splitlines()]
    pools = pools_doc(dev, explain)
    if len(pools) > 1 or any(p["pool"] not in (None, [0, 0]) for p in pools):
        for p in pools:
            name = "pool not known" if p["pool"] is None else "default pool" if p["pool"] == [0, 0] else \
                f"private pool {tuple(p['pool'])}"
            lines.append(f"   {name}: reserved {format_bytes(p['reserved_bytes'])} at the end in {p['segments']} "
                         f"segment(s), at most {format_bytes(p['most_reserved_bytes'])}, allocated "
                         f"{format_bytes(p['allocated_bytes'])}")
    lines += [f"   note: {m['label']}" for m in dev.markers if m.get("kind") == "note"]
    order = _top(dev, top).tolist()
    lines += _table(f"Top {len(order)} allocations by size", ("size", "category", "at peak", "allocated at"), [
        (format_bytes(int(a["size"][i])), snap.categories[int(a["category"][i])], "yes" if alive[i] else "no",
         _site(snap, kinds, user, gen, int(a["stack"][i]), bool(a["flags"][i] & FLAG_FREE_SITE), cpp))
        for i in order])
    # per (user frame, recorded at the free): count, bytes, bytes at the peak
    stack = a["stack"]
    frame = np.where(stack >= 0, user[np.maximum(stack, 0)] if user.shape[0] else -1, -2)
    key = frame * 2 + ((a["flags"] & FLAG_FREE_SITE) != 0)
    uniq, inverse, count = np.unique(key, return_inverse=True, return_counts=True)
    total = np.zeros(uniq.shape[0], dtype=np.int64)
    at_peak = np.zeros(uniq.shape[0], dtype=np.int64)
    np.add.at(total, inverse, a["size"])
    np.add.at(at_peak, inverse[alive], a["size"][alive])
    best = np.lexsort((-total, -at_peak))[:top]

    def flabel(k: int) -> str:
        fid, free = k // 2, k % 2
        text = "(no stack recorded)" if fid == -2 else _label(snap, int(fid))
        return f"(stack of the free) {text}" if free else text

    lines += _table("Top frames (innermost user code)", ("at peak", "allocated", "count", "frame"),
                    [(format_bytes(int(at_peak[j])), format_bytes(int(total[j])), str(int(count[j])), flabel(int(uniq[j])))
                     for j in best.tolist()])
    cats = []
    for c, name in enumerate(snap.categories):
        m = a["category"] == c
        if m.any():
            cats.append((int(a["size"][m & alive].sum()), int(a["size"][m].sum()), int(m.sum()), name))
    cats.sort(reverse=True)
    lines += _table("By category", ("at peak", "allocated", "count", "category"),
                    [(format_bytes(p), format_bytes(t), str(n), name) for p, t, n, name in cats])
    return lines
