"""Why an allocation ran out of memory, in numbers: computed from a snapshot's state at the ``oom`` event.

At an out-of-memory error the caching allocator had already given back its free segments and
retried (``release_cached_blocks``). What is left splits the device::

    device total = driver free + reserved (allocated + pending free + inactive split + free segments
                   + rounding) + outside the allocator (CUDA context, NCCL, cuBLAS workspaces, other processes)

A request fails either because *the device was full* (driver free plus every reusable reserved byte
is less than the request) or because *no contiguous block of this size existed* (enough bytes were
free, split across blocks and segments: fragmentation). The two are told apart by the largest free
block per memory pool and stream: a request of 1 MiB or more is served from the large pool of its
stream and pool, a smaller one from the small pool. Pending frees (blocks freed on one stream and
still used by another) count as free only after their stream's work completes: a request that they
would have satisfied can succeed on a retry (the allocator's own retries do not wait for them).

Nothing here imports torch (it serves ``tbmem snapshot stats``, the viewer and the Memory tab);
:mod:`tbmem._internal.oom.runtime` reads the live allocator at the moment of the error.

Example:
    >>> import numpy as np
    >>> from tbmem._internal.snapshot.model import Device, SEG_LARGE
    >>> a = {"start": np.array([-1]), "end": np.array([-1]), "size": np.array([6 << 20]),
    ...      "addr": np.array([(1 << 30) + (7 << 20)])}
    >>> s = {"addr": np.array([1 << 30]), "size": np.array([20 << 20]), "start": np.array([-1]),
    ...      "end": np.array([-1]), "stream": np.array([0]), "pool": np.array([0]), "stack": np.array([-1]),
    ...      "flags": np.array([SEG_LARGE])}
    >>> dev = Device(name="cuda:0", time_us=np.zeros(0, dtype=np.int64), allocs=a, segs=s, streams=[0],
    ...              pools=[[0, 0]])
    >>> x = explain_device(dev, {"requested_bytes": 10 << 20, "free_bytes": 0}, categories=["python code"],
    ...                    strings=[], frames=[], stacks=[])
    >>> x.verdict, x.largest_free_block_bytes >> 20, x.inactive_split_bytes >> 20, x.advice[0]["kind"]
    ('fragmented', 7, 14, 'expandable_segments')
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from tbmem._internal.oom.census import elsewhere, on_device
from tbmem._internal.oom.settings import AllocatorSettings
from tbmem._internal.snapshot.allocator import AllocatorState, allocator_state
from tbmem._internal.snapshot.model import FLAG_FREE_SITE, SEG_EXPANDABLE, SEG_SMALL, Device
from tbmem._internal.snapshot.units import format_bytes

__all__ = ["SMALL_REQUEST", "VERDICTS", "OomExplanation", "explain_device", "free_blocks", "live_by_site"]

#: Requests below this go to the small pool (torch's ``kSmallSize``).
SMALL_REQUEST = 1 << 20
#: What the explanation can conclude.
VERDICTS = ("fragmented", "pending_free", "device_full", "larger_than_device", "unknown")
_TOP_SITES = 10


@dataclass
class OomExplanation:
    """One out-of-memory error explained (see the module docstring); ``to_json`` is the ``stats --json``
    entry of a device's ``ooms``, :func:`tbmem._internal.oom.text.explanation_text` the block printed at the error."""

    device: str
    requested_bytes: int | None
    device_free_bytes: int | None
    device_total_bytes: int | None
    reserved_bytes: int
    allocated_bytes: int
    live_requested_bytes: int
    pending_free_bytes: int
    inactive_split_bytes: int
    free_segment_bytes: int
    rounding_bytes: int
    largest_free_block_bytes: int
    free_blocks: list[dict[str, Any]]
    live_by_category: dict[str, int]
    live_by_site: list[dict[str, Any]]
    settings: dict[str, Any]
    outside_allocator_bytes: int | None
    verdict: str
    advice: list[dict[str, Any]] = field(default_factory=list)
    rank: int | None = None
    step: int | None = None
    event: int | None = None
    time_us: int | None = None
    retries: int | None = None
    census: dict[str, int] | None = None
    census_elsewhere: dict[str, dict[str, int]] | None = None
    pool: list[int] | None = None
    other_processes_bytes: int | None = None
    process_device_bytes: int | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def reserved_unused_bytes(self) -> int:
        """Reserved bytes that hold no live tensor: pending free, inactive split, free segments, rounding."""
        return self.pending_free_bytes + self.inactive_split_bytes + self.free_segment_bytes + self.rounding_bytes

    def to_json(self) -> dict[str, Any]:
        """Plain data (the fields, and ``reserved_unused_bytes``)."""
        out = asdict(self)
        out["reserved_unused_bytes"] = self.reserved_unused_bytes
        return out


