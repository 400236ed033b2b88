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

from tbmem._lazy import lazy_exports

__version__ = "0.1.0"

#: The modules of the stable surface besides this one (docs/api.md; ``tbmem.integrations`` and its modules
#: are the framework adapters).
PUBLIC_MODULES = ("tbmem.console", "tbmem.analysis", "tbmem.forecast", "tbmem.integrations")

# public name -> module that defines it ("module:name" where it is called otherwise there)
_EXPORTS: dict[str, str] = {
    # the recorder and its configuration
    "MemoryWriter": "tbmem.writer",
    "MemoryWriterConfig": "tbmem.config",
    "SnapshotConfig": "tbmem.snapshot.config",
    "RanksConfig": "tbmem.ranks.config",
    "AlertConfig": "tbmem.alerts",
    "SpikeConfig": "tbmem.spikes",
    "ProfileConfig": "tbmem.profile.config",
    "Sink": "tbmem.sinks.base",
    "BackgroundSink": "tbmem.sinks.base",
    "WandbSink": "tbmem.sinks.wandb_sink",
    "MlflowSink": "tbmem.sinks.mlflow_sink",
    "TensorBoardSink": "tbmem.sinks.tensorboard",
    "HostProbe": "tbmem.probes",
    "CudaProbe": "tbmem.probes",
    "NvmlProbe": "tbmem.probes",
    "ProcessTreeProbe": "tbmem.probes",
    "MissingExtraError": "tbmem._extras",
    "require_extra": "tbmem._extras",
    "report_once": "tbmem._log",
    "deferred_interrupt": "tbmem._signals",
    # tags
    "TAGS": "tbmem.tags",
    "Tag": "tbmem.tags",
    "tag_for": "tbmem.tags",
    # the census
    "Census": "tbmem.census",
    "take_census": "tbmem.census",
    # snapshots
    "SnapshotManager": "tbmem.snapshot.manager",
    "Snapshot": "tbmem.snapshot.model",
    "load_snapshot": "tbmem.snapshot.readers",
    "load_torch_pickle": "tbmem.snapshot.readers",
    "snapshot_stats": "tbmem.snapshot.readers",
    "mark_snapshot": "tbmem.snapshot.markers:mark",
    "snapshot_recording": "tbmem.snapshot.markers:recording",
    # ranks of a distributed job
    "RankInfo": "tbmem.ranks.context",
    "detect_rank": "tbmem.ranks.context",
    "JobStore": "tbmem.ranks.store",
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
    from tbmem._extras import MissingExtraError, require_extra
    from tbmem._log import report_once
    from tbmem._signals import deferred_interrupt
    from tbmem.alerts import AlertConfig
    from tbmem.census import Census, take_census
    from tbmem.config import MemoryWriterConfig
    from tbmem.console import (BatchMemoryProfiler, EpochMemoryMonitor, EpochPerformanceMonitor, MemoryMonitor,
                               MemoryTracker, PerformanceMonitor, monitor_memory, monitor_performance,
                               track_memory, track_performance)
    from tbmem.probes import CudaProbe, HostProbe, NvmlProbe, ProcessTreeProbe
    from tbmem.profile.config import ProfileConfig
    from tbmem.ranks.config import RanksConfig
    from tbmem.ranks.context import RankInfo, detect_rank
    from tbmem.ranks.store import JobStore
    from tbmem.sinks.base import BackgroundSink, Sink
    from tbmem.sinks.mlflow_sink import MlflowSink
    from tbmem.sinks.tensorboard import TensorBoardSink
    from tbmem.sinks.wandb_sink import WandbSink
    from tbmem.snapshot.config import SnapshotConfig
    from tbmem.snapshot.manager import SnapshotManager
    from tbmem.snapshot.markers import mark as mark_snapshot
    from tbmem.snapshot.markers import recording as snapshot_recording
    from tbmem.snapshot.readers import load_snapshot, load_torch_pickle, snapshot_stats
    from tbmem.snapshot.model import Snapshot
    from tbmem.spikes import SpikeConfig
    from tbmem.tags import TAGS, Tag, tag_for
    from tbmem.writer import MemoryWriter


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
