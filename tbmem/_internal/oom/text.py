"""The explanation as one block of text: printed on stderr at the error, written to the run's text tab.

Example:
    >>> from tbmem._internal.oom.explain import OomExplanation
    >>> x = OomExplanation(device="cuda:0", requested_bytes=2 << 30, device_free_bytes=1 << 30,
    ...                    device_total_bytes=80 << 30, reserved_bytes=78 << 30, allocated_bytes=77 << 30,
    ...                    live_requested_bytes=77 << 30,
    ...                    pending_free_bytes=0, inactive_split_bytes=1 << 30, free_segment_bytes=0,
    ...                    rounding_bytes=0, largest_free_block_bytes=1 << 29, free_blocks=[], live_by_category={},
    ...                    live_by_site=[], settings={}, outside_allocator_bytes=1 << 30, verdict="fragmented")
    >>> explanation_text(x).splitlines()[0]
    'tbmem: why cuda:0 ran out of memory: no contiguous block of 2.0 GiB existed (largest free block 512.0 MiB)'
"""

from __future__ import annotations

from tbmem._internal.oom.explain import OomExplanation
from tbmem._internal.snapshot.units import format_bytes

__all__ = ["explanation_text", "headline"]


def _b(n: int | None) -> str:
    return "not known" if n is None else format_bytes(n)


def _outside(x: OomExplanation) -> str:
    """What NVML tells of the bytes outside the allocator: the other processes' and this one's own."""
    if x.other_processes_bytes is None or x.outside_allocator_bytes is None:
        return ""
    own = max(x.outside_allocator_bytes - x.other_processes_bytes, 0)
    return (f" = other processes {_b(x.other_processes_bytes)} (NVML) + this process outside the allocator "
            f"{_b(own)} (CUDA context, NCCL, cuBLAS/cuDNN workspaces)")


def headline(x: OomExplanation) -> str:
    """One sentence: what made the request fail."""
    req = _b(x.requested_bytes)
    return {"fragmented": f"no contiguous block of {req} existed (largest free block "
                          f"{_b(x.largest_free_block_bytes)})",
            "pending_free": f"{req} would fit once the blocks pending free on other streams are released",
            "device_full": f"the device was full: {req} requested, {_b(x.device_free_bytes)} free on the device "
                           f"and {_b(x.inactive_split_bytes + x.free_segment_bytes)} free inside PyTorch's segments",
            "larger_than_device": f"the request of {req} is larger than the device ({_b(x.device_total_bytes)})",
            }.get(x.verdict, f"{req} requested; the allocator's state is not known")


def explanation_text(x: OomExplanation, *, sites: int = 5) -> str:
    """The block: headline, the device's bytes, free blocks, live memory, settings, advice."""
    who = x.device + (f" (rank {x.rank})" if x.rank else "")
    lines = [f"tbmem: why {who} ran out of memory: {headline(x)}",
             (f"  device: total {_b(x.device_total_bytes)}, free {_b(x.device_free_bytes)} (driver); "
              f"outside PyTorch's allocator {_b(x.outside_allocator_bytes)}" + _outside(x)),
             (f"  reserved {_b(x.reserved_bytes)} = live tensors {_b(x.live_requested_bytes)} + pending free "
              f"{_b(x.pending_free_bytes)} + inactive split {_b(x.inactive_split_bytes)} + free segments "
              f"{_b(x.free_segment_bytes)} + rounding {_b(x.rounding_bytes)}")]
    for g in x.free_blocks[:4]:
        pool = "default pool" if g["pool"] == [0, 0] else f"pool {tuple(g['pool'])}"
        lines.append(f"  largest free block {_b(g['largest_free_block_bytes'])} of {_b(g['free_bytes'])} free: "
                     f"{g['kind']} {pool}, stream {g['stream']}, {g['segments']} segment(s)"
                     + (" (expandable)" if g["expandable"] else "")
                     + (" <- the request's pool" if x.pool is not None and g["pool"] == x.pool else ""))
    if x.live_by_category:
        lines.append("  live by category (allocator snapshot): " + ", ".join(f"{k} {_b(v)}" for k, v in x.live_by_category.items()))
    if x.census is not None:
        found = {k: v for k, v in x.census.items() if v and k != "unattributed"}
        line = ", ".join(f"{k} {_b(v)}" for k, v in sorted(found.items(), key=lambda kv: -kv[1])) or "no tensor found"
        if "unattributed" in x.census:
            line += f"; unattributed (allocated, no tensor found for it) {_b(x.census['unattributed'])}"
        lines.append(f"  live on {x.device} by category (census at the error): {line}")
        for dev, cats in (x.census_elsewhere or {}).items():
            lines.append(f"  census on {dev}: " + ", ".join(
                f"{k} {_b(v)}" for k, v in sorted(cats.items(), key=lambda kv: -kv[1])))
    for row in x.live_by_site[:sites]:
        lines.append(f"  live {_b(row['bytes'])} in {row['count']} block(s): {row['site']}")
    s = x.settings
    lines.append(f"  allocator settings ({s.get('source', 'unknown')}): PYTORCH_CUDA_ALLOC_CONF="
                 f"{s.get('PYTORCH_CUDA_ALLOC_CONF')!r}, expandable_segments {s.get('expandable_segments')}, "
                 f"max_split_size_mb {s.get('max_split_size_mb')}, garbage_collection_threshold "
                 f"{s.get('garbage_collection_threshold')}" + ("" if x.retries is None else f"; {x.retries} retries"))
    lines += [f"  note: {n}" for n in x.notes]
    lines += [f"  advice: {a['text']}" for a in x.advice]
    return "\n".join(lines)
