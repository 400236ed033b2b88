"""Context managers and decorators: ``track_memory``, ``monitor_memory``, ``track_performance``,
``monitor_performance``.

Console formats (GPU / CPU-only; on CPU the peak is the RSS peak of the block)::

    [Memory] loading dataset: CPU +450.2 MB, GPU +1250.5 MB
             Peak GPU: 1500.2 MB
    [Memory] loading dataset: CPU +450.2 MB, GPU n/a
             Peak CPU: 1500.2 MB
    [Performance] critical_operation: 1.234s, CPU +250.5MB, GPU +512.0MB
                  GPU peak: 1024.3MB
    [Performance] critical_operation: 1.234s, CPU +250.5MB, GPU n/a
                  CPU peak: 1024.3MB

With ``writer=``, each use writes one event (``Monitor/Operation/<label>_cpu_delta_MB``,
``_gpu_delta_MB``, and for the performance ones ``Perf/Operation/<label>_s``) at a
step counting the uses of that label in this process, unless ``step=`` is given.

Example:
    >>> import io, time
    >>> from tbmem._internal.monitor import monitor_performance, track_memory
    >>> out = io.StringIO()
    >>> with track_memory("list of ints", file=out) as tracked:
    ...     data = list(range(100_000))
    >>> out.getvalue().startswith("[Memory] list of ints: CPU ")
    True
    >>> @monitor_performance("nap", file=out)
    ... def nap():
    ...     time.sleep(0.01)
    >>> nap()
"""

from __future__ import annotations

import functools
import itertools
from collections import defaultdict
from contextlib import contextmanager
from typing import Any, Callable, Iterator, TextIO, TypeVar

from tbmem._internal.monitor._checks import DeviceLike, check_device, check_file, check_label, hook_failed, old_positional
from tbmem._internal.monitor.formatting import NA
from tbmem._internal.monitor.measure import PerformanceMetric, Span, Tracked
from tbmem._internal.monitor.output import emit
from tbmem._internal.monitor.performance import metric_items
from tbmem._internal.monitor.sink import make_sink

__all__ = ["track_memory", "monitor_memory", "track_performance", "monitor_performance",
           "memory_lines", "performance_lines"]

F = TypeVar("F", bound=Callable[..., Any])

# label -> uses so far, for monotonic TensorBoard steps of standalone uses
_uses: defaultdict[str, itertools.count[int]] = defaultdict(itertools.count)


def _num(value: float | None, spec: str, unit: str) -> str:
    return NA if value is None else f"{value:{spec}}{unit}"


def memory_lines(label: str, m: PerformanceMetric) -> list[str]:
    """The two ``[Memory]`` lines of a measured block."""
    indent = " " * len("[Memory] ")
    gpu = m.gpu_delta_mb is not None
    first = f"[Memory] {label}: CPU {_num(m.cpu_delta_mb, '+.1f', ' MB')}, GPU {_num(m.gpu_delta_mb, '+.1f', ' MB')}"
    second = (f"{indent}Peak GPU: {_num(m.gpu_peak_mb, '.1f', ' MB')}" if gpu
              else f"{indent}Peak CPU: {_num(m.cpu_peak_mb, '.1f', ' MB')}")
    return [first, second]


def performance_lines(label: str, m: PerformanceMetric) -> list[str]:
    """The two ``[Performance]`` lines of a measured block."""
    indent = " " * len("[Performance] ")
    gpu = m.gpu_delta_mb is not None
    first = (f"[Performance] {label}: {m.duration_seconds:.3f}s, CPU {_num(m.cpu_delta_mb, '+.1f', 'MB')}, "
             f"GPU {_num(m.gpu_delta_mb, '+.1f', 'MB')}")
    second = (f"{indent}GPU peak: {_num(m.gpu_peak_mb, '.1f', 'MB')}" if gpu
              else f"{indent}CPU peak: {_num(m.cpu_peak_mb, '.1f', 'MB')}")
    return [first, second]


