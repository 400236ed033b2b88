"""Readings for the console monitors: process RSS, CUDA allocator counters, windowed peaks.

Nothing here initialises CUDA: device numbers are read only when
``tbmem._internal._torch_private.cuda_ready()`` says the program already initialised it,
and are None otherwise (shown as ``n/a``, never as 0). Every failure is
reported once on the ``tbmem`` logger and turns into a missing value, because
these functions run inside training loops and PhiFlow loss functions.

RSS is read with :func:`tbmem._internal.probes.host.read_rss` (``/proc/self/statm`` kept
open, a few microseconds; psutil where there is no /proc) rather than
``HostProbe.read()``, which also reads system RAM, swap and CPU use: the monitors
read memory once per batch. The peak RSS comes from the same functions as
HostProbe's (``read_peak_rss``/``reset_peak_rss``).

Example:
    >>> from tbmem._internal.monitor.readings import PeakWindow, read
    >>> reading = read()
    >>> reading.cpu > 0, reading.gpu_allocated  # no CUDA initialised: GPU unknown
    (True, None)
    >>> window = PeakWindow.open()
    >>> cpu_peak, gpu_peak = window.close()
    >>> cpu_peak >= reading.cpu * 0.5, gpu_peak
    (True, None)
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psutil

from tbmem._internal import _torch_private as tp
from tbmem._internal._log import report_once
from tbmem._internal.probes.host import read_peak_rss, read_rss, reset_peak_rss

__all__ = ["Reading", "read", "cpu_rss", "gpu_stats", "resolve_device", "synchronize", "PeakWindow"]

@dataclass(frozen=True)
class Reading:
    """Memory at one instant, in bytes; GPU fields are None when CUDA is not ready."""

    cpu: float | None
    gpu_allocated: float | None = None
    gpu_reserved: float | None = None
    gpu_peak: float | None = None

    @property
    def has_gpu(self) -> bool:
        """Whether the GPU numbers were read."""
        return self.gpu_allocated is not None


def cpu_rss() -> float | None:
    """This process's resident set size in bytes, or None when it cannot be read."""
    try:
        return float(read_rss())
    except (psutil.Error, OSError) as exc:
        report_once("monitor:rss", "tbmem: the monitors cannot read the process RSS", exc=exc)
        return None


def resolve_device(device: int | None) -> int | None:
    """The CUDA device index to read, or None when CUDA is not ready (never initialises it)."""
    try:
        if not tp.cuda_ready():
            return None
        return device if device is not None else tp.cuda_current_device()
    except Exception as exc:  # noqa: BLE001 - a broken driver must not reach training
        report_once("monitor:cuda", "tbmem: the monitors cannot read CUDA memory", exc=exc)
        return None


def gpu_stats(device: int | None) -> Mapping[str, Any] | None:
    """``torch.cuda.memory_stats`` of ``device`` (None: the current device) or None."""
    index = resolve_device(device)
    if index is None:
        return None
    try:
        return tp.cuda_memory_stats(index)
    except Exception as exc:  # noqa: BLE001 - a broken driver must not reach training
        report_once("monitor:cuda", "tbmem: the monitors cannot read CUDA memory", exc=exc)
        return None


def read(device: int | None = None, *, gpu: bool = True) -> Reading:
    """Read RSS and (when ``gpu`` and CUDA is ready) the allocator's current/peak bytes."""
    stats = gpu_stats(device) if gpu else None
    if not stats:
        return Reading(cpu=cpu_rss())
    allocated = float(stats.get("allocated_bytes.all.current", 0))
    return Reading(
        cpu=cpu_rss(),
        gpu_allocated=allocated,
        gpu_reserved=float(stats.get("reserved_bytes.all.current", 0)),
        gpu_peak=float(stats.get("allocated_bytes.all.peak", allocated)),
    )


def synchronize(device: int | None) -> None:
    """Wait for queued CUDA work (only when CUDA is ready) so wall-clock timings include it."""
    try:
        tp.synchronize_if_pending(device)
    except Exception as exc:  # noqa: BLE001 - a failed sync only makes a timing less exact
        report_once("monitor:sync", "tbmem: could not synchronise CUDA before a timing", exc=exc)


_lock = threading.Lock()
_open_windows: "weakref.WeakSet[PeakWindow]" = weakref.WeakSet()


class PeakWindow:
    """The peak RSS and peak allocated GPU bytes between :meth:`open` and :meth:`close`.

    Opening a window resets the kernel's RSS high-water mark (``VmHWM``) and the
    allocator's peak counters, after folding their values into every window still
    open, so nested windows (a ``track_memory`` inside an epoch) each keep their
    own correct peak. Where the kernel refuses the reset, the CPU peak is the
    whole-run peak (:attr:`cpu_windowed` is False). Resetting is visible to other
    readers of the same counters (``torch.cuda.max_memory_allocated``, a
    MemoryWriter's windowed peaks); that is documented in docs/console-api.md.
    """

    def __init__(self, device: int | None) -> None:
        self.device = device
        self.cpu_peak: float | None = None
        self.gpu_peak: float | None = None
        self.cpu_windowed = False
        self.closed = False

    @classmethod
    def open(cls, device: int | None = None, *, gpu: bool = True) -> "PeakWindow":
        """Start a window on ``device`` (None: current CUDA device)."""
        window = cls(resolve_device(device) if gpu else None)
        with _lock:
            _fold_open_windows(window.device)
            window.cpu_windowed = reset_peak_rss()
            if window.device is not None:
                _guarded_reset(window.device)
            _open_windows.add(window)
        return window

    def _fold(self, cpu: float | None, gpu: float | None) -> None:
        if cpu is not None:
            self.cpu_peak = cpu if self.cpu_peak is None else max(self.cpu_peak, cpu)
        if gpu is not None and self.device is not None:
            self.gpu_peak = gpu if self.gpu_peak is None else max(self.gpu_peak, gpu)

    def close(self) -> tuple[float | None, float | None]:
        """End the window; return (peak RSS bytes, peak allocated GPU bytes or None)."""
        with _lock:
            if not self.closed:
                cpu, gpu = _current_peaks(self.device)
                self._fold(cpu, gpu)
                self.closed = True
                _open_windows.discard(self)
        return self.cpu_peak, self.gpu_peak


def _gpu_peak(device: int | None) -> float | None:
    stats = gpu_stats(device) if device is not None else None
    if not stats:
        return None
    return float(stats.get("allocated_bytes.all.peak", stats.get("allocated_bytes.all.current", 0)))


def _current_peaks(device: int | None) -> tuple[float | None, float | None]:
    rss = cpu_rss()
    hwm = read_peak_rss()
    cpu = None if hwm is None and rss is None else max(float(hwm or 0), rss or 0.0)
    return cpu, _gpu_peak(device)


def _fold_open_windows(device: int | None) -> None:
    """Before a reset: give every open window the peaks reached so far."""
    if not _open_windows:
        return
    cpu, gpu = _current_peaks(device)
    for window in list(_open_windows):
        # Only windows on the device being reset lose their GPU peak, so only they get it folded.
        window._fold(cpu, gpu if window.device == device else None)


def _guarded_reset(device: int) -> None:
    try:
        tp.reset_cuda_peaks(device)
    except Exception as exc:  # noqa: BLE001 - peaks are then whole-run peaks
        report_once("monitor:cuda-peaks", "tbmem: could not reset the CUDA peak counters", exc=exc)
