"""PyTorch's allocator snapshots converted to tbmem's snapshot format, every device (no torch import).

Accepted: ``torch.cuda.memory._snapshot()``'s dict (``segments``, ``device_traces``, and what
torch 1.13-2.13 add: ``allocator_settings``, ``external_annotations``; events with or without
``time_us``, ``compile_context``, ``user_metadata``; actions ``alloc``, ``free_requested``,
``free_completed``, ``segment_alloc``/``segment_free``, ``segment_map``/``segment_unmap``,
``snapshot``, ``oom``), and the list of segments ``torch.cuda.memory_snapshot()`` returns.

Every trace entry is one event on its device's axis. An allocation runs from its ``alloc`` to
the ``free_completed`` of the same address (the memory is reusable only then); a free that was
requested but not completed when the snapshot was taken leaves the block alive, counted once,
flagged as pending. Memory alive before the first event is part of every point of the
timeline: blocks freed in the trace without an ``alloc`` in it (their stack, when there is
one, was recorded at the free and is flagged so), and active blocks of the segments that no
traced allocation accounts for. Those form the *baseline*.

The allocator does not know what a block is for, so a category says only what its stack
shows: ``backward`` (the autograd engine's frames), ``optimizer`` (``torch.optim``), ``python
code`` (a Python stack, neither of those), ``c++ only``, ``no stack`` (recorded without frames:
with Python-only stacks, the autograd engine's threads look like this), ``before trace`` (no
stack but the one recorded at its free).

Example:
    >>> from tbmem.snapshot.cuda import convert_torch_snapshot
    >>> f = [{"filename": "/home/u/train.py", "line": 3, "name": "step"}]
    >>> torch_dict = {"segments": [], "device_traces": [[
    ...     {"action": "alloc", "addr": 64, "size": 512, "frames": f, "time_us": 10},
    ...     {"action": "free_requested", "addr": 64, "size": 512, "frames": f, "time_us": 12},
    ...     {"action": "free_completed", "addr": 64, "size": 512, "frames": f, "time_us": 13}]]}
    >>> snap = convert_torch_snapshot(torch_dict, kind="snapshot", step=0)
    >>> snap.n_events, snap.peak_bytes(), snap.categories[snap.allocs["category"][0]]
    (3, 512, 'python code')
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from tbmem.snapshot.frames import FrameClassifier
from tbmem.snapshot.pickle_rows import ACTION_CODE, NO_TIME, EventRows, Limits, SnapshotRefused
from tbmem.snapshot.schema import COLUMNS, FLAG_FREE_SITE, FLAG_PENDING_FREE, Device, Snapshot

__all__ = ["convert_torch_snapshot", "convert_rows", "CATEGORIES", "stack_categories"]

#: Category names of CUDA allocations, each saying only what the stack shows.
CATEGORIES = ("python code", "backward", "optimizer", "c++ only", "no stack", "before trace")
_ALLOC, _FREE_REQ, _FREE_DONE = ACTION_CODE["alloc"], ACTION_CODE["free_requested"], ACTION_CODE["free_completed"]
_OOM = ACTION_CODE["oom"]
_ACTIVE = ("active_allocated", "active_pending_free")


def stack_categories(rows: EventRows, classifier: FrameClassifier) -> np.ndarray:
    """Category index (into :data:`CATEGORIES`) of every stack of ``rows``."""
    out = np.empty(len(rows.stacks), dtype=np.int64)
    frames = rows.frames
    for sid, stack in enumerate(rows.stacks):
        cat = 4  # no stack
        has_py = False
        for fid in stack:
            filename, _line, name = frames[fid]
            kind = classifier.kind(filename)
            if kind == "cpp":
                if "autograd::Engine::" in name or "autograd::PythonEngine::" in name:
                    cat = 1
                    break
                continue
            has_py = True
            path = filename.replace("\\", "/")
            if kind == "library" and "/torch/" in path:
                if "/torch/autograd/" in path or (name == "backward" and path.endswith("/torch/_tensor.py")):
                    cat = 1
                    break
                if "/torch/optim/" in path:
                    cat = 2
                    break
        else:
            cat = 0 if has_py else (3 if stack else 4)
        out[sid] = cat
    return out


def _next_in_group(mask: np.ndarray, group: np.ndarray) -> np.ndarray:
    """For each position, the first position >= it in the same group where ``mask`` holds (-1 if none)."""
    n = mask.shape[0]
    idx = np.where(mask, np.arange(n), n)
    nxt = np.minimum.accumulate(idx[::-1])[::-1]
    ok = nxt < n
    ok[ok] = group[nxt[ok]] == group[ok]
    return np.where(ok, nxt, -1)


def _replay(act: np.ndarray, addr: np.ndarray) -> tuple[np.ndarray, ...]:
    """Pair allocs with frees by address in event order.

    Returns (alloc events, their end events (-1 alive), pending flags, unmatched free_completed
    events, unmatched pending free_requested events, count of allocs ended by a later alloc).
    """
    ev = np.flatnonzero((act == _ALLOC) | (act == _FREE_REQ) | (act == _FREE_DONE))
    order = ev[np.lexsort((ev, addr[ev]))]
    a, g = act[order], addr[order]
    group = np.concatenate(([0], np.cumsum(g[1:] != g[:-1])))
    n = order.shape[0]
    shift = lambda x: np.concatenate((x[1:], [-1]))  # noqa: E731 - "from the next position on"
    next_alloc = shift(_next_in_group(a == _ALLOC, group))
    next_done = shift(_next_in_group(a == _FREE_DONE, group))
    next_req = shift(_next_in_group(a == _FREE_REQ, group))
    # the group of position i+1 must be i's own for the "next" to count
    same = np.concatenate((group[1:] == group[:-1], [False]))
    for arr in (next_alloc, next_done, next_req):
        arr[~same] = -1
    is_alloc = a == _ALLOC
    inf = n + 1
    na = np.where(next_alloc >= 0, next_alloc, inf)
    nd = np.where(next_done >= 0, next_done, inf)
    nr = np.where(next_req >= 0, next_req, inf)
    done = is_alloc & (nd < na)
    pending = is_alloc & ~done & (nr < na)
    reused = is_alloc & ~done & ~pending & (na < inf)
    end = np.full(n, -1, dtype=np.int64)
    end[done] = order[nd[done]]
    end[reused] = order[na[reused]]
    # frees that close an alloc of the trace; the others close memory allocated before it
    paired = np.zeros(n, dtype=bool)
    paired[nd[done]] = True
    prev_alloc_open = np.zeros(n, dtype=bool)
    prev_alloc_open[nr[pending]] = True
    prev_alloc_open[nr[done & (nr < nd)]] = True
    lone_done = (a == _FREE_DONE) & ~paired
    # a lone free_requested whose block never completed its free: alive, pending, allocated before
    lone_req = (a == _FREE_REQ) & ~prev_alloc_open & (np.where(next_done >= 0, next_done, inf) >= na)
    return (order[is_alloc], end[is_alloc], pending[is_alloc], order[lone_done], order[lone_req],
            int(reused.sum()))


def _check_bytes(values: np.ndarray, what: str, device: str, limits: Limits) -> None:
    bad = np.flatnonzero((values < 0) | (values > limits.max_bytes))
    if bad.shape[0]:
        raise SnapshotRefused(f"{what} of {int(values[bad[0]]):,} bytes at event {int(bad[0])} of {device} is "
                              f"outside 0..{limits.max_bytes:,} (Limits.max_bytes): not a plausible snapshot")


def convert_rows(data: Any, rows: EventRows, *, kind: str, step: int, rank: int = 0,
                 limits: Limits | None = None, classifier: FrameClassifier | None = None) -> Snapshot:
    """Convert a torch snapshot whose traces were read into ``rows`` (see :mod:`.pickle_stream`)."""
    limits = limits or rows.limits
    if isinstance(data, list):
        segments, traces, top = data, [], {}
    elif isinstance(data, Mapping):
        if "segments" not in data and "device_traces" not in data:
            raise SnapshotRefused("not a torch memory snapshot: it has neither segments nor device_traces")
        segments, traces, top = data.get("segments") or [], data.get("device_traces") or [], data
    else:
        raise SnapshotRefused(f"a snapshot is a dict or a list of segments, not a {type(data).__name__}")
    if not isinstance(segments, list) or not isinstance(traces, list):
        raise SnapshotRefused("snapshot fields segments and device_traces must be lists")
    seg_by_dev: dict[int, list[Mapping[str, Any]]] = {}
    for seg in segments:
        if not isinstance(seg, Mapping):
            raise SnapshotRefused("a segment is not a dict")
        dev = seg.get("device", 0)
        if isinstance(dev, bool) or not isinstance(dev, int) or not 0 <= dev < 1 << 16:
            raise SnapshotRefused(f"segment device {dev!r} is not a device index")
        seg_by_dev.setdefault(dev, []).append(seg)
    per_dev = {d: rows.rows_of(t) for d, t in enumerate(traces)}
    cols = {c: rows.column(c) for c in ("action", "addr", "size", "time", "stack", "meta")}
    devices_idx = sorted({d for d, r in per_dev.items() if r.shape[0]} | set(seg_by_dev))
    times = [cols["time"][r] for r in per_dev.values() if r.shape[0]]
    known = [t[t != NO_TIME] for t in times]
    t0 = min((int(k.min()) for k in known if k.shape[0]), default=None)
    # block frames come from the segments: intern their stacks before categories are computed
    seg_stacks = {id(b): rows.stack_id(b.get("frames")) for segs in seg_by_dev.values() for s in segs
                  for b in (s.get("blocks") or []) if isinstance(b, Mapping)}
    if classifier is None:
        meta_roots = top.get("tbmem_library_roots") if isinstance(top, Mapping) else None
        classifier = FrameClassifier.for_paths(
            (f[0] for f in rows.frames), extra_roots=meta_roots if isinstance(meta_roots, list) else ())
    cat_of_stack = stack_categories(rows, classifier)
    devices = []
    for d in devices_idx:
        devices.append(_device(d, per_dev.get(d, np.zeros(0, dtype=np.int64)), cols, seg_by_dev.get(d, []),
                               seg_stacks, cat_of_stack, t0, top, limits, rows.strings))
    meta: dict[str, Any] = {"recorder": "torch.cuda.memory._record_memory_history"}
    if isinstance(top, Mapping) and isinstance(top.get("allocator_settings"), Mapping):
        meta["allocator_settings"] = {str(k): v for k, v in top["allocator_settings"].items()
                                      if isinstance(v, (str, int, float, bool)) or v is None}
    if rows.extra_keys:
        meta["unknown_event_keys"] = sorted(rows.extra_keys)
    strings: list[str] = []
    sid_of: dict[str, int] = {}

    def s(x: str) -> int:
        i = sid_of.get(x)
        if i is None:
            i = sid_of[x] = len(strings)
            strings.append(x)
        return i

    frames = [[s(f), int(line), s(name)] for f, line, name in rows.frames]
    snap = Snapshot(source="cuda", kind=kind, rank=int(rank), step=int(step),
                    t0_unix=None if t0 is None else t0 / 1e6, strings=strings, frames=frames,
                    stacks=[list(st) for st in rows.stacks], categories=list(CATEGORIES),
                    devices=devices or [Device(name="cuda:0", time_us=np.zeros(0, dtype=np.int64),
                                               allocs={c: np.zeros(0, dtype=np.int64) for c in COLUMNS})],
                    meta=meta)
    snap.default_device = snap.choose_default()
    return snap


def _device(d: int, idx: np.ndarray, cols: dict[str, np.ndarray], segs: list[Mapping[str, Any]],
            seg_stacks: dict[int, int], cat_of_stack: np.ndarray, t0: int | None, top: Any,
            limits: Limits, meta_strings: list[str]) -> Device:
    name = f"cuda:{d}"
    act, addr, size = cols["action"][idx].astype(np.int64), cols["addr"][idx], cols["size"][idx]
    stack, meta_col = cols["stack"][idx].astype(np.int64), cols["meta"][idx]
    _check_bytes(size, "a size", name, limits)
    t = cols["time"][idx]
    has_time = bool(t.shape[0]) and bool(np.any(t != NO_TIME))
    if has_time:
        # an event without time_us (mixed traces) takes its predecessor's
        present = np.where(t != NO_TIME, np.arange(t.shape[0]), 0)
        t = t[np.maximum.accumulate(present)]
        t = np.where(t == NO_TIME, t0 or 0, t)
        time_us = t - (t0 or 0)
    else:
        time_us = np.zeros(t.shape[0], dtype=np.int64)
    starts, ends, pending, lone_done, lone_req, reused = _replay(act, addr)
    parts = {c: [] for c in COLUMNS}

    def add(start, end, sz, cat, st, ad, flags):
        for c, v in zip(COLUMNS, (start, end, sz, cat, st, ad, flags)):
            parts[c].append(np.asarray(v, dtype=np.int64))

    def cats(st: np.ndarray) -> np.ndarray:
        return np.where(st >= 0, cat_of_stack[np.maximum(st, 0)] if cat_of_stack.shape[0] else 4, 4)

    add(starts, ends, size[starts], cats(stack[starts]), stack[starts], addr[starts],
        np.where(pending, FLAG_PENDING_FREE, 0))
    before = CATEGORIES.index("before trace")
    add(np.full(lone_done.shape[0], -1), lone_done, size[lone_done], np.full(lone_done.shape[0], before),
        stack[lone_done], addr[lone_done], np.full(lone_done.shape[0], FLAG_FREE_SITE))
    add(np.full(lone_req.shape[0], -1), np.full(lone_req.shape[0], -1), size[lone_req],
        np.full(lone_req.shape[0], before), stack[lone_req], addr[lone_req],
        np.full(lone_req.shape[0], FLAG_FREE_SITE | FLAG_PENDING_FREE))
    alive = set(addr[starts[ends < 0]].tolist()) | set(addr[lone_req].tolist())
    reserved = 0
    blocks = []
    for seg in segs:
        total = seg.get("total_size", 0)
        if isinstance(total, bool) or not isinstance(total, int) or not 0 <= total <= limits.max_bytes:
            raise SnapshotRefused(f"a segment of {name} has total_size {total!r}, outside 0..{limits.max_bytes:,}")
        reserved += total
        base = seg.get("address", 0)
        for b in seg.get("blocks") or ():
            if not isinstance(b, Mapping):
                continue
            bsize = b.get("size", 0)
            baddr = b.get("address", base)
            if isinstance(bsize, bool) or not isinstance(bsize, int) or not 0 <= bsize <= limits.max_bytes:
                raise SnapshotRefused(f"a block of {name} has size {bsize!r}, outside 0..{limits.max_bytes:,}")
            base = (baddr if isinstance(baddr, int) else base) + bsize
            if b.get("state") in _ACTIVE and baddr not in alive:
                req = b.get("requested_size")
                sz = req if isinstance(req, int) and not isinstance(req, bool) and 0 < req <= bsize else bsize
                blocks.append((sz, seg_stacks.get(id(b), -1), baddr,
                               FLAG_PENDING_FREE if b.get("state") == "active_pending_free" else 0))
    if blocks:
        sz, st, ad, fl = (np.array(x, dtype=np.int64) for x in zip(*blocks))
        add(np.full(sz.shape[0], -1), np.full(sz.shape[0], -1), sz, np.where(st >= 0, cats(st), before), st, ad, fl)
    allocs = {c: np.concatenate(parts[c]) if parts[c] else np.zeros(0, dtype=np.int64) for c in COLUMNS}
    order = np.lexsort((allocs["end"], allocs["start"]))
    allocs = {c: v[order] for c, v in allocs.items()}
    ooms = [{"event": int(i), "requested_bytes": int(size[i]), "free_bytes": int(addr[i]),
             "time_us": int(time_us[i] + (t0 or 0)) if has_time else None}
            for i in np.flatnonzero(act == _OOM).tolist()]
    for o in ooms:
        if not 0 <= o["free_bytes"] <= limits.max_bytes:
            raise SnapshotRefused(f"an oom event of {name} reports {o['free_bytes']:,} bytes free, outside "
                                  f"0..{limits.max_bytes:,}")
    markers = _markers(d, act, meta_col, time_us, t0, has_time, top, meta_strings)
    dev = Device(name=name, time_us=time_us, allocs=allocs, has_time=has_time, reserved_bytes=reserved if segs else None,
                 segments=len(segs), ooms=ooms, markers=markers)
    total = int(allocs["size"].sum()) if allocs["size"].shape[0] else 0
    if total >= 2**62:
        raise SnapshotRefused(f"the allocations of {name} add up to {total:,} bytes: not a plausible snapshot")
    if reused:
        dev.markers.append({"event": -1, "label": f"{reused} addresses reallocated without a free in the trace",
                            "kind": "note"})
    return dev


def _markers(d: int, act: np.ndarray, meta_col: np.ndarray, time_us: np.ndarray, t0: int | None,
             has_time: bool, top: Any, meta_strings: list[str]) -> list[dict[str, Any]]:
    """Step and phase boundaries: tbmem's annotations, ``external_annotations`` starts, changes of
    ``user_metadata`` and ``snapshot`` actions."""
    out: list[dict[str, Any]] = []
    n = time_us.shape[0]
    if n == 0:
        return out
    anns = top.get("external_annotations") if isinstance(top, Mapping) else None
    if has_time and isinstance(anns, list):
        for a in anns[:100_000]:
            if not isinstance(a, Mapping) or a.get("stage") != "START" or a.get("device", d) != d:
                continue
            t, label = a.get("time_us"), a.get("name")
            if isinstance(t, int) and isinstance(label, str):
                ev = int(min(np.searchsorted(time_us, t - (t0 or 0)), n - 1))
                kind = "annotation"
                if label.startswith("tbmem:"):
                    label = label[6:]
                    # "step 20" (the trainers' marks) and "after step 20" (log_memory's own)
                    kind = "step" if label.startswith(("step ", "after step ")) else "phase"
                out.append({"event": ev, "label": label[:200], "kind": kind})
    change = np.flatnonzero(np.concatenate(([meta_col[0] >= 0] if meta_col.shape[0] else [],
                                            meta_col[1:] != meta_col[:-1])))
    for ev in change[:10_000].tolist():
        if meta_col[ev] >= 0:
            label = meta_strings[int(meta_col[ev])]
            kind = "metadata"
            if label.startswith("tbmem:"):
                label, kind = label[6:], "phase"
            out.append({"event": int(ev), "label": label[:200], "kind": kind})
    for ev in np.flatnonzero(act == ACTION_CODE["snapshot"])[:10_000].tolist():
        out.append({"event": int(ev), "label": "snapshot", "kind": "snapshot"})
    out.sort(key=lambda m: m["event"])
    return out


def convert_torch_snapshot(data: Any, *, kind: str, step: int, rank: int = 0,
                           device: int | None = None, limits: Limits | None = None) -> Snapshot:
    """Convert ``torch.cuda.memory._snapshot()``'s dict (or the list of segments) into a Snapshot.

    Args:
        data: The snapshot dict, or a list of segments.
        kind: ``"snapshot"`` or ``"oom"``.
        step: Training step the snapshot belongs to.
        rank: Distributed rank.
        device: The default device (shown first); None: the OOM device, else the largest peak.
    """
    rows = EventRows(limits or Limits())
    snap = convert_rows(data, rows, kind=kind, step=step, rank=rank, limits=limits)
    if device is not None:
        names = [dv.name for dv in snap.devices]
        if f"cuda:{device}" in names:
            snap.default_device = names.index(f"cuda:{device}")
    return snap
