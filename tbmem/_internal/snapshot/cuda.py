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
    >>> from tbmem._internal.snapshot.cuda import convert_torch_snapshot
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

from tbmem._internal.snapshot.cuda_replay import pair_allocations
from tbmem._internal.snapshot.cuda_segments import FinalSegment, segment_flags, segment_pieces
from tbmem._internal.snapshot.frames import FrameClassifier
from tbmem._internal.snapshot.model import (COLUMNS, EXTRA_COLUMNS, FLAG_FREE_SITE, FLAG_PENDING_FREE, Device, Snapshot,
                                  empty_columns)
from tbmem._internal.snapshot.pickle_rows import ACTION_CODE, NO_TIME, EventRows, Limits, SnapshotRefused

__all__ = ["convert_torch_snapshot", "convert_rows", "CATEGORIES", "stack_categories"]

#: Category names of CUDA allocations, each saying only what the stack shows.
CATEGORIES = ("python code", "backward", "optimizer", "c++ only", "no stack", "before trace")
_OOM = ACTION_CODE["oom"]


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


def _check_bytes(values: np.ndarray, what: str, device: str, limits: Limits) -> None:
    bad = np.flatnonzero((values < 0) | (values > limits.max_bytes))
    if bad.shape[0]:
        raise SnapshotRefused(f"{what} of {int(values[bad[0]]):,} bytes at event {int(bad[0])} of {device} is "
                              f"outside 0..{limits.max_bytes:,} (Limits.max_bytes): not a plausible snapshot")


def convert_rows(data: Any, rows: EventRows, *, kind: str, step: int, rank: int = 0,
                 limits: Limits | None = None, classifier: FrameClassifier | None = None) -> Snapshot:
    """Convert a torch snapshot whose traces were read into ``rows`` (see :mod:`.pickle_stream`)."""
    limits = limits or rows.limits
    segments: Any
    traces: Any
    top: Mapping[str, Any]
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
    cols: dict[str, Any] = {c: rows.column(c) for c in ("action", "addr", "size", "time", "stack", "meta")}
    cols["streams"] = rows.streams  # by row, segment events only
    cols["pools"], cols["pool_ids"] = rows.pools, rows.pool_ids  # by row, segment and oom events with a pool_id
    devices_idx = sorted({d for d, r in per_dev.items() if r.shape[0]} | set(seg_by_dev))
    tcol = cols["time"]  # every row is an event of a device trace
    known = tcol != NO_TIME
    t0 = int(np.min(tcol, initial=np.iinfo(np.int64).max, where=known)) if bool(known.any()) else None
    del known
    # block frames come from the segments: intern their stacks before categories are computed
    seg_stacks = {id(b): rows.stack_id(_block_frames(b)) for segs in seg_by_dev.values() for sg in segs
                  for b in (sg.get("blocks") or []) if isinstance(b, Mapping)}
    seg_stacks.update({id(sg): rows.stack_id(sg.get("frames")) for segs in seg_by_dev.values() for sg in segs})
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
                    devices=devices or [Device(name="", time_us=np.zeros(0, dtype=np.int64),
                                               allocs=empty_columns(COLUMNS))],
                    meta=meta)
    snap.default_device = snap.choose_default()
    return snap


def _block_frames(b: Mapping[str, Any]) -> Any:
    """A block's stack: ``frames``, or in torch 2.0 its ``history``'s newest entry (the first)."""
    if "frames" in b:
        return b.get("frames")
    hist = b.get("history")
    if isinstance(hist, list) and hist and isinstance(hist[0], Mapping):
        return hist[0].get("frames")
    return None


def _requested(b: Mapping[str, Any], bsize: int) -> int:
    """A block's requested bytes: ``requested_size``, torch 2.0's ``history[0].real_size``, else its size."""
    req = b.get("requested_size")
    if not (isinstance(req, int) and not isinstance(req, bool) and 0 < req <= bsize):
        hist = b.get("history")
        req = hist[0].get("real_size") if isinstance(hist, list) and hist and isinstance(hist[0], Mapping) else None
    return req if isinstance(req, int) and not isinstance(req, bool) and 0 < req <= bsize else bsize


