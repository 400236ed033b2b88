"""The console API of the design documents: monitors that print their lines and write to TensorBoard.

Their class names, arguments and line formats are the contract users of the design documents know
(docs/console-api.md); they are re-exported at the top (``tbmem.MemoryMonitor``). Memory:
:class:`MemoryMonitor`, :class:`MemoryTracker`, :class:`EpochMemoryMonitor`, :class:`BatchMemoryProfiler`,
:func:`track_memory`, :func:`monitor_memory`; performance: :class:`PerformanceMonitor`,
:class:`EpochPerformanceMonitor`, :func:`track_performance`, :func:`monitor_performance`. Where the lines
go: :func:`set_output`, :func:`redirect_output`, :func:`silence_output`, :func:`set_silent`,
:func:`emit`. One reading of the process's memory: :func:`read_memory` (a :class:`Reading`) and
:func:`usage_line`, the line the monitors print for it.

Every monitor takes the same keywords: ``enabled``, ``device`` (None: the current CUDA device),
``writer`` (a :class:`tbmem.MemoryWriter`) and ``file``.

Example:
    >>> import io
    >>> from tbmem.console import PerformanceMonitor
    >>> monitor = PerformanceMonitor(file=io.StringIO())
    >>> with monitor.track("load"):
    ...     pass
    >>> [m.operation for m in monitor.get_metrics()]
    ['load']
"""

from tbmem._internal.monitor import (AggregateStats, BatchMemoryProfiler, Checkpoint, EpochMemoryMonitor,
                           EpochPerformanceMonitor, MemoryMonitor, MemoryTracker, PerformanceMetric,
                           PerformanceMonitor, Tracked, emit, monitor_memory, monitor_performance,
                           redirect_output, set_output, set_silent, silence_output, track_memory,
                           track_performance)
from tbmem._internal.monitor.formatting import format_mb
from tbmem._internal.monitor.memory import usage_line
from tbmem._internal.monitor.readings import Reading
from tbmem._internal.monitor.readings import read as read_memory

__all__ = [
    "AggregateStats", "BatchMemoryProfiler", "Checkpoint", "EpochMemoryMonitor", "EpochPerformanceMonitor",
    "format_mb", "MemoryMonitor", "MemoryTracker", "PerformanceMetric", "PerformanceMonitor", "Reading", "Tracked", "emit",
    "monitor_memory", "monitor_performance", "read_memory", "redirect_output", "set_output", "set_silent",
    "silence_output", "track_memory", "track_performance", "usage_line",
]
