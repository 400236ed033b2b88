"""A real CUDA snapshot with what the allocator view names (a side stream, a CUDA graph's private pool, a
pending free, split segments), and tbmem's split of the reserved bytes beside torch's own counters.

Run on a GPU: ``python -m tests.snapshot._gpu_capture [OUT.pickle]`` prints one JSON object; the gpu test
(tests/snapshot/test_gpu_allocator.py) asserts on it. Needs torch with CUDA; imports no pytest.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from typing import Any

__all__ = ["capture_and_compare"]


def _workload(torch: Any) -> list[Any]:
    keep = []
    dev = torch.device("cuda")
    # many small and large blocks, every other one freed: split segments with inactive blocks
    blocks = [torch.empty(int(1.5 * 2**20) + 4096 * i, dtype=torch.uint8, device=dev) for i in range(24)]
    small = [torch.empty(1000 + 7 * i, dtype=torch.uint8, device=dev) for i in range(64)]
    keep += blocks[::2] + small[::3]
    del blocks, small
    # a side stream's own segment
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        keep.append(torch.empty(8 * 2**20, dtype=torch.uint8, device=dev))
    # a tensor used on the side stream, freed on the default one: its free stays pending while the
    # side stream still runs work queued after it (record_stream)
    busy = torch.empty(3 * 2**20, dtype=torch.uint8, device=dev)
    big = torch.ones(4096, 4096, device=dev)
    with torch.cuda.stream(side):
        torch.cuda._sleep(2_000_000_000)  # keeps the side stream busy for about a second
        busy.record_stream(side)
        keep.append(big @ big)
    del busy
    # a CUDA graph's private pool
    x = torch.ones(256, 256, device=dev)
    g = torch.cuda.CUDAGraph()
    warm = torch.cuda.Stream()
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):
        (x @ x).sum()
    torch.cuda.current_stream().wait_stream(warm)
    with torch.cuda.graph(g):
        y = x @ x
    keep += [g, y, x, big]
    return keep


def capture_and_compare(out: str | None = None) -> dict[str, Any]:
    """Record a snapshot of :func:`_workload`, dump it, read it with tbmem; both sides' numbers."""
    import torch

    from tbmem._internal.snapshot.allocator import allocator_state
    from tbmem._internal.snapshot.readers import load_snapshot

    torch.cuda.memory._record_memory_history(max_entries=100_000)
    keep = _workload(torch)
    stats = torch.cuda.memory_stats()
    path = out or os.path.join(tempfile.mkdtemp(), "gpu_snapshot.pickle")
    torch.cuda.memory._dump_snapshot(path)
    torch.cuda.memory._record_memory_history(enabled=None)
    snap = load_snapshot(path)
    dev = snap.devices[snap.device_index(str(torch.cuda.current_device()))]
    st = allocator_state(dev, dev.n_events - 1, snap.categories)
    del keep
    return {
        "torch": torch.__version__, "device": torch.cuda.get_device_name(), "path": path,
        "ours": {"reserved": st.reserved, "requested": sum(st.by_category.values()),
                 "allocated_blocks": sum(st.by_category.values()) + int(st.alloc_rounding[~st.alloc_pending].sum()),
                 "active_blocks": sum(st.by_category.values()) + st.pending_free + st.rounding,
                 "requested_incl_pending": sum(st.by_category.values()) + st.pending_free,
                 "inactive_split": st.inactive_split, "pending": st.pending_free, "segments": st.n_segments,
                 "streams": len(dev.streams), "pools": dev.pools, "outside": st.outside_bytes},
        "torch_stats": {"reserved": stats["reserved_bytes.all.current"], "requested": stats["requested_bytes.all.current"],
                        "allocated_blocks": stats["allocated_bytes.all.current"],
                        "active_blocks": stats["active_bytes.all.current"],
                        "inactive_split": stats["inactive_split_bytes.all.current"],
                        "segments": stats["segment.all.current"]},
    }


if __name__ == "__main__":
    print(json.dumps(capture_and_compare(sys.argv[1] if len(sys.argv) > 1 else None), default=str))