def _round512(size: np.ndarray) -> np.ndarray:
    """The allocator's least rounding of a request: up to a multiple of 512 bytes, at least 512."""
    return np.maximum(512, (size + 511) // 512 * 512) - size


def _range(idx: np.ndarray) -> list[slice] | None:
    """``idx`` as a few runs of consecutive rows (a trace's first events are read apart, so a trace
    is a handful of runs), or None when it is scattered."""
    if not idx.shape[0]:
        return [slice(0, 0)]
    breaks = np.flatnonzero(np.diff(idx) != 1) + 1
    if breaks.shape[0] > 64:
        return None
    bounds = [0, *breaks.tolist(), idx.shape[0]]
    return [slice(int(idx[a]), int(idx[b - 1]) + 1) for a, b in zip(bounds[:-1], bounds[1:])]


def _view(col: np.ndarray, idx: np.ndarray, rng: list[slice] | None) -> np.ndarray:
    """``col[idx]``: a view for one run, joined slices for a few, a gather otherwise."""
    if rng is None:
        return col[idx]
    return col[rng[0]] if len(rng) == 1 else np.concatenate([col[r] for r in rng])


def _final_segments(name: str, segs: list[Mapping[str, Any]], seg_stacks: dict[int, int],
                    limits: Limits) -> tuple[list[FinalSegment], list[tuple[int, int, int, int, int]]]:
    """The final segments, and every block in them as (address, block size, requested bytes,
    stack, state: 0 inactive, 1 allocated, 2 pending free)."""
    finals, blocks = [], []
    for seg in segs:
        total = seg.get("total_size", 0)
        if isinstance(total, bool) or not isinstance(total, int) or not 0 <= total <= limits.max_bytes:
            raise SnapshotRefused(f"a segment of {name} has total_size {total!r}, outside 0..{limits.max_bytes:,}")
        base = seg.get("address", 0)
        base = base if isinstance(base, int) and not isinstance(base, bool) and base >= 0 else 0
        pool = seg.get("segment_pool_id")
        pool = (int(pool[0]), int(pool[1])) if isinstance(pool, (tuple, list)) and len(pool) == 2 and all(
            isinstance(x, int) and not isinstance(x, bool) for x in pool) else None
        stream = seg.get("stream", 0)
        finals.append(FinalSegment(addr=base, size=total, stream=stream if isinstance(stream, int) else 0,
                                   pool=pool, stack=seg_stacks.get(id(seg), -1), flags=segment_flags(seg)))
        for b in seg.get("blocks") or ():
            if not isinstance(b, Mapping):
                continue
            bsize = b.get("size", 0)
            baddr = b.get("address", base)
            if isinstance(bsize, bool) or not isinstance(bsize, int) or not 0 <= bsize <= limits.max_bytes:
                raise SnapshotRefused(f"a block of {name} has size {bsize!r}, outside 0..{limits.max_bytes:,}")
            baddr = baddr if isinstance(baddr, int) and not isinstance(baddr, bool) else base
            base = baddr + bsize
            state = {"active_allocated": 1, "active_pending_free": 2}.get(str(b.get("state")), 0)
            blocks.append((baddr, bsize, _requested(b, bsize), seg_stacks.get(id(b), -1), state))
    return finals, blocks


def _device(d: int, idx: np.ndarray, cols: dict[str, Any], segs: list[Mapping[str, Any]],
            seg_stacks: dict[int, int], cat_of_stack: np.ndarray, t0: int | None, top: Any,
            limits: Limits, meta_strings: list[str]) -> Device:
    name = f"cuda:{d}"
    rng = _range(idx)
    act, addr, size = _view(cols["action"], idx, rng), _view(cols["addr"], idx, rng), _view(cols["size"], idx, rng)
    stack, meta_col = _view(cols["stack"], idx, rng), _view(cols["meta"], idx, rng)
    _check_bytes(size, "a size", name, limits)
    time_us, has_time = _times(_view(cols["time"], idx, rng), t0)
    p = pair_allocations(act, addr)

    def cats(st: np.ndarray) -> np.ndarray:
        return np.where(st >= 0, cat_of_stack[np.maximum(st, 0)] if cat_of_stack.shape[0] else 4, 4)

    # memory alive before the trace (start -1): frees without an alloc, blocks no traced alloc made
    before: dict[str, list[np.ndarray]] = {c: [] for c in (*COLUMNS, *EXTRA_COLUMNS)}

    def add(**values: Any) -> None:
        n = values["size"].shape[0]
        for c in before:
            before[c].append(np.broadcast_to(np.asarray(values[c], dtype=np.int64), (n,)))

    unknown = CATEGORIES.index("before trace")
    for ev, ends, req, flags in ((p.lone_done, p.lone_done, p.lone_done_req, FLAG_FREE_SITE),
                                 (p.lone_req, np.full(p.lone_req.shape[0], -1), p.lone_req,
                                  FLAG_FREE_SITE | FLAG_PENDING_FREE)):
        sz = size[ev]
        add(start=-1, end=ends, size=sz, category=unknown, stack=stack[ev].astype(np.int64), addr=addr[ev],
            flags=flags, freereq=req, round=_round512(sz))
    finals, blocks = _final_segments(name, segs, seg_stacks, limits)
    alive_addr = np.concatenate([addr[p.starts[p.ends < 0]], addr[p.lone_req]])
    active = [b for b in blocks if b[4]]
    if active:
        b_addr, b_size, b_req, b_stack, b_state = (np.array(x, dtype=np.int64) for x in zip(*active))
        u = ~np.isin(b_addr, alive_addr)
        if u.any():  # alive when the snapshot was taken, allocated before the trace
            add(start=-1, end=-1, size=b_req[u], category=np.where(b_stack[u] >= 0, cats(b_stack[u]), unknown),
                stack=b_stack[u], addr=b_addr[u], flags=np.where(b_state[u] == 2, FLAG_PENDING_FREE, 0),
                freereq=-1, round=b_size[u] - b_req[u])
    head = {c: np.concatenate(v) if v else np.zeros(0, dtype=np.int64) for c, v in before.items()}
    first = np.lexsort((head["end"],))  # by start (all -1), then end: the order the viewer ships
    # the columns: what was alive before the trace, then the traced allocations written in place
    n_head = first.shape[0]
    allocs = {c: np.empty(n_head + p.starts.shape[0], dtype=np.int64) for c in head}
    for c in head:
        allocs[c][:n_head] = head[c][first]
    t = {c: v[n_head:] for c, v in allocs.items()}
    t["start"][:] = p.starts
    t["end"][:] = p.ends
    np.take(size, p.starts, out=t["size"])
    t["stack"][:] = stack[p.starts]
    t["category"][:] = cats(t["stack"])
    np.take(addr, p.starts, out=t["addr"])
    np.multiply(p.pending, FLAG_PENDING_FREE, out=t["flags"])
    t["freereq"][:] = p.freereq
    t["round"][:] = _round512(t["size"])
    del t
    if active:
        # the real block size of what is alive at the end (the rest: the allocator's least rounding)
        alive = np.flatnonzero(allocs["end"] < 0)
        order = np.argsort(b_addr)
        pos = np.minimum(np.searchsorted(b_addr[order], allocs["addr"][alive]), b_addr.shape[0] - 1)
        hit = b_addr[order][pos] == allocs["addr"][alive]
        real = b_size[order][pos] - allocs["size"][alive]
        ok = hit & (real >= 0)
        allocs["round"][alive[ok]] = real[ok]
    ev_pools = {k: cols["pool_ids"][v] for k, v in _local_streams(cols["pools"], idx, rng).items()}
    ooms: list[dict[str, Any]] = [{"event": int(i), "requested_bytes": int(size[i]), "free_bytes": int(addr[i]),
             "time_us": int(time_us[i] + (t0 or 0)) if has_time else None}
            for i in np.flatnonzero(act == _OOM).tolist()]
    for o in ooms:  # the memory pool the request was for (torch >= 2.11 records it)
        if o["event"] in ev_pools:
            o["pool"] = list(ev_pools[o["event"]])
    for o in ooms:
        if not 0 <= o["free_bytes"] <= limits.max_bytes:
            raise SnapshotRefused(f"an oom event of {name} reports {o['free_bytes']:,} bytes free, outside "
                                  f"0..{limits.max_bytes:,}")
    markers = _markers(d, act, meta_col, time_us, t0, has_time, top, meta_strings)
    streams = _local_streams(cols["streams"], idx, rng)
    pieces = segment_pieces(act, addr, size, stack, streams, finals, ev_pools)
    dev = Device(name=name, time_us=time_us, allocs=allocs, has_time=has_time, reserved_bytes=sum(f.size for f in finals)
                 if segs else None, segments=len(segs), ooms=ooms, markers=markers,
                 segs=pieces.cols if (segs or pieces.cols["size"].shape[0]) else None, streams=pieces.streams,
                 pools=pieces.pools)
    total = int(allocs["size"].sum()) if allocs["size"].shape[0] else 0
    if total >= 2**62:
        raise SnapshotRefused(f"the allocations of {name} add up to {total:,} bytes: not a plausible snapshot")
    if p.reused:
        dev.markers.append({"event": -1, "label": f"{p.reused} addresses reallocated without a free in the trace",
                            "kind": "note"})
    return dev


def _local_streams(streams: dict[int, int], idx: np.ndarray, rng: list[slice] | None) -> dict[int, int]:
    """The streams of segment events by position on the device's axis (``streams`` is by row; so are
    the pools of :attr:`~tbmem._internal.snapshot.pickle_rows.EventRows.pools`, which this maps the same way)."""
    if not streams or not idx.shape[0]:
        return {}
    if rng is not None:
        out, offset = {}, 0
        for r in rng:
            out.update({k - r.start + offset: v for k, v in streams.items() if r.start <= k < r.stop})
            offset += r.stop - r.start
        return out
    keys = np.fromiter(streams.keys(), dtype=np.int64, count=len(streams))
    order = np.argsort(idx, kind="stable")
    pos = np.minimum(np.searchsorted(idx[order], keys), idx.shape[0] - 1)
    hit = idx[order][pos] == keys
    return {int(order[q]): streams[int(k)] for q, k in zip(pos[hit].tolist(), keys[hit].tolist())}


def _times(t: np.ndarray, t0: int | None) -> tuple[np.ndarray, bool]:
    """Event times relative to ``t0`` (an event without ``time_us`` takes its predecessor's), and
    whether the trace has a clock at all."""
    missing = t == NO_TIME
    if not t.shape[0] or bool(missing.all()):
        return np.zeros(t.shape[0], dtype=np.int64), False
    if missing.any():
        present = np.where(~missing, np.arange(t.shape[0]), 0)
        t = t[np.maximum.accumulate(present)]
        t = np.where(t == NO_TIME, t0 or 0, t)
    return t - (t0 or 0), True


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
                           device: int | None = None, limits: Limits | None = None,
                           device_type: str = "cuda") -> Snapshot:
    """Convert ``torch.cuda.memory._snapshot()``'s dict (or the list of segments) into a Snapshot.

    Args:
        data: The snapshot dict, or a list of segments.
        kind: ``"snapshot"`` or ``"oom"``.
        step: Training step the snapshot belongs to.
        rank: Distributed rank.
        device: The default device (shown first); None: the OOM device, else the largest peak.
        device_type: What the devices are named after (``"xpu"``: ``torch.xpu.memory._snapshot()``'s
            dict, the same format, names ``xpu:N``).
    """
    rows = EventRows(limits or Limits())
    snap = convert_rows(data, rows, kind=kind, step=step, rank=rank, limits=limits)
    if device_type != "cuda":
        for dv in snap.devices:
            if dv.name.startswith("cuda:"):
                dv.name = f"{device_type}:{dv.name[5:]}"
        snap.meta["recorder"] = f"torch.{device_type}.memory._record_memory_history"
    if device is not None:
        names = [dv.name for dv in snap.devices]
        if f"{device_type}:{device}" in names:
            snap.default_device = names.index(f"{device_type}:{device}")
    return snap
