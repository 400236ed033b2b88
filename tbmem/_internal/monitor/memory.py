"""Point-in-time memory: ``MemoryMonitor`` (static helpers) and ``MemoryTracker`` (checkpoints).

Console formats (GPU / CPU-only)::

    After model creation: CPU: 850.2 MB | GPU Allocated: 15.3 MB | GPU Reserved: 20.0 MB
    After model creation: CPU: 850.2 MB | GPU Allocated: n/a | GPU Reserved: n/a

Example:
    >>> import io
    >>> from tbmem._internal.monitor import MemoryMonitor, MemoryTracker
    >>> MemoryMonitor.get_cpu_memory_mb() > 0
    True
    >>> tracker = MemoryTracker(file=io.StringIO())
    >>> tracker.record("start").label
    'start'
    >>> tracker.print_summary()
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, TextIO

from tbmem._internal.monitor._checks import DeviceLike, check_device, check_file, hook_failed
from tbmem._internal.monitor.formatting import NA, format_mb, to_mb
from tbmem._internal.monitor.output import emit
from tbmem._internal.monitor.readings import Reading, read
from tbmem._internal.monitor.sink import make_sink
from tbmem._internal.probes.host import HostProbe, read_peak_rss

__all__ = ["MemoryMonitor", "MemoryTracker", "Checkpoint", "usage_line"]


def usage_line(prefix: str, reading: Reading) -> str:
    """``'<prefix>: CPU: .. MB | GPU Allocated: .. MB | GPU Reserved: .. MB'``."""
    head = prefix.rstrip().removesuffix(":")
    body = (f"CPU: {format_mb(reading.cpu)} | GPU Allocated: {format_mb(reading.gpu_allocated)}"
            f" | GPU Reserved: {format_mb(reading.gpu_reserved)}")
    return f"{head}: {body}" if head else body


class MemoryMonitor:
    """Static helpers for one reading now. GPU values are None when CUDA is not initialised.

    Example:
        >>> from tbmem._internal.monitor import MemoryMonitor
        >>> MemoryMonitor.get_gpu_memory_mb() is None  # CPU-only, or CUDA not yet used
        True
    """

    @staticmethod
    def get_cpu_memory_mb() -> float | None:
        """Resident set size of this process in MB."""
        return to_mb(read(gpu=False).cpu)

    @staticmethod
    def get_gpu_memory_mb(device: DeviceLike = None) -> float | None:
        """Allocated CUDA memory in MB, or None when CUDA is not initialised."""
        return to_mb(read(check_device(device)).gpu_allocated)

    @staticmethod
    def get_memory_summary(device: DeviceLike = None) -> dict[str, float | None]:
        """Every reading in MB (or percent): CPU RSS and its high-water mark, system RAM,
        GPU allocated/reserved/peak (None without CUDA)."""
        reading = read(check_device(device))
        summary: dict[str, float | None] = {
            "cpu_mb": to_mb(reading.cpu),
            "cpu_peak_mb": to_mb(read_peak_rss()),
            "gpu_allocated_mb": to_mb(reading.gpu_allocated),
            "gpu_reserved_mb": to_mb(reading.gpu_reserved),
            "gpu_peak_mb": to_mb(reading.gpu_peak),
            "system_used_mb": None,
            "system_available_mb": None,
            "system_percent": None,
        }
        try:
            host = HostProbe(peak_mode="run").read()
            summary["system_used_mb"] = to_mb(host["ram_system_used"])
            summary["system_available_mb"] = to_mb(host["ram_system_available"])
            summary["system_percent"] = host["ram_system_percent"]
        except Exception as exc:  # noqa: BLE001 - the summary is still useful without system RAM
            hook_failed("MemoryMonitor.get_memory_summary", exc)
        return summary

    @staticmethod
    def print_memory_usage(prefix: str = "", *, device: DeviceLike = None, file: TextIO | None = None) -> None:
        """Print one usage line. Never raises: it is called inside L-BFGS-B loss functions."""
        try:
            emit(usage_line(str(prefix), read(check_device(device))), file=file)
        except Exception as exc:  # noqa: BLE001 - see docstring
            hook_failed("MemoryMonitor.print_memory_usage", exc)


@dataclass(frozen=True)
class Checkpoint:
    """One ``MemoryTracker.record``: MB values, None where unavailable."""

    label: str
    elapsed_s: float
    cpu_mb: float | None
    gpu_allocated_mb: float | None
    gpu_reserved_mb: float | None


def _diff(now: float | None, before: float | None) -> float | None:
    return None if now is None or before is None else now - before


class MemoryTracker:
    """Records memory at labelled checkpoints and prints them as a table.

    Args:
        enabled: False makes every call a no-op.
        device: CUDA device to read (None: current device).
        writer: Optional MemoryWriter; each record then writes the change since the
            previous checkpoint as ``Monitor/Operation/<label>_cpu_delta_MB`` (and ``_gpu_``),
            at step = checkpoint index.
        file: Where to print (default: the monitors' output, see ``tbmem._internal.monitor.output``).

    Example:
        >>> import io
        >>> from tbmem._internal.monitor import MemoryTracker
        >>> tracker = MemoryTracker(file=io.StringIO())
        >>> _ = tracker.record("initialization"); _ = tracker.record("after_data_loading")
        >>> [c.label for c in tracker.checkpoints]
        ['initialization', 'after_data_loading']
    """

    def __init__(self, enabled: bool = True, *, device: DeviceLike = None, writer: Any = None,
                 file: TextIO | None = None) -> None:
        self.enabled = bool(enabled)
        self.device = check_device(device)
        self.file = check_file(file)
        self._sink = make_sink(writer)
        self._start = time.perf_counter()
        self._checkpoints: list[Checkpoint] = []

    @property
    def checkpoints(self) -> tuple[Checkpoint, ...]:
        """The recorded checkpoints, oldest first."""
        return tuple(self._checkpoints)

    def record(self, label: str) -> Checkpoint | None:
        """Read memory now and keep it under ``label``; returns the checkpoint (None if disabled)."""
        if not self.enabled:
            return None
        try:
            reading = read(self.device)
            point = Checkpoint(label=str(label), elapsed_s=time.perf_counter() - self._start,
                               cpu_mb=to_mb(reading.cpu), gpu_allocated_mb=to_mb(reading.gpu_allocated),
                               gpu_reserved_mb=to_mb(reading.gpu_reserved))
            previous = self._checkpoints[-1] if self._checkpoints else None
            self._checkpoints.append(point)
            if self._sink is not None:
                mib = 2.0**20
                cpu_d = _diff(point.cpu_mb, previous.cpu_mb) if previous else 0.0
                gpu_d = _diff(point.gpu_allocated_mb, previous.gpu_allocated_mb) if previous else None
                self._sink.write([("op_cpu_delta", point.label, None if cpu_d is None else cpu_d * mib),
                                  ("op_gpu_delta", point.label, None if gpu_d is None else gpu_d * mib)],
                                 step=len(self._checkpoints) - 1)
            return point
        except Exception as exc:  # noqa: BLE001 - monitoring never raises into training
            hook_failed("MemoryTracker.record", exc)
            return None

    def clear(self) -> None:
        """Forget every checkpoint."""
        self._checkpoints.clear()

    def summary_lines(self) -> list[str]:
        """The table :meth:`print_summary` prints."""
        header = f"{'Checkpoint':<30} {'Time (s)':>10} {'CPU (MB)':>12} {'CPU change':>12} {'GPU (MB)':>12} {'GPU change':>12}"
        rule = "=" * len(header)
        lines = [rule, "MEMORY CHECKPOINTS", rule, header, "-" * len(header)]
        previous: Checkpoint | None = None
        for point in self._checkpoints:
            def num(v: float | None, signed: bool = False) -> str:
                return NA if v is None else (f"{v:+.1f}" if signed else f"{v:.1f}")
            cpu_d = _diff(point.cpu_mb, previous.cpu_mb) if previous else 0.0
            gpu_d = _diff(point.gpu_allocated_mb, previous.gpu_allocated_mb) if previous else (
                0.0 if point.gpu_allocated_mb is not None else None)
            lines.append(f"{point.label:<30} {point.elapsed_s:>10.3f} {num(point.cpu_mb):>12} {num(cpu_d, True):>12}"
                         f" {num(point.gpu_allocated_mb):>12} {num(gpu_d, True):>12}")
            previous = point
        if not self._checkpoints:
            lines.append("(no checkpoints recorded)")
        lines.append(rule)
        return lines

    def print_summary(self) -> None:
        """Print every checkpoint with its change from the previous one."""
        if not self.enabled:
            return
        try:
            emit(*self.summary_lines(), file=self.file)
        except Exception as exc:  # noqa: BLE001 - monitoring never raises into training
            hook_failed("MemoryTracker.print_summary", exc)
