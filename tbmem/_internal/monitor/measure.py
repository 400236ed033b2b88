"""One timed, memory-measured span of code: the building block of the performance monitors.

A :class:`Span` synchronises CUDA (only when CUDA is initialised and has work
queued) before starting the clock and before stopping it, so GPU timings
include the kernels the span launched. Memory readings are taken outside the
timed interval, so the ~60 us they cost do not inflate the duration.

Example:
    >>> import time
    >>> from tbmem._internal.monitor.measure import Span
    >>> span = Span(device=0, memory=True)
    >>> time.sleep(0.01)
    >>> metric = span.finish("nap")
    >>> metric.operation, metric.duration_seconds >= 0.01, metric.gpu_delta_mb
    ('nap', True, None)
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from tbmem._internal.monitor.formatting import to_mb
from tbmem._internal.monitor.readings import PeakWindow, Reading, read, synchronize

__all__ = ["PerformanceMetric", "AggregateStats", "Span", "Tracked"]


@dataclass(frozen=True)
class PerformanceMetric:
    """One measured operation. Memory in MB; GPU fields are None on CPU.

    Attributes:
        operation: The name given to ``track``.
        duration_seconds: Wall time, CUDA work included.
        cpu_delta_mb: RSS change over the operation.
        gpu_delta_mb: Allocated CUDA memory change (None without CUDA).
        gpu_peak_mb: Peak allocated CUDA memory during the operation (None without CUDA).
        cpu_peak_mb: Peak RSS during the operation.
        timestamp: ``time.time()`` at the start.
    """

    operation: str
    duration_seconds: float
    cpu_delta_mb: float | None = None
    gpu_delta_mb: float | None = None
    gpu_peak_mb: float | None = None
    cpu_peak_mb: float | None = None
    timestamp: float = 0.0


@dataclass
class AggregateStats:
    """Running timing statistics of a repeated operation (O(1) memory)."""

    count: int = 0
    total: float = 0.0
    min: float = float("inf")
    max: float = 0.0

    @property
    def mean(self) -> float:
        """Mean seconds per call (0.0 before the first)."""
        return self.total / self.count if self.count else 0.0

    def add(self, seconds: float) -> None:
        """Account for one more call."""
        self.count += 1
        self.total += seconds
        # comparisons, not min()/max(): this runs twice per batch of EpochPerformanceMonitor
        if seconds < self.min:
            self.min = seconds
        if seconds > self.max:
            self.max = seconds

    def merged(self, other: "AggregateStats") -> "AggregateStats":
        """The statistics of both sets of calls together."""
        return AggregateStats(count=self.count + other.count, total=self.total + other.total,
                              min=min(self.min, other.min), max=max(self.max, other.max))


class Tracked:
    """What a ``with track_performance(...)``/``track_memory(...)`` block yields;
    :attr:`metric` is filled when the block ends."""

    def __init__(self) -> None:
        self.metric: PerformanceMetric | None = None


class Span:
    """Start measuring now; :meth:`finish` returns the :class:`PerformanceMetric`.

    Args:
        device: CUDA device (None: current device).
        memory: Also measure RSS/GPU change and peaks (False: timing only, cheaper).
    """

    __slots__ = ("device", "memory", "_before", "_window", "_timestamp", "_t0")

    def __init__(self, device: int | None, *, memory: bool = True) -> None:
        self.device = device
        self.memory = memory
        synchronize(device)
        self._before: Reading | None = read(device) if memory else None
        self._window: PeakWindow | None = PeakWindow.open(device) if memory else None
        self._timestamp = time.time()
        self._t0 = time.perf_counter()

    def finish(self, name: str) -> PerformanceMetric:
        """Stop the clock (after a CUDA sync) and read memory."""
        synchronize(self.device)
        duration = time.perf_counter() - self._t0
        if not self.memory or self._before is None or self._window is None:
            return PerformanceMetric(operation=name, duration_seconds=duration, timestamp=self._timestamp)
        after = read(self.device)
        cpu_peak, gpu_peak = self._window.close()
        before = self._before
        gpu_delta = None
        if after.gpu_allocated is not None:
            # CUDA initialised inside the span: nothing was allocated before it.
            gpu_delta = after.gpu_allocated - (before.gpu_allocated if before.gpu_allocated is not None else 0.0)
            if gpu_peak is None:
                gpu_peak = after.gpu_peak
        cpu_delta = None if after.cpu is None or before.cpu is None else after.cpu - before.cpu
        return PerformanceMetric(
            operation=name, duration_seconds=duration, cpu_delta_mb=to_mb(cpu_delta),
            gpu_delta_mb=to_mb(gpu_delta), gpu_peak_mb=to_mb(gpu_peak) if after.has_gpu else None,
            cpu_peak_mb=to_mb(cpu_peak), timestamp=self._timestamp,
        )
