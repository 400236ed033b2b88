"""``PerformanceMonitor``: timing and memory of named operations, with the two summary tables.

Console format (numbers differ; on CPU the GPU columns say ``n/a``)::

    ==========================================================================================
    PERFORMANCE SUMMARY
    ==========================================================================================
    Operation                      Time (s)     CPU (MB)        GPU (MB)        GPU Peak
    ------------------------------------------------------------------------------------------
    load_ground_truth                   0.396          +76.9           +0.8         1.7
    ------------------------------------------------------------------------------------------
    TOTAL                               0.396s
    ==========================================================================================

Example:
    >>> import io, time
    >>> from tbmem._internal.monitor import PerformanceMonitor
    >>> monitor = PerformanceMonitor(file=io.StringIO())
    >>> with monitor.track("sleep"):
    ...     time.sleep(0.01)
    >>> monitor.get_operation_time("sleep") >= 0.01
    True
    >>> monitor.print_summary()
"""

from __future__ import annotations

from collections import defaultdict
from contextlib import contextmanager, nullcontext
from typing import Any, ContextManager, Iterator, TextIO

from tbmem._internal.monitor._checks import DeviceLike, check_device, check_file, hook_failed, old_positional
from tbmem._internal.monitor.formatting import NA, MiB
from tbmem._internal.monitor.measure import AggregateStats, PerformanceMetric, Span
from tbmem._internal.monitor.output import emit
from tbmem._internal.monitor.sink import make_sink

__all__ = ["PerformanceMonitor", "summary_table", "aggregate_table", "metric_items"]

_RULE = "=" * 90
_NULL: ContextManager[None] = nullcontext()
_THIN = "-" * 90


def _signed(value: float | None) -> str:
    return NA if value is None else f"{value:+.1f}"


def _plain(value: float | None) -> str:
    return NA if value is None else f"{value:.1f}"


def summary_table(metrics: list[PerformanceMetric]) -> list[str]:
    """The PERFORMANCE SUMMARY table (one row per tracked, non-aggregated operation)."""
    lines = [_RULE, "PERFORMANCE SUMMARY", _RULE,
             f"{'Operation':<30} {'Time (s)':<12} {'CPU (MB)':<15} {'GPU (MB)':<15} {'GPU Peak'}", _THIN]
    for m in metrics:
        lines.append(f"{m.operation:<30} {m.duration_seconds:>10.3f} {_signed(m.cpu_delta_mb):>14}"
                     f" {_signed(m.gpu_delta_mb):>14} {_plain(m.gpu_peak_mb):>11}")
    total = sum(m.duration_seconds for m in metrics)
    lines += [_THIN, f"{'TOTAL':<30} {total:>10.3f}s", _RULE]
    return lines


def aggregate_table(stats: dict[str, AggregateStats]) -> list[str]:
    """The AGGREGATE STATISTICS table (operations tracked with ``aggregate=True``)."""
    lines = [_RULE, "AGGREGATE STATISTICS (for repeated operations)", _RULE,
             f"{'Operation':<30} {'Count':<8} {'Total (s)':<12} {'Mean (s)':<12} {'Min (s)':<12} {'Max (s)'}", _THIN]
    for name, s in stats.items():
        lines.append(f"{name:<30} {s.count:<8} {format(s.total, '6.3f'):<12} {s.mean:<12.3f} "
                     f"{s.min:<12.3f} {s.max:.3f}")
    lines.append(_RULE)
    return lines


def metric_items(metric: PerformanceMetric) -> list[tuple[str, str | None, float | None]]:
    """Tag-table items of a metric: time, CPU delta and GPU delta (raw seconds/bytes)."""
    def raw(mb: float | None) -> float | None:
        return None if mb is None else mb * MiB
    name = metric.operation
    return [("op_time", name, metric.duration_seconds), ("op_cpu_delta", name, raw(metric.cpu_delta_mb)),
            ("op_gpu_delta", name, raw(metric.gpu_delta_mb))]