def free_blocks(dev: Device, state: AllocatorState) -> list[dict[str, Any]]:
    """Per (pool, stream, small/large): free bytes inside segments and the largest contiguous free block.

    A block's extent is its size plus the allocator's rounding (:func:`allocator_state`); pending
    frees are not free. Contiguous mapped ranges of an expandable segment are one segment.
    """
    seg = state.seg
    n = state.n_segments
    if n == 0:
        return []
    starts, ends = seg["addr"], seg["addr"] + seg["size"]
    inside = state.alloc_segment >= 0
    pos = state.alloc_segment[inside]
    b0 = dev.allocs["addr"][state.alive][inside]
    b1 = b0 + dev.allocs["size"][state.alive][inside] + state.alloc_rounding[inside]
    order = np.lexsort((b0, pos))
    pos, b0, b1 = pos[order], b0[order], b1[order]
    largest = seg["size"].copy()  # a segment holding no block is one free block
    if pos.shape[0]:
        first = np.ones(pos.shape[0], dtype=bool)
        first[1:] = pos[1:] != pos[:-1]
        last = np.ones(pos.shape[0], dtype=bool)
        last[:-1] = pos[1:] != pos[:-1]
        prev_end = np.where(first, starts[pos], np.concatenate(([0], np.maximum.accumulate(b1)[:-1])))
        gap_before = np.maximum(b0 - prev_end, 0)
        held = np.unique(pos)
        largest[held] = 0
        np.maximum.at(largest, pos, gap_before)
        np.maximum.at(largest, pos[last], np.maximum(ends[pos[last]] - np.maximum.accumulate(b1)[last], 0))
    groups: dict[tuple[tuple[int, ...], int, str], dict[str, Any]] = {}
    for k in range(n):
        pool = tuple(state.pools[seg["pool"][k]]) if seg["pool"][k] >= 0 else (0, 0)
        stream = state.streams[seg["stream"][k]] if seg["stream"][k] >= 0 else 0
        kind = "small" if seg["flags"][k] & SEG_SMALL else "large"
        g = groups.setdefault((pool, stream, kind), {"pool": list(pool), "stream": int(stream), "kind": kind,
                                                      "segments": 0, "expandable": False, "free_bytes": 0,
                                                      "largest_free_block_bytes": 0})
        g["segments"] += 1
        g["expandable"] = g["expandable"] or bool(seg["flags"][k] & SEG_EXPANDABLE)
        g["free_bytes"] += int(seg["free"][k])
        g["largest_free_block_bytes"] = max(g["largest_free_block_bytes"], int(largest[k]))
    return sorted(groups.values(), key=lambda g: (-g["largest_free_block_bytes"], g["pool"], g["stream"], g["kind"]))


def live_by_site(dev: Device, state: AllocatorState, site_of_stack: np.ndarray,
                 label: Any) -> list[dict[str, Any]]:
    """Live bytes (requested, pending frees included) by allocation site, largest first.

    ``site_of_stack`` maps a stack id to a site id (-1: no site); ``label(site_id)`` names a site.
    Allocations known only from their free (made before the trace) are ``(allocated before the trace)``.
    """
    a = dev.allocs
    idx = state.alive
    stack = a["stack"][idx]
    site = np.where(stack >= 0, site_of_stack[np.maximum(stack, 0)] if site_of_stack.shape[0] else -1, -2)
    site = np.where((a["flags"][idx] & FLAG_FREE_SITE) != 0, -3, site)
    uniq, inv = np.unique(site, return_inverse=True)
    total = np.zeros(uniq.shape[0], dtype=np.int64)
    count = np.zeros(uniq.shape[0], dtype=np.int64)
    np.add.at(total, inv, a["size"][idx])
    np.add.at(count, inv, 1)
    names = {-1: "(no user frame)", -2: "(no stack recorded)", -3: "(allocated before the trace)"}
    rows = sorted(((int(t), names.get(int(u)) or str(label(int(u))), int(c))
                   for u, t, c in zip(uniq.tolist(), total.tolist(), count.tolist())), key=lambda r: (-r[0], r[1]))
    return [{"site": site, "bytes": b, "count": c} for b, site, c in rows]


