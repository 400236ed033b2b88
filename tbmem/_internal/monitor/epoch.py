"""``EpochMemoryMonitor``: memory of the first batches of each epoch and the epoch's peak.

Console formats (GPU / CPU-only)::

    Batch 0: GPU 23.1 MB, CPU 1634.7 MB, loss=0.005310
    Batch 0: GPU n/a, CPU 1634.7 MB, loss=0.005310
    Epoch end: GPU 14.4 MB allocated, 3242.0 MB reserved, peak 2880.3 MB
    Epoch end: GPU n/a, CPU 1645.1 MB, peak CPU 1702.3 MB

On CPU the peak is the process's RSS high-water mark over the epoch (windowed
through ``/proc/self/clear_refs``; the whole-run peak where the kernel refuses).

Example:
    >>> import io
    >>> from tbmem._internal.monitor import EpochMemoryMonitor
    >>> out = io.StringIO()
    >>> monitor = EpochMemoryMonitor(verbose_batches=2, file=out)
    >>> monitor.on_epoch_start()
    >>> for batch_idx in range(3):
    ...     monitor.on_batch_end(batch_idx, loss=0.5 / (batch_idx + 1))
    >>> monitor.on_epoch_end()
    >>> len(out.getvalue().splitlines())  # two batch lines and the epoch line
    3
"""

from __future__ import annotations

from typing import Any, TextIO

from tbmem._internal.monitor._checks import (DeviceLike, check_count, check_device, check_file, check_positive, hook_failed,
                                   old_positional)
from tbmem._internal.monitor.formatting import format_mb, loss_summary, render_loss, to_mb
from tbmem._internal.monitor.output import emit
from tbmem._internal.monitor.readings import PeakWindow, Reading, read
from tbmem._internal.monitor.sink import make_sink

__all__ = ["EpochMemoryMonitor", "batch_memory_line", "epoch_memory_line"]


def batch_memory_line(batch_idx: int, reading: Reading, loss: Any,
                      summary: tuple[float, int] | None = None) -> str:
    """``'Batch 0: GPU 23.1 MB, CPU 1634.7 MB, loss=0.005310'`` (no loss part when loss is None)."""
    tail = "" if loss is None else f", loss={render_loss(summary or loss_summary(loss), loss)}"
    return f"Batch {batch_idx}: GPU {format_mb(reading.gpu_allocated)}, CPU {format_mb(reading.cpu)}{tail}"


def epoch_memory_line(reading: Reading, cpu_peak: float | None, gpu_peak: float | None) -> str:
    """The "Epoch end:" line; the CPU-only form shows RSS and its peak instead of allocator numbers."""
    if reading.has_gpu:
        return (f"Epoch end: GPU {format_mb(reading.gpu_allocated)} allocated, "
                f"{format_mb(reading.gpu_reserved)} reserved, peak {format_mb(gpu_peak)}")
    return f"Epoch end: GPU n/a, CPU {format_mb(reading.cpu)}, peak CPU {format_mb(cpu_peak)}"


