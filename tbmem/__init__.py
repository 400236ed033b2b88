"""tbmem: memory and speed of PyTorch and PhiFlow training loops, visible in TensorBoard.

The stable surface is what ``__all__`` names here and the public modules docs/api.md lists
(``tbmem.console``, ``tbmem.analysis``, ``tbmem.forecast``, ``tbmem.integrations``); every other module
is tbmem's own and may change. Names are imported lazily on first use, so ``import tbmem`` is cheap,
needs no optional dependency and never initialises CUDA.

Example:
    >>> import tbmem
    >>> tbmem.MemoryWriter.__name__
    'MemoryWriter'
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tbmem._internal._lazy import lazy_exports

__version__ = "0.1.0"

#: The modules of the stable surface besides this one (docs/api.md; ``tbmem.integrations`` and its modules
#: are the framework adapters).
PUBLIC_MODULES = ("tbmem.console", "tbmem.analysis", "tbmem.forecast", "tbmem.integrations")

# public name -> module that defines it ("module:name" where it is called otherwise there)
_EXPORTS: dict[str, str] = {
    # the recorder and its configuration
    "MemoryWriter": "tbmem._internal.writer",
    "MemoryWriterConfig": "tbmem._internal.config",
    "SnapshotConfig": "tbmem._internal.snapshot.config",
    "RanksConfig": "tbmem._internal.ranks.config",
    "AlertConfig": "tbmem._internal.alerts",
    "SpikeConfig": "tbmem._internal.spikes",
    "ProfileConfig": "tbmem._internal.profile.config",
    "Sink": "tbmem._internal.sinks.base",
    "BackgroundSink": "tbmem._internal.sinks.base",
    "WandbSink": "tbmem._internal.sinks.wandb_sink",
    "MlflowSink": "tbmem._internal.sinks.mlflow_sink",
    "TensorBoardSink": "tbmem._internal.sinks.tensorboard",
    "HostProbe": "tbmem._internal.probes",
    "CudaProbe": "tbmem._internal.probes",
    "NvmlProbe": "tbmem._internal.probes",
    "ProcessTreeProbe": "tbmem._internal.probes",
    "MissingExtraError": "tbmem._internal._extras",
    "require_extra": "tbmem._internal._extras",
    "report_once": "tbmem._internal._log",
    "deferred_interrupt": "tbmem._internal._signals",
    # tags
    "TAGS": "tbmem._internal.tags",
    "Tag": "tbmem._internal.tags",
    "tag_for": "tbmem._internal.tags",
    # the census
    "Census": "tbmem._internal.census",
    "take_census": "tbmem._internal.census",
    # snapshots
    "SnapshotManager": "tbmem._internal.snapshot.manager",
    "Snapshot": "tbmem._internal.snapshot.model",
    "load_snapshot": "tbmem._internal.snapshot.readers",
    "load_torch_pickle": "tbmem._internal.snapshot.readers",
    "snapshot_stats": "tbmem._internal.snapshot.readers",
    "mark_snapshot": "tbmem._internal.snapshot.markers:mark",
    "snapshot_recording": "tbmem._internal.snapshot.markers:recording",
    # ranks of a distributed job
    "RankInfo": "tbmem._internal.ranks.context",
    "detect_rank": "tbmem._internal.ranks.context",
    "JobStore": "tbmem._internal.ranks.store",
    # the console API of the design documents (tbmem.console)
    "MemoryMonitor": "tbmem.console",
    "MemoryTracker": "tbmem.console",
    "EpochMemoryMonitor": "tbmem.console",
    "BatchMemoryProfiler": "tbmem.console",
    "track_memory": "tbmem.console",
    "monitor_memory": "tbmem.console",
    "PerformanceMonitor": "tbmem.console",
    "EpochPerformanceMonitor": "tbmem.console",
    "track_performance": "tbmem.console",
    "monitor_performance": "tbmem.console",
}

__all__ = sorted(_EXPORTS) + ["PUBLIC_MODULES", "__version__"]

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from tbmem._internal._extras import MissingExtraError, require_extra
    from tbmem._internal._log import report_once
    from tbmem._internal._signals import deferred_interrupt
    from tbmem._internal.alerts import AlertConfig
    from tbmem._internal.census import Census, take_census
    from tbmem._internal.config import MemoryWriterConfig
    from tbmem.console import (BatchMemoryProfiler, EpochMemoryMonitor, EpochPerformanceMonitor, MemoryMonitor,
                               MemoryTracker, PerformanceMonitor, monitor_memory, monitor_performance,
                               track_memory, track_performance)
    from tbmem._internal.probes import CudaProbe, HostProbe, NvmlProbe, ProcessTreeProbe
    from tbmem._internal.profile.config import ProfileConfig
    from tbmem._internal.ranks.config import RanksConfig
    from tbmem._internal.ranks.context import RankInfo, detect_rank
    from tbmem._internal.ranks.store import JobStore
    from tbmem._internal.sinks.base import BackgroundSink, Sink
    from tbmem._internal.sinks.mlflow_sink import MlflowSink
    from tbmem._internal.sinks.tensorboard import TensorBoardSink
    from tbmem._internal.sinks.wandb_sink import WandbSink
    from tbmem._internal.snapshot.config import SnapshotConfig
    from tbmem._internal.snapshot.manager import SnapshotManager
    from tbmem._internal.snapshot.markers import mark as mark_snapshot
    from tbmem._internal.snapshot.markers import recording as snapshot_recording
    from tbmem._internal.snapshot.readers import load_snapshot, load_torch_pickle, snapshot_stats
    from tbmem._internal.snapshot.model import Snapshot
    from tbmem._internal.spikes import SpikeConfig
    from tbmem._internal.tags import TAGS, Tag, tag_for
    from tbmem._internal.writer import MemoryWriter


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