def _need(requested: int) -> int:
    """Bytes the request occupies as a block (torch rounds up to 512, at least 512)."""
    return max(512, -(-requested // 512) * 512)


def _verdict(x: OomExplanation) -> str:
    if x.requested_bytes is None:
        return "unknown"
    need = _need(x.requested_bytes)
    if x.device_total_bytes is not None and need > x.device_total_bytes:
        return "larger_than_device"
    if x.largest_free_block_bytes >= need:
        return "fragmented"  # a block existed, but in another pool or stream than the request's
    free = x.device_free_bytes or 0
    reusable = x.inactive_split_bytes + x.free_segment_bytes
    if x.pool is not None:  # the request's pool known: only its free bytes could have served it
        reusable = sum(g["free_bytes"] for g in x.free_blocks if g["pool"] == x.pool)
    if free < need <= free + reusable:
        return "fragmented"
    if free + reusable < need <= free + reusable + x.pending_free_bytes:
        return "pending_free"
    return "device_full"


def _advice(x: OomExplanation, s: AllocatorSettings) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    unused = x.inactive_split_bytes + x.free_segment_bytes
    if x.verdict == "larger_than_device":
        out.append({"kind": "request_size", "bytes": x.requested_bytes,
                    "text": f"the request alone ({_b(x.requested_bytes)}) is more than the device's "
                            f"{_b(x.device_total_bytes)}: check the shape or batch size that asked for it"})
        return out
    if x.verdict == "fragmented":
        if s.expandable_segments is not True:
            out.append({"kind": "expandable_segments", "bytes": unused,
                        "text": f"PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: {_b(unused)} were reserved "
                                f"but free in pieces of at most {_b(x.largest_free_block_bytes)}; expandable "
                                "segments map memory where it is needed instead of splitting fixed segments"})
            if s.max_split_size_mb is None:
                out.append({"kind": "max_split_size_mb", "bytes": x.inactive_split_bytes,
                            "text": f"or max_split_size_mb:{max(20, (x.requested_bytes or 0) >> 20)}: "
                                    f"{_b(x.inactive_split_bytes)} of inactive split blocks could not be "
                                    "reused; blocks larger than this are then never split"})
        if s.garbage_collection_threshold in (None, 0, 0.0) and unused:
            out.append({"kind": "garbage_collection_threshold", "bytes": unused,
                        "text": "garbage_collection_threshold:0.8 lets the allocator give back "
                                f"unused cached blocks ({_b(unused)} now) before it reaches the limit"})
    if x.pending_free_bytes and x.verdict in ("pending_free", "fragmented", "device_full"):
        retry = x.verdict == "pending_free"
        out.append({"kind": "retry_after_free", "bytes": x.pending_free_bytes,
                    "text": f"{_b(x.pending_free_bytes)} were freed but still in use by another stream (pending "
                            "free); the allocator's retry does not wait for them"
                            + (": after torch.cuda.synchronize() the same allocation would fit" if retry else "")})
    if x.verdict == "device_full" and _need(x.requested_bytes or 0) > (x.device_free_bytes or 0) + x.reserved_bytes:
        out.append({"kind": "request_size", "bytes": x.requested_bytes,
                    "text": f"the request alone ({_b(x.requested_bytes)}) is more than the driver's free bytes and "
                            f"everything PyTorch had reserved together ({_b((x.device_free_bytes or 0) + x.reserved_bytes)}): "
                            "freeing tensors cannot make it fit; check the shape or batch size that asked for it"})
        return out
    if x.verdict in ("device_full", "pending_free"):
        short = _need(x.requested_bytes or 0) - (x.device_free_bytes or 0) - unused
        top = x.live_by_site[0] if x.live_by_site else None
        cats = {k: v for k, v in (x.census or {}).items() if k != "unattributed" and v}
        big = max(cats.items(), key=lambda kv: kv[1]) if cats else None
        out.append({"kind": "reduce_live", "bytes": max(short, 0),
                    "text": f"free at least {_b(max(short, 0))} of live memory ({_b(x.allocated_bytes)} allocated)"
                            + (f"; the largest site holds {_b(top['bytes'])}: {top['site']}" if top else "")
                            + (f"; the largest category is {big[0]} ({_b(big[1])})" if big else "")})
    if x.outside_allocator_bytes and x.device_total_bytes and x.outside_allocator_bytes > x.device_total_bytes // 20:
        out.append({"kind": "outside_allocator", "bytes": x.outside_allocator_bytes,
                    "text": f"{_b(x.outside_allocator_bytes)} of the device are outside PyTorch's allocator (CUDA "
                            "context, NCCL buffers, cuBLAS/cuDNN workspaces, other processes)"})
    return out


def _b(n: int | None) -> str:
    return "?" if n is None else format_bytes(n)


def explain_device(dev: Device, oom: Mapping[str, Any], *, categories: Sequence[str], strings: Sequence[str],
                   frames: Sequence[Sequence[int]], stacks: Sequence[Sequence[int]],
                   settings: Mapping[str, Any] | AllocatorSettings | None = None,
                   site_of_stack: np.ndarray | None = None, rank: int | None = None, step: int | None = None,
                   device_total: int | None = None, retries: int | None = None,
                   census: Mapping[str, Any] | None = None) -> OomExplanation:
    """The explanation of ``oom`` (an entry of ``dev.ooms``: ``event``, ``requested_bytes``, ``free_bytes``)
    from the allocator's state at that event (its last event when ``event`` is missing).

    ``settings``: the allocator settings the snapshot recorded (``allocator_settings``) or read at
    runtime; ``site_of_stack``: per stack id its site frame (default: none, every site unnamed);
    ``device_total``: the driver's total bytes where known (a snapshot file does not record it);
    ``census``: the census taken at the error (:func:`tbmem._internal.oom.census.census_doc`), whose bytes on
    this device become ``census`` (by category, and ``unattributed``), those elsewhere ``census_elsewhere``.
    """
    event = oom.get("event")
    event = dev.n_events - 1 if event is None or event < 0 else int(event)
    state = allocator_state(dev, event, categories)
    blocks = free_blocks(dev, state)
    req = oom.get("requested_bytes")
    req = None if req is None else int(req)
    pool_kind = "small" if req is not None and req < SMALL_REQUEST else "large"
    pool = oom.get("pool")  # the request's memory pool, where the trace recorded it (torch >= 2.11)
    pool = [int(pool[0]), int(pool[1])] if isinstance(pool, (list, tuple)) and len(pool) == 2 else None
    fitting = [g["largest_free_block_bytes"] for g in blocks if g["kind"] == pool_kind
               and (pool is None or g["pool"] == pool)]
    s = settings if isinstance(settings, AllocatorSettings) else AllocatorSettings.from_mapping(settings)
    sites = site_of_stack if site_of_stack is not None else np.full(len(stacks), -1, dtype=np.int64)

    def label(fid: int) -> str:
        f = frames[fid]
        return f"{strings[f[2]]} ({strings[f[0]]}:{f[1]})"

    free = oom.get("free_bytes")
    free = None if free is None else int(free)
    outside = None
    if device_total is not None and free is not None:
        outside = max(int(device_total) - free - state.reserved, 0)
    cats: dict[str, int] = {}
    for i in state.alive.tolist():
        name = categories[int(dev.allocs["category"][i])] if categories else "unknown"
        cats[name] = cats.get(name, 0) + int(dev.allocs["size"][i])
    x = OomExplanation(
        device=dev.name, requested_bytes=req, device_free_bytes=free,
        device_total_bytes=None if device_total is None else int(device_total),
        reserved_bytes=state.reserved, allocated_bytes=state.allocated,
        live_requested_bytes=int(sum(state.by_category.values())), pending_free_bytes=state.pending_free,
        inactive_split_bytes=state.inactive_split, free_segment_bytes=state.free_segments,
        rounding_bytes=state.rounding, largest_free_block_bytes=max(fitting, default=0), free_blocks=blocks,
        live_by_category=dict(sorted(cats.items(), key=lambda kv: -kv[1])),
        live_by_site=live_by_site(dev, state, sites, label)[:_TOP_SITES], settings=s.to_json(),
        outside_allocator_bytes=outside, verdict="unknown", rank=rank, step=step, event=event,
        time_us=None if oom.get("time_us") is None else int(oom["time_us"]), retries=retries,
        census=None if census is None else on_device(census, dev.name),
        census_elsewhere=None if census is None else elsewhere(census, dev.name), pool=pool)
    if state.outside_bytes:
        x.notes.append(f"{state.outside_bytes} bytes of live allocations lie in no segment of the file")
    if dev.segs is None:
        x.notes.append("the snapshot holds no allocator segments: free blocks cannot be told")
    x.verdict = _verdict(x)
    x.advice = _advice(x, s)
    return x