class PerformanceMonitor:
    """Times named operations (CUDA work included) and measures their memory.

    Args:
        enabled: False makes ``track`` a bare ``yield`` and every other call a no-op.
        device: CUDA device to synchronise and read (None: current device).
        writer: Optional MemoryWriter (or SummaryWriter). Each tracked operation then
            writes one event: ``Perf/Operation/<name>_s`` plus, unless aggregated,
            ``Monitor/Operation/<name>_cpu_delta_MB`` and ``_gpu_delta_MB`` (GPU only).
            The step is how often that name was tracked before, unless ``track(step=)``.
        file: Where to print (default: the monitors' shared output).

    Example:
        >>> from tbmem._internal.monitor import PerformanceMonitor
        >>> monitor = PerformanceMonitor()
        >>> for _ in range(3):
        ...     with monitor.track("batch_forward", aggregate=True):
        ...         pass
        >>> monitor.get_aggregate_stats()["batch_forward"].count
        3
    """

    def __init__(self, enabled: bool = True, *_old: Any, device: DeviceLike = None, writer: Any = None,
                 file: TextIO | None = None) -> None:
        if _old:  # before 0.2: PerformanceMonitor(enabled, device)
            (device,) = old_positional("PerformanceMonitor", ("device",), _old, {"device": device})
        self.enabled = bool(enabled)
        self.device = check_device(device)
        self.file = check_file(file)
        self._sink = make_sink(writer) if self.enabled else None
        self._metrics: list[PerformanceMetric] = []
        self._aggregates: dict[str, AggregateStats] = {}
        self._counts: defaultdict[str, int] = defaultdict(int)

    def track(self, name: str, aggregate: bool = False, *, step: int | None = None) -> ContextManager[None]:
        """Measure the ``with`` block as operation ``name``.

        ``aggregate=True`` keeps running statistics (count/total/mean/min/max, timing
        only) instead of one metric per call: use it for per-batch operations.
        An exception in the block is recorded too, then propagates unchanged.
        """
        if not self.enabled:
            return _NULL  # a shared nullcontext: no generator, no allocation
        return self._track(str(name), aggregate, step)

    @contextmanager
    def _track(self, name: str, aggregate: bool, step: int | None) -> Iterator[None]:
        span = None
        try:
            span = Span(self.device, memory=not aggregate)
        except Exception as exc:  # noqa: BLE001 - monitoring never raises into training
            hook_failed("PerformanceMonitor.track", exc)
        try:
            yield
        finally:
            if span is not None:
                self._finish(span, name, aggregate, step)

    def _finish(self, span: Span, name: str, aggregate: bool, step: int | None) -> None:
        try:
            metric = span.finish(name)
            if aggregate:
                self._aggregates.setdefault(name, AggregateStats()).add(metric.duration_seconds)
            else:
                self._metrics.append(metric)
            count = self._counts[name]
            self._counts[name] = count + 1
            if self._sink is not None:
                self._sink.write(metric_items(metric), count if step is None else step)
        except Exception as exc:  # noqa: BLE001 - monitoring never raises into training
            hook_failed("PerformanceMonitor.track", exc)

    def get_metrics(self) -> list[PerformanceMetric]:
        """Every non-aggregated measurement, in order."""
        return list(self._metrics)

    def get_aggregate_stats(self) -> dict[str, AggregateStats]:
        """Statistics of the operations tracked with ``aggregate=True`` (copies)."""
        return {k: AggregateStats(v.count, v.total, v.min, v.max) for k, v in self._aggregates.items()}

    def get_total_time(self) -> float:
        """Seconds across all operations, aggregated ones included."""
        return sum(m.duration_seconds for m in self._metrics) + sum(s.total for s in self._aggregates.values())

    def get_operation_time(self, name: str) -> float:
        """Total seconds spent in operation ``name`` (0.0 if never tracked)."""
        agg = self._aggregates.get(name)
        return sum(m.duration_seconds for m in self._metrics if m.operation == name) + (agg.total if agg else 0.0)

    def clear(self) -> None:
        """Forget every measurement (TensorBoard steps keep counting, so curves stay monotonic)."""
        self._metrics.clear()
        self._aggregates.clear()

    def summary_lines(self, show_aggregate: bool = True) -> list[str]:
        """The tables :meth:`print_summary` prints."""
        lines: list[str] = []
        if self._metrics or not (show_aggregate and self._aggregates):
            lines += summary_table(self._metrics)
        if show_aggregate and self._aggregates:
            lines += aggregate_table(self._aggregates)
        return lines

    def print_summary(self, show_aggregate: bool = True) -> None:
        """Print PERFORMANCE SUMMARY (individual operations) and, if asked and any,
        AGGREGATE STATISTICS (repeated operations)."""
        if not self.enabled:
            return
        try:
            emit(*self.summary_lines(show_aggregate), file=self.file)
        except Exception as exc:  # noqa: BLE001 - monitoring never raises into training
            hook_failed("PerformanceMonitor.print_summary", exc)
