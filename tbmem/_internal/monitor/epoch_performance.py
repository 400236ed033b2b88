"""``EpochPerformanceMonitor``: batch and epoch timing plus memory, for training loops.

Console formats (GPU / CPU-only)::

    Batch 0: 0.538s, GPU 23.1MB, CPU 1648.9MB, loss=0.009458
    Batch 0: 0.538s, GPU n/a, CPU 1648.9MB, loss=0.009458
    Epoch end: 4.774s total, GPU 14.4MB, 3236MB reserved, peak 2880MB
    Epoch end: 4.774s total, GPU n/a, CPU 1659.6MB, peak CPU 1702MB
    Batch timing: avg=0.201s, min=0.082s, max=0.538s

A batch lasts from ``on_batch_start`` (or, when that is not called, from the end
of the previous batch or the start of the epoch) to ``on_batch_end``. Both hooks
synchronise CUDA first when it is initialised, so queued kernels are counted.

Example:
    >>> import io, time
    >>> from tbmem._internal.monitor import EpochPerformanceMonitor
    >>> monitor = EpochPerformanceMonitor(verbose_batches=1, file=io.StringIO())
    >>> monitor.on_epoch_start()
    >>> for batch_idx in range(2):
    ...     monitor.on_batch_start(batch_idx)
    ...     time.sleep(0.01)
    ...     monitor.on_batch_end(batch_idx, loss=0.1)
    >>> monitor.on_epoch_end()
    >>> monitor.get_statistics()["num_batches"]
    2
"""

from __future__ import annotations

import time
from typing import Any, TextIO

from tbmem._internal import _torch_private as tp
from tbmem._internal.monitor._checks import (DeviceLike, check_count, check_device, check_file, check_positive, hook_failed,
                                   old_positional)
from tbmem._internal.monitor.formatting import format_mb, loss_summary, render_loss
from tbmem._internal.monitor.measure import AggregateStats
from tbmem._internal.monitor.output import emit
from tbmem._internal.monitor.readings import PeakWindow, read, synchronize
from tbmem._internal.monitor.sink import make_sink

__all__ = ["EpochPerformanceMonitor"]