class EpochMemoryMonitor:
    """Lightweight per-epoch memory monitoring for training loops.

    Args:
        enabled: False makes every hook return at once (no reading, no output).
        verbose_batches: Print the batches whose index is below this, each epoch.
        writer: Optional MemoryWriter (or SummaryWriter). Then every batch writes one
            event with ``Monitor/batch_gpu_allocated_MB``, ``Monitor/batch_cpu_rss_MB`` and
            ``Loss/batch`` at the global batch step (monotonic across epochs), and every
            epoch ``Monitor/epoch_gpu_peak_MB`` (on CPU ``Monitor/epoch_cpu_peak_rss_MB``) at the epoch index.
            The loss is then converted each batch (one CUDA sync for a CUDA loss).
        file: Where to print (default: the monitors' shared output).
        log_every: Write batch scalars every this many global batches (default 1: every
            batch). A MemoryWriter event costs about 0.3-0.5 ms; raise this for fast loops.
        device: CUDA device to read (None: current device).

    Raises:
        ValueError: ``verbose_batches`` is not an int >= 0, or another argument is invalid.

    Example:
        >>> from tbmem._internal.monitor import EpochMemoryMonitor
        >>> monitor = EpochMemoryMonitor(enabled=False)
        >>> monitor.on_batch_end(0, 1.0)  # prints nothing, reads nothing
        >>> monitor.global_step
        0
    """

    def __init__(self, enabled: bool = True, verbose_batches: int = 5, *_old: Any, device: DeviceLike = None,
                 writer: Any = None, file: TextIO | None = None, log_every: int = 1) -> None:
        if _old:  # before 0.2: EpochMemoryMonitor(enabled, verbose_batches, writer, file)
            writer, file = old_positional("EpochMemoryMonitor", ("writer", "file"), _old,
                                          {"writer": writer, "file": file})
        self.enabled = bool(enabled)
        self.verbose_batches = check_count(verbose_batches, "verbose_batches")
        self.log_every = check_positive(log_every, "log_every")
        self.file = check_file(file)
        self.device = check_device(device)
        self._sink = make_sink(writer) if self.enabled else None
        self.global_step = 0
        self.epoch = 0
        self.last_peak_mb: float | None = None
        self._window: PeakWindow | None = None

    @property
    def banner(self) -> str:
        """The line a trainer may print when monitoring is switched on."""
        return f"Memory monitoring enabled (verbose for first {self.verbose_batches} batches)"

    def on_epoch_start(self) -> None:
        """Begin an epoch: start the peak window."""
        if not self.enabled:
            return
        try:
            if self._window is not None:
                self._window.close()
            self._window = PeakWindow.open(self.device)
        except Exception as exc:  # noqa: BLE001 - monitoring never raises into training
            hook_failed("EpochMemoryMonitor.on_epoch_start", exc)

    def on_batch_end(self, batch_idx: int, loss: Any = None) -> None:
        """After a batch: print it if ``batch_idx < verbose_batches``; write it if there is a writer."""
        if not self.enabled:
            return
        step = self.global_step
        self.global_step += 1
        verbose = isinstance(batch_idx, int) and batch_idx < self.verbose_batches
        log = self._sink is not None and step % self.log_every == 0
        if not (verbose or log):
            return
        try:
            reading = read(self.device)
            summary = loss_summary(loss)  # converted once: .item() syncs a CUDA loss
            if verbose:
                emit(batch_memory_line(batch_idx, reading, loss, summary), file=self.file)
            if log and self._sink is not None:
                self._sink.write([("batch_gpu", None, reading.gpu_allocated), ("batch_cpu", None, reading.cpu),
                                  ("batch_loss", None, None if summary is None else summary[0])], step)
        except Exception as exc:  # noqa: BLE001 - monitoring never raises into training
            hook_failed("EpochMemoryMonitor.on_batch_end", exc)

    def on_epoch_end(self) -> None:
        """End an epoch: print current, reserved and peak memory; write the peak."""
        if not self.enabled:
            return
        epoch = self.epoch
        self.epoch += 1
        try:
            reading = read(self.device)
            cpu_peak, gpu_peak = self._window.close() if self._window is not None else (None, None)
            self._window = None
            if gpu_peak is None:  # CUDA first used during the epoch: the allocator's peak covers it
                gpu_peak = reading.gpu_peak
            if cpu_peak is None:
                cpu_peak = reading.cpu
            emit(epoch_memory_line(reading, cpu_peak, gpu_peak), file=self.file)
            peak = gpu_peak if reading.has_gpu else cpu_peak
            self.last_peak_mb = to_mb(peak)
            if self._sink is not None:
                self._sink.write([("epoch_peak_gpu" if reading.has_gpu else "epoch_peak_rss", None, peak)], epoch)
        except Exception as exc:  # noqa: BLE001 - monitoring never raises into training
            hook_failed("EpochMemoryMonitor.on_epoch_end", exc)
