"""PyTorch's allocator snapshots converted to tbmem's snapshot format (no torch import).

:func:`convert_torch_snapshot` turns torch's snapshot dict (``segments`` + ``device_traces``) into a
:class:`~tbmem.snapshot.schema.Snapshot`. An allocation starts at its ``alloc``
event and ends at its ``free_completed`` event (``free_requested`` when the
completion is not in the trace); frees without an ``alloc`` in the trace and
active blocks of the segments without one are allocations made before
recording started. The allocator does not know what a block is for, so the
category is inferred from the Python stack (``backward``, ``optimizer``,
``activation``) or ``unknown``.

Example:
    >>> from tbmem.snapshot.cuda import convert_torch_snapshot
    >>> f = [{"filename": "train.py", "line": 3, "name": "step"}]
    >>> torch_dict = {"segments": [], "device_traces": [[
    ...     {"action": "alloc", "addr": 64, "size": 512, "frames": f, "time_us": 10},
    ...     {"action": "free_requested", "addr": 64, "size": 512, "frames": f, "time_us": 12},
    ...     {"action": "free_completed", "addr": 64, "size": 512, "frames": f, "time_us": 13}]]}
    >>> snap = convert_torch_snapshot(torch_dict, kind="snapshot", step=0)
    >>> snap.n_events, snap.peak_bytes(), snap.stack_frames(0)
    (2, 512, [('train.py', 3, 'step')])
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from tbmem.snapshot.schema import Frame, Snapshot, SnapshotBuilder

__all__ = ["convert_torch_snapshot", "guess_category"]

_ACTIVE_STATES = ("active_allocated", "active_pending_free")


def guess_category(frames: Sequence[Frame]) -> str:
    """A category from a stack: the allocator itself records none."""
    for filename, _line, name in frames:
        path = filename.replace("\\", "/")
        if "/torch/autograd/" in path or (name == "backward" and "/torch/_tensor.py" in path):
            return "backward"
        if "/torch/optim/" in path:
            return "optimizer"
    return "activation" if frames else "unknown"


def _frames(raw: Any) -> list[Frame]:
    out: list[Frame] = []
    for f in raw or ():
        if isinstance(f, Mapping):
            out.append((str(f.get("filename", "?")), int(f.get("line", 0) or 0), str(f.get("name", "?"))))
    return out


def _pick_device(traces: Sequence[Any], segments: Sequence[Any], device: int | None) -> int:
    if device is not None:
        return device
    counts = [len(t) for t in traces]
    if counts and max(counts) > 0:
        return counts.index(max(counts))
    devices = [int(s.get("device", 0)) for s in segments if isinstance(s, Mapping)]
    return devices[0] if devices else 0


def convert_torch_snapshot(data: Mapping[str, Any], *, kind: str, step: int, rank: int = 0,
                           device: int | None = None) -> Snapshot:
    """Convert ``torch.cuda.memory._snapshot()``'s dict for one device into a :class:`Snapshot`.

    Args:
        data: The snapshot dict (``segments``, ``device_traces``).
        kind: ``"snapshot"`` or ``"oom"``.
        step: Training step the snapshot belongs to.
        rank: Distributed rank.
        device: CUDA device index; None picks the device with the most trace events.
    """
    traces = data.get("device_traces") or []
    segments = data.get("segments") or []
    dev = _pick_device(traces, segments, device)
    trace = traces[dev] if dev < len(traces) else []
    b = SnapshotBuilder(source="cuda", device=f"cuda:{dev}")
    # torch shares one dict per unique frame: cache on identities (the objects live as long as ``data``)
    list_cache: dict[int, tuple[int, str]] = {}
    stack_cache: dict[tuple[int, ...], tuple[int, str]] = {}

    def stack_of(raw: Any) -> tuple[int, str]:
        hit = list_cache.get(id(raw))
        if hit is not None:
            return hit
        key = tuple(map(id, raw or ()))
        hit = stack_cache.get(key)
        if hit is None:
            frames = _frames(raw)
            hit = stack_cache[key] = (b.stack_id(frames), guess_category(frames))
        list_cache[id(raw)] = hit
        return hit

    live: dict[int, int] = {}  # addr -> allocation index
    pending: dict[int, int] = {}  # addr -> allocation index, free requested but not completed
    pending_time: dict[int, int] = {}
    oom: list[dict[str, int]] = []
    for e in trace:
        action = e.get("action")
        addr = int(e.get("addr", 0) or 0)
        t = int(e.get("time_us", 0) or 0)
        if action == "alloc":
            stack_id, cat = stack_of(e.get("frames"))
            live[addr] = b.alloc(int(e.get("size", 0)), category=e.get("category") or cat,
                                 time_us=t, addr=addr, stack_id=stack_id)
        elif action == "free_requested":
            if addr in live:
                pending[addr] = live.pop(addr)
                pending_time[addr] = t
        elif action == "free_completed":
            idx = pending.pop(addr, None)
            pending_time.pop(addr, None)
            if idx is None:
                idx = live.pop(addr, None)
            if idx is None:  # allocated before recording started
                stack_id, cat = stack_of(e.get("frames"))
                idx = b.alloc(int(e.get("size", 0)), category=e.get("category") or cat,
                              addr=addr, preexisting=True, stack_id=stack_id)
            b.free(idx, time_us=t)
        elif action == "oom":
            oom.append({"size": int(e.get("size", 0)), "device_free": int(e.get("device_free", 0) or 0)})
    for addr, idx in pending.items():  # never completed within the trace: freed when requested
        b.free(idx, time_us=pending_time[addr])
    alive = set(live)
    reserved = 0
    for seg in segments:
        if not isinstance(seg, Mapping) or int(seg.get("device", dev)) != dev:
            continue
        reserved += int(seg.get("total_size", 0))
        addr = int(seg.get("address", 0) or 0)
        for block in seg.get("blocks") or ():
            size = int(block.get("size", 0))
            baddr = int(block.get("address", addr))
            if block.get("state") in _ACTIVE_STATES and baddr not in alive:
                stack_id, cat = stack_of(block.get("frames"))
                b.alloc(int(block.get("requested_size", size) or size), category=cat, addr=baddr,
                        preexisting=True, stack_id=stack_id)
            addr = baddr + size
    b.meta.update({"reserved_bytes": reserved, "segments": len(segments)})
    if oom:
        b.meta["oom_events"] = oom
    return b.build(kind=kind, step=step, rank=rank)
