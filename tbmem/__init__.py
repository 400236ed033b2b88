"""tbmem: memory and speed of PyTorch and PhiFlow training loops, visible in TensorBoard.

Public names are imported lazily on first use, so ``import tbmem`` is cheap,
needs no optional dependency and never initialises CUDA.

Example:
    >>> import tbmem
    >>> tbmem.MemoryWriter.__name__
    'MemoryWriter'
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tbmem._lazy import lazy_exports

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    "MemoryWriter": "tbmem.writer",
    "MemoryWriterConfig": "tbmem.config",
    "MissingExtraError": "tbmem._extras",
    "TAGS": "tbmem.tags",
    "Tag": "tbmem.tags",
    "tag_for": "tbmem.tags",
    "HostProbe": "tbmem.probes",
    "CudaProbe": "tbmem.probes",
    "NvmlProbe": "tbmem.probes",
    "ProcessTreeProbe": "tbmem.probes",
    "RanksConfig": "tbmem.ranks",
    "Census": "tbmem.census",
    "take_census": "tbmem.census",
    "MemoryMonitor": "tbmem.monitor",
    "MemoryTracker": "tbmem.monitor",
    "EpochMemoryMonitor": "tbmem.monitor",
    "BatchMemoryProfiler": "tbmem.monitor",
    "track_memory": "tbmem.monitor",
    "monitor_memory": "tbmem.monitor",
    "PerformanceMonitor": "tbmem.monitor",
    "EpochPerformanceMonitor": "tbmem.monitor",
    "track_performance": "tbmem.monitor",
    "monitor_performance": "tbmem.monitor",
    "SnapshotConfig": "tbmem.snapshot",
    "SnapshotManager": "tbmem.snapshot",
}

__all__ = sorted(_EXPORTS) + ["__version__"]

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from tbmem._extras import MissingExtraError
    from tbmem.census import Census, take_census
    from tbmem.config import MemoryWriterConfig
    from tbmem.monitor import (BatchMemoryProfiler, EpochMemoryMonitor, EpochPerformanceMonitor,
                               MemoryMonitor, MemoryTracker, PerformanceMonitor, monitor_memory,
                               monitor_performance, track_memory, track_performance)
    from tbmem.probes import CudaProbe, HostProbe, NvmlProbe, ProcessTreeProbe
    from tbmem.ranks import RanksConfig
    from tbmem.snapshot import SnapshotConfig, SnapshotManager
    from tbmem.tags import TAGS, Tag, tag_for
    from tbmem.writer import MemoryWriter


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