@contextmanager
def _measured(label: str, *, kind: str, print_result: bool, device: int | None, writer: Any,
              step: int | None, file: TextIO | None, enabled: bool) -> Iterator[Tracked]:
    tracked = Tracked()
    if not enabled:
        yield tracked
        return
    sink = make_sink(writer)
    span = None
    try:
        span = Span(device, memory=True)
    except Exception as exc:  # noqa: BLE001 - monitoring never raises into training
        hook_failed(f"track_{kind}", exc)
    try:
        yield tracked
    finally:
        if span is not None:
            try:
                metric = span.finish(label)
                tracked.metric = metric
                if print_result:
                    emit(*(memory_lines if kind == "memory" else performance_lines)(label, metric), file=file)
                if sink is not None:
                    items = metric_items(metric)
                    use = next(_uses[f"{kind}:{label}"])
                    sink.write(items[1:] if kind == "memory" else items, use if step is None else step)
            except Exception as exc:  # noqa: BLE001 - monitoring never raises into training
                hook_failed(f"track_{kind}", exc)


def track_memory(label: str, *, print_result: bool = True, device: DeviceLike = None, writer: Any = None,
                 step: int | None = None, file: TextIO | None = None, enabled: bool = True) -> Any:
    """Context manager: print the RSS/GPU change and peak of the block; yields a :class:`Tracked`.

    Raises:
        ValueError: an invalid argument (empty label, negative device, file without write()).
    """
    check_label(label)
    return _measured(label, kind="memory", print_result=print_result, device=check_device(device), writer=writer,
                     step=step, file=check_file(file), enabled=enabled)


def track_performance(label: str, *_old: Any, print_result: bool = True, device: DeviceLike = None,
                      writer: Any = None, step: int | None = None, file: TextIO | None = None,
                      enabled: bool = True) -> Any:
    """Context manager: time the block (CUDA synchronised) and measure its memory; yields a :class:`Tracked`.

    Raises:
        ValueError: an invalid argument.
    """
    if _old:  # before 0.2: track_performance(label, print_result, device)
        print_result, device = old_positional("track_performance", ("print_result", "device"), _old,
                                              {"print_result": print_result, "device": device})
    check_label(label)
    return _measured(label, kind="performance", print_result=print_result, device=check_device(device),
                     writer=writer, step=step, file=check_file(file), enabled=enabled)


def _decorator(factory: Callable[..., Any], label: Any, kwargs: dict[str, Any]) -> Any:
    def wrap(func: F, name: str | None) -> F:
        text = name or getattr(func, "__qualname__", repr(func))
        check_label(text)

        @functools.wraps(func)
        def wrapper(*args: Any, **kw: Any) -> Any:
            with factory(text, **kwargs):
                return func(*args, **kw)

        return wrapper  # type: ignore[return-value]

    if callable(label):  # used bare: @monitor_memory
        return wrap(label, None)
    return lambda func: wrap(func, label)


def monitor_memory(label: str | Callable[..., Any] | None = None, **kwargs: Any) -> Any:
    """Decorator form of :func:`track_memory` (label defaults to the function's qualified name).

    Example:
        >>> import io
        >>> from tbmem._internal.monitor import monitor_memory
        >>> @monitor_memory("training epoch", file=io.StringIO())
        ... def train_epoch():
        ...     return 42
        >>> train_epoch()
        42
    """
    return _decorator(track_memory, label, kwargs)


def monitor_performance(label: str | Callable[..., Any] | None = None, *_old: Any, **kwargs: Any) -> Any:
    """Decorator form of :func:`track_performance`; prints on every call."""
    if _old:  # before 0.2: monitor_performance(label, device)
        (kwargs["device"],) = old_positional("monitor_performance", ("device",), _old,
                                             {"device": kwargs.get("device")})
    return _decorator(track_performance, label, kwargs)