class EpochPerformanceMonitor:
    """Per-batch and per-epoch timing with memory, printed for the first batches of each epoch.

    Args:
        enabled: False makes every hook return at once.
        verbose_batches: Print the batches whose index is below this, each epoch.
        device: CUDA device to synchronise and read (None: current device).
        writer: Optional MemoryWriter (or SummaryWriter): every batch writes one event with
            ``Perf/batch_time_s``, ``Monitor/batch_gpu_allocated_MB``, ``Monitor/batch_cpu_rss_MB``
            and ``Loss/batch`` at the global batch step; every epoch ``Perf/epoch_time_s`` and
            ``Monitor/epoch_gpu_peak_MB`` (on CPU ``Monitor/epoch_cpu_peak_rss_MB``) at the epoch index. (It is a superset of
            EpochMemoryMonitor's scalars: give a writer to one of the two.)
        file: Where to print (default: the monitors' shared output).
        log_every: Write batch scalars every this many global batches (default 1: every
            batch). A MemoryWriter event costs about 0.3-0.5 ms; raise this for fast loops.

    Raises:
        ValueError: ``verbose_batches`` is not an int >= 0, or ``device`` is invalid.

    Example:
        >>> from tbmem._internal.monitor import EpochPerformanceMonitor
        >>> EpochPerformanceMonitor(enabled=False).get_statistics()["num_epochs"]
        0
    """

    def __init__(self, enabled: bool = True, verbose_batches: int = 5, *_old: Any, device: DeviceLike = None,
                 writer: Any = None, file: TextIO | None = None, log_every: int = 1) -> None:
        if _old:  # before 0.2: EpochPerformanceMonitor(enabled, verbose_batches, device)
            (device,) = old_positional("EpochPerformanceMonitor", ("device",), _old, {"device": device})
        self.enabled = bool(enabled)
        self.verbose_batches = check_count(verbose_batches, "verbose_batches")
        self.log_every = check_positive(log_every, "log_every")
        self.device = check_device(device)
        self.file = check_file(file)
        self._sink = make_sink(writer) if self.enabled else None
        self.global_step = 0
        self.epoch = 0
        # One add per batch (it runs inside the training loop): the batches of the current epoch,
        # folded into those of the epochs before when the next epoch starts.
        self._batches = AggregateStats()  # epochs before the current one
        self._epoch_batches = AggregateStats()  # current epoch
        self._epoch_total = 0.0
        self._epoch_t0: float | None = None
        self._batch_t0: float | None = None
        self._window: PeakWindow | None = None

    def on_epoch_start(self) -> None:
        """Begin an epoch: start the epoch clock and the peak window."""
        if not self.enabled:
            return
        try:
            synchronize(self.device)
            if self._window is not None:
                self._window.close()
            self._window = PeakWindow.open(self.device)
            self._batches = self._batches.merged(self._epoch_batches)
            self._epoch_batches = AggregateStats()
            self._epoch_t0 = self._batch_t0 = time.perf_counter()
        except Exception as exc:  # noqa: BLE001 - monitoring never raises into training
            hook_failed("EpochPerformanceMonitor.on_epoch_start", exc)

    def on_batch_start(self, batch_idx: int | None = None) -> None:
        """Start the batch clock (optional: without it a batch starts when the previous ended)."""
        if not self.enabled:
            return
        if tp.cuda_ready():  # checked here first: these two hooks run at every batch
            synchronize(self.device)
        self._batch_t0 = time.perf_counter()

    def on_batch_end(self, batch_idx: int, loss: Any = None) -> None:
        """Stop the batch clock; print the batch if ``batch_idx < verbose_batches``; write it."""
        if not self.enabled:
            return
        if tp.cuda_ready():
            synchronize(self.device)
        now = time.perf_counter()
        step = self.global_step
        self.global_step += 1
        if self._batch_t0 is None:  # no on_epoch_start: the first batch has no start time
            self._batch_t0 = now
            return
        seconds = now - self._batch_t0
        self._batch_t0 = now
        self._epoch_batches.add(seconds)
        verbose = isinstance(batch_idx, int) and batch_idx < self.verbose_batches
        log = self._sink is not None and step % self.log_every == 0
        if not (verbose or log):
            return
        try:
            reading = read(self.device)
            summary = loss_summary(loss)  # converted once: .item() syncs a CUDA loss
            if verbose:
                tail = "" if loss is None else f", loss={render_loss(summary, loss)}"
                gpu = format_mb(reading.gpu_allocated, unit="MB")
                emit(f"Batch {batch_idx}: {seconds:.3f}s, GPU {gpu}, CPU {format_mb(reading.cpu, unit='MB')}{tail}",
                     file=self.file)
            if log and self._sink is not None:
                self._sink.write([("batch_time", None, seconds), ("batch_gpu", None, reading.gpu_allocated),
                                  ("batch_cpu", None, reading.cpu),
                                  ("batch_loss", None, None if summary is None else summary[0])], step)
        except Exception as exc:  # noqa: BLE001 - monitoring never raises into training
            hook_failed("EpochPerformanceMonitor.on_batch_end", exc)

    def on_epoch_end(self) -> None:
        """End an epoch: print its time, memory and peak, and the batch timing statistics."""
        if not self.enabled or self._epoch_t0 is None:
            return
        synchronize(self.device)
        seconds = time.perf_counter() - self._epoch_t0
        self._epoch_t0 = self._batch_t0 = None
        self._epoch_total += seconds
        epoch = self.epoch
        self.epoch += 1
        try:
            reading = read(self.device)
            cpu_peak, gpu_peak = self._window.close() if self._window is not None else (None, None)
            self._window = None
            if reading.has_gpu:
                peak = gpu_peak if gpu_peak is not None else reading.gpu_peak
                line = (f"Epoch end: {seconds:.3f}s total, GPU {format_mb(reading.gpu_allocated, unit='MB')}, "
                        f"{format_mb(reading.gpu_reserved, '.0f', 'MB')} reserved, peak {format_mb(peak, '.0f', 'MB')}")
            else:
                peak = cpu_peak if cpu_peak is not None else reading.cpu
                line = (f"Epoch end: {seconds:.3f}s total, GPU n/a, CPU {format_mb(reading.cpu, unit='MB')}, "
                        f"peak CPU {format_mb(peak, '.0f', 'MB')}")
            lines = [line]
            b = self._epoch_batches
            if b.count:
                lines.append(f"Batch timing: avg={b.mean:.3f}s, min={b.min:.3f}s, max={b.max:.3f}s")
            emit(*lines, file=self.file)
            if self._sink is not None:
                key = "epoch_peak_gpu" if reading.has_gpu else "epoch_peak_rss"
                self._sink.write([("epoch_time", None, seconds), (key, None, peak)], epoch)
        except Exception as exc:  # noqa: BLE001 - monitoring never raises into training
            hook_failed("EpochPerformanceMonitor.on_epoch_end", exc)

    def get_statistics(self) -> dict[str, float | int]:
        """Timing over every finished epoch and every batch so far (seconds; zeros before any)."""
        b = self._batches.merged(self._epoch_batches)
        return {
            "total_epoch_time": self._epoch_total,
            "avg_epoch_time": self._epoch_total / self.epoch if self.epoch else 0.0,
            "total_batch_time": b.total,
            "avg_batch_time": b.mean,
            "min_batch_time": b.min if b.count else 0.0,
            "max_batch_time": b.max,
            "num_batches": b.count,
            "num_epochs": self.epoch,
        }
