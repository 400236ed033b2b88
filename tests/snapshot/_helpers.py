"""Snapshots built by hand for the snapshot tests."""

from __future__ import annotations

from tbmem.snapshot.schema import Snapshot, SnapshotBuilder

__all__ = ["small_snapshot", "EVIL"]

EVIL = "<script>alert(1)</script>"


def small_snapshot(frame_name: str = "forward", n: int = 40) -> Snapshot:
    """n allocations of growing size, the first half freed in order: the peak is at event n - 1."""
    b = SnapshotBuilder(source="dispatch", device="cpu")
    idx = []
    for i in range(n):
        cat = "activation" if i % 2 else "backward"
        idx.append(b.alloc(1024 * (i + 1), category=cat, time_us=10 * i,
                           stack=[("/home/u/train.py", 10 + i % 3, frame_name), ("/home/u/main.py", 5, "main")]))
    for i in range(n // 2):
        b.free(idx[i], time_us=10 * (n + i))
    b.alloc(4096, category="parameter", preexisting=True)
    return b.build(kind="snapshot", step=7)
