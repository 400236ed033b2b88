"""Host memory: process RSS/USS, windowed peak RSS, system RAM, swap and CPU use.

Windowed peak RSS: on Linux the kernel's high-water mark ``VmHWM`` in
``/proc/self/status`` is reset by writing ``5`` to ``/proc/self/clear_refs``.
When that file is not writable (containers with a read-only /proc, other
operating systems), the peak falls back to the whole-run maximum from
``getrusage(RUSAGE_SELF).ru_maxrss`` and :attr:`HostProbe.peak_is_windowed`
is False.

psutil is needed only where /proc is not readable (and for USS): a psutil that
refuses access (``AccessDenied`` in some containers) does not stop the probe,
and CPU use comes from :func:`os.times`, which needs no permission.

What a record reads, every time (nothing is cached between records): ``/proc/self/status``
(RSS and the peak), a write of ``5`` to ``/proc/self/clear_refs`` (the peak's window),
:func:`os.times` (CPU); and ``/proc/meminfo`` (system RAM and swap), every time or, with
``system_every_s``, at most that often (the readings are then left out in between). The files stay open and
are re-read with ``pread`` (:mod:`tbmem._internal.probes._procfs`): the kernel generates their contents
anew at each read, so a kept file is as fresh as a newly opened one, at a third of the cost.

Example:
    >>> from tbmem._internal.probes.host import HostProbe
    >>> probe = HostProbe(peak_mode="window")
    >>> probe.start()
    >>> sorted(probe.read())[:3]
    ['cpu_percent', 'ram_peak_rss', 'ram_rss']
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import psutil

import tbmem._internal.probes._procfs as _procfs
from tbmem._internal._fields import seconds
from tbmem._internal.probes.base import Probe

__all__ = ["HostProbe", "read_rss", "read_peak_rss", "reset_peak_rss"]

_STATUS = "/proc/self/status"
_STATM = "/proc/self/statm"
_CLEAR_REFS = "/proc/self/clear_refs"
_MEMINFO = "/proc/meminfo"
_STATUS_FIELDS = (b"VmRSS", b"VmHWM")
_LOCKED_FIELDS = (b"VmLck", b"VmPin")
_MEMINFO_FIELDS = (b"MemTotal", b"MemAvailable", b"SwapTotal", b"SwapFree")


def _proc_fields(path: str, wanted: tuple[bytes, ...]) -> dict[bytes, int] | None:
    """``{field: bytes}`` for the ``kB`` fields of a /proc file, or None when it cannot be read.

    One read of /proc/self/status and one of /proc/meminfo give everything a record needs:
    about 10x cheaper than psutil's memory_info + virtual_memory + swap_memory (which also
    parses /proc/vmstat), and a record is taken inside the training loop.
    """
    try:
        data = _procfs.pread_all(path)
    except OSError:
        return None
    return _procfs.kb_fields(data, wanted)


def read_rss() -> int:
    """This process's resident set size in bytes (the second field of /proc/self/statm, kept open:
    what psutil's ``memory_info().rss`` reads, at a fifth of its cost), else through psutil.

    Raises:
        OSError, psutil.Error: neither /proc nor psutil can read it.
    """
    try:
        return int(_procfs.pread_all(_STATM).split()[1]) * _procfs.PAGE_SIZE
    except (OSError, IndexError, ValueError):
        pass
    return int(psutil.Process(os.getpid()).memory_info().rss)


def read_peak_rss() -> int | None:
    """The process's RSS high-water mark in bytes (VmHWM on Linux, ru_maxrss elsewhere)."""
    status = _proc_fields(_STATUS, (b"VmHWM",))
    if status is not None:
        return status[b"VmHWM"]
    try:
        import resource
    except ImportError:  # Windows
        return None
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports kilobytes, macOS bytes.
    return int(maxrss) if sys.platform == "darwin" else int(maxrss) * 1024


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS; False when the kernel does not allow it."""
    try:
        _procfs.write_all(_CLEAR_REFS, b"5")
        return True
    except OSError:
        return False


class HostProbe(Probe):
    """Reads host memory for this process and the system.

    Args:
        peak_mode: ``"window"`` resets the peak RSS after each read, so each
            record shows the peak since the previous one; ``"run"`` keeps the
            whole-run peak.
        uss: Also read USS (unique set size); it walks /proc/self/smaps (~4 ms).
        system_every_s: Read system RAM and swap at most once per this many seconds; reads in
            between leave them out. 0 (the default) reads them every time.

    Raises:
        ValueError: ``peak_mode`` or ``system_every_s`` is invalid.
    """

    name = "host"

    def __init__(self, *, peak_mode: str = "window", uss: bool = False, system_every_s: float = 0.0) -> None:
        if peak_mode not in ("window", "run"):
            raise ValueError(f"peak_mode must be 'window' or 'run', got {peak_mode!r}")
        self.system_every_s = seconds(system_every_s, "system_every_s")
        self.peak_mode = peak_mode
        self.uss = uss
        self._system_due = -float("inf")  # time.monotonic() from which system memory is read again
        self._psutil_process: Any = None
        self.peak_is_windowed = False
        self._cpu_mark = _cpu_times()

    @property
    def _process(self) -> Any:
        # Created on first use: psutil.Process() raises AccessDenied in some containers, and
        # only the /proc-less fallback and USS need it.
        if self._psutil_process is None:
            self._psutil_process = psutil.Process(os.getpid())
        return self._psutil_process

    def _cpu_percent(self) -> float:
        """CPU time of this process since the previous call, in percent of one core."""
        (cpu, wall), self._cpu_mark = self._cpu_mark, _cpu_times()
        elapsed = self._cpu_mark[1] - wall
        return (self._cpu_mark[0] - cpu) / elapsed * 100.0 if elapsed > 0 else 0.0

    def start(self) -> None:
        self._cpu_mark = _cpu_times()  # the CPU-time baseline
        if self.peak_mode == "window":
            self.peak_is_windowed = reset_peak_rss()

    def read(self) -> dict[str, float]:
        readings: dict[str, float] = {}
        # one read for both; a kernel without VmPin (before 3.2) gets the two fields it has
        status = _proc_fields(_STATUS, _STATUS_FIELDS + _LOCKED_FIELDS) or _proc_fields(_STATUS, _STATUS_FIELDS)
        if status is not None and (status.get(b"VmLck") or status.get(b"VmPin")):  # most processes lock no page
            readings["ram_locked"] = float(status[b"VmLck"] + status[b"VmPin"])
        if self.uss:
            full = self._process.memory_full_info()
            readings["ram_rss"] = float(full.rss)
            readings["ram_uss"] = float(full.uss)
        elif status is not None:
            readings["ram_rss"] = float(status[b"VmRSS"])
        else:
            readings["ram_rss"] = float(self._process.memory_info().rss)
        peak = status[b"VmHWM"] if status is not None else read_peak_rss()
        if peak is not None:
            readings["ram_peak_rss"] = float(max(peak, readings["ram_rss"]))
        # A reset sets the peak to the current RSS: where the window's peak is the RSS read just now (memory
        # that grows and is kept, as a CPU allocator does), it would change nothing, and it is a write
        # to /proc taking the address space's lock, inside the training step.
        if self.peak_mode == "window" and (status is None or status[b"VmHWM"] > status[b"VmRSS"]):
            self.peak_is_windowed = reset_peak_rss()
        now = time.monotonic()
        if now >= self._system_due:  # always with system_every_s=0: the clock never goes back
            readings.update(_system_memory())
            self._system_due = now + self.system_every_s
        readings["cpu_percent"] = self._cpu_percent()
        return readings


def _cpu_times() -> tuple[float, float]:
    """(user + system CPU seconds of this process, monotonic wall seconds)."""
    t = os.times()
    return t.user + t.system, time.monotonic()


def _system_memory() -> dict[str, float]:
    """System RAM and swap: from one read of /proc/meminfo, else through psutil."""
    info = _proc_fields(_MEMINFO, _MEMINFO_FIELDS)
    if info is not None:
        total, available = info[b"MemTotal"], info[b"MemAvailable"]
        swap_used = info[b"SwapTotal"] - info[b"SwapFree"]
    else:
        vm = psutil.virtual_memory()
        total, available, swap_used = vm.total, vm.available, psutil.swap_memory().used
    return {
        "ram_system_used": float(total - available),
        "ram_system_available": float(available),
        "ram_system_percent": (total - available) / total * 100.0 if total else 0.0,
        "ram_swap_used": float(swap_used),
    }
