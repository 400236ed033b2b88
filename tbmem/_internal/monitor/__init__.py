"""The console monitoring API of the design documents, wired to TensorBoard.

Memory: :class:`MemoryMonitor` (static readings), :class:`MemoryTracker`
(checkpoints), :class:`EpochMemoryMonitor` (training-loop hooks),
:class:`BatchMemoryProfiler` (transitions inside a batch), :func:`track_memory`
and :func:`monitor_memory`. Performance: :class:`PerformanceMonitor`,
:class:`EpochPerformanceMonitor`, :func:`track_performance`,
:func:`monitor_performance`. Output goes through :mod:`tbmem._internal.monitor.output`
(:func:`set_output`, :func:`redirect_output`, :func:`silence_output`); every
monitor also takes ``file=`` and ``writer=``. Formats and rules: docs/console-api.md.

Nothing here initialises CUDA; on CPU, GPU numbers show as ``n/a``.

Example:
    >>> import io, time
    >>> from tbmem._internal.monitor import PerformanceMonitor
    >>> monitor = PerformanceMonitor(file=io.StringIO())
    >>> with monitor.track("load"):
    ...     time.sleep(0.01)
    >>> [m.operation for m in monitor.get_metrics()]
    ['load']
"""

from tbmem._internal.monitor.decorators import monitor_memory, monitor_performance, track_memory, track_performance
from tbmem._internal.monitor.epoch import EpochMemoryMonitor
from tbmem._internal.monitor.epoch_performance import EpochPerformanceMonitor
from tbmem._internal.monitor.measure import AggregateStats, PerformanceMetric, Tracked
from tbmem._internal.monitor.memory import Checkpoint, MemoryMonitor, MemoryTracker
from tbmem._internal.monitor.output import emit, redirect_output, set_output, set_silent, silence_output
from tbmem._internal.monitor.performance import PerformanceMonitor
from tbmem._internal.monitor.profiler import BatchMemoryProfiler

__all__ = [
    "MemoryMonitor", "MemoryTracker", "Checkpoint", "EpochMemoryMonitor", "BatchMemoryProfiler",
    "track_memory", "monitor_memory", "PerformanceMonitor", "PerformanceMetric", "AggregateStats",
    "EpochPerformanceMonitor", "track_performance", "monitor_performance", "Tracked",
    "emit", "set_output", "redirect_output", "set_silent", "silence_output",
]
