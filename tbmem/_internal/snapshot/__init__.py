"""Memory snapshots as run artifacts, with a self-contained offline timeline viewer.

Snapshots record which allocations were alive when, and which line of code
made them: through CUDA's allocator history on GPUs, a wrapper around torch's
CPU allocator on CPU, and a ``TorchDispatchMode`` recorder on every device. They are written as gzip JSON
(:mod:`tbmem._internal.snapshot.schema`) under ``<logdir>/plugins/tbmem/`` with an
offline HTML viewer next to each, and CUDA snapshots also as pickles for
PyTorch's own tools. See docs/snapshots.md.

Example:
    >>> import os, tempfile, torch
    >>> from tbmem import MemoryWriter
    >>> from tbmem._internal.snapshot import SnapshotConfig, load_snapshot
    >>> logdir = tempfile.mkdtemp()
    >>> with MemoryWriter(logdir, every=1, snapshot=SnapshotConfig(steps=(2,), html=False)) as writer:
    ...     for step in range(3):
    ...         y = torch.randn(64, 64) @ torch.randn(64, 64)
    ...         _ = writer.log_memory(step)
    >>> snap = load_snapshot(os.path.join(logdir, "plugins/tbmem/snapshot_rank0_step000000002.json.gz"))
    >>> snap.source in ("allocator", "dispatch"), int(snap.allocs["size"].max())  # allocator: compiled
    (True, 16384)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tbmem._internal._lazy import lazy_exports

# Imported on first use: `tbmem snapshot ...` and `tbmem report` should not pay for torch.
_EXPORTS: dict[str, str] = {
    "SnapshotConfig": "tbmem._internal.snapshot.config",
    "SnapshotManager": "tbmem._internal.snapshot.manager",
    "Snapshot": "tbmem._internal.snapshot.schema",
    "load_snapshot": "tbmem._internal.snapshot.readers",
    "load_torch_pickle": "tbmem._internal.snapshot.readers",
    "snapshot_stats": "tbmem._internal.snapshot.readers",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # pragma: no cover
    from tbmem._internal.snapshot.config import SnapshotConfig
    from tbmem._internal.snapshot.manager import SnapshotManager
    from tbmem._internal.snapshot.readers import load_snapshot, load_torch_pickle, snapshot_stats
    from tbmem._internal.snapshot.schema import Snapshot


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
