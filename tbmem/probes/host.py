"""Host memory: process RSS/USS, windowed peak RSS, system RAM, swap and CPU use.

Windowed peak RSS: on Linux the kernel's high-water mark ``VmHWM`` in
``/proc/self/status`` is reset by writing ``5`` to ``/proc/self/clear_refs``.
When that file is not writable (containers with a read-only /proc, other
operating systems), the peak falls back to the whole-run maximum from
``getrusage(RUSAGE_SELF).ru_maxrss`` and :attr:`HostProbe.peak_is_windowed`
is False.

Example:
    >>> from tbmem.probes.host import HostProbe
    >>> probe = HostProbe(peak_mode="window")
    >>> probe.start()
    >>> sorted(probe.read())[:3]
    ['cpu_percent', 'ram_peak_rss', 'ram_rss']
"""

from __future__ import annotations

import os
import sys

import psutil

from tbmem.probes.base import Probe

__all__ = ["HostProbe", "read_peak_rss", "reset_peak_rss"]

_STATUS = "/proc/self/status"
_CLEAR_REFS = "/proc/self/clear_refs"


def read_peak_rss() -> int | None:
    """The process's RSS high-water mark in bytes (VmHWM on Linux, ru_maxrss elsewhere)."""
    try:
        with open(_STATUS, "rb") as fh:
            for line in fh:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
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
        with open(_CLEAR_REFS, "w") as fh:
            fh.write("5")
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
    """

    name = "host"

    def __init__(self, *, peak_mode: str = "window", uss: bool = False) -> None:
        if peak_mode not in ("window", "run"):
            raise ValueError(f"peak_mode must be 'window' or 'run', got {peak_mode!r}")
        self.peak_mode = peak_mode
        self.uss = uss
        self._process = psutil.Process(os.getpid())
        self.peak_is_windowed = False

    def start(self) -> None:
        self._process.cpu_percent(None)  # primes the CPU-time baseline
        if self.peak_mode == "window":
            self.peak_is_windowed = reset_peak_rss()

    def read(self) -> dict[str, float]:
        readings: dict[str, float] = {}
        if self.uss:
            full = self._process.memory_full_info()
            readings["ram_rss"] = float(full.rss)
            readings["ram_uss"] = float(full.uss)
        else:
            readings["ram_rss"] = float(self._process.memory_info().rss)
        peak = read_peak_rss()
        if peak is not None:
            readings["ram_peak_rss"] = float(max(peak, readings["ram_rss"]))
        if self.peak_mode == "window":
            self.peak_is_windowed = reset_peak_rss()
        vm = psutil.virtual_memory()
        readings["ram_system_used"] = float(vm.total - vm.available)
        readings["ram_system_available"] = float(vm.available)
        readings["ram_system_percent"] = float(vm.percent)
        readings["ram_swap_used"] = float(psutil.swap_memory().used)
        readings["cpu_percent"] = float(self._process.cpu_percent(None))
        return readings
