"""Device memory of accelerators beyond CUDA, read into the same readings (and so the same tags) as CUDA's.

* Intel XPU: ``torch.xpu.memory_stats`` has the CUDA caching allocator's keys (allocated, reserved,
  active, peaks, retries, OOMs) and ``torch.xpu.mem_get_info`` the driver's free and total.
* Apple MPS: ``torch.mps.current_allocated_memory`` (the tensors) is ``vram_allocated``,
  ``driver_allocated_memory`` (what Metal holds for the process, cache included) ``vram_reserved``,
  ``recommended_max_memory`` ``vram_total``; MPS has no peaks, retries, OOM count or free bytes.

A probe returns ``{}`` while its device is not in use, as :class:`~tbmem.CudaProbe`
does; every torch call goes through :mod:`tbmem._internal._torch_private`, which checks each feature first.

Example:
    >>> XpuProbe().read(), MpsProbe().read()  # no XPU or Apple GPU here
    ({}, {})
"""

from __future__ import annotations

from typing import Any

from tbmem._internal import _torch_private as tp
from tbmem._internal.probes.base import Probe

__all__ = ["MpsProbe", "XpuProbe", "accelerator_readings"]


def _allocator_readings(stats: Any, info: tuple[int, int] | None) -> dict[str, float]:
    """The CUDA-style readings of a caching allocator's ``memory_stats`` (CUDA's keys, XPU's too)."""
    allocated = float(stats.get("allocated_bytes.all.current", 0))
    reserved = float(stats.get("reserved_bytes.all.current", 0))
    out = {"vram_allocated": allocated, "vram_reserved": reserved,
           "vram_active": float(stats.get("active_bytes.all.current", 0)),
           "vram_inactive_split": float(stats.get("inactive_split_bytes.all.current", 0)),
           "vram_peak_allocated": float(stats.get("allocated_bytes.all.peak", allocated)),
           "vram_peak_reserved": float(stats.get("reserved_bytes.all.peak", reserved)),
           "fragmentation": (reserved - allocated) / reserved * 100.0 if reserved > 0 else 0.0,
           "vram_alloc_retries": float(stats.get("num_alloc_retries", 0)),
           "vram_ooms": float(stats.get("num_ooms", 0))}
    if info is not None:
        free, total = info
        out.update(vram_free=float(free), vram_total=float(total),
                   vram_percent=reserved / total * 100.0 if total else 0.0,
                   vram_outside_allocator=float(total - free) - reserved)
    return out


class XpuProbe(Probe):
    """Reads ``torch.xpu.memory_stats`` of one Intel GPU.

    Args:
        device: XPU index (default 0).
        peak_mode: ``"window"`` resets the peaks after each read, ``"run"`` never.
    """

    name = "xpu"

    def __init__(self, *, device: int = 0, peak_mode: str = "window") -> None:
        if peak_mode not in ("window", "run"):
            raise ValueError(f"peak_mode must be 'window' or 'run', got {peak_mode!r}")
        self.device, self.peak_mode = device, peak_mode
        self._available: bool | None = None

    def read(self) -> dict[str, float]:
        if self._available is None:
            self._available = tp.xpu_available()
        got = tp.xpu_memory(self.device) if self._available else None
        if got is None:
            return {}
        out = _allocator_readings(*got)
        if self.peak_mode == "window":
            tp.reset_xpu_peaks(self.device)
        return out


class MpsProbe(Probe):
    """Reads the Apple GPU's allocated and driver-held bytes (``torch.mps``)."""

    name = "mps"

    def __init__(self) -> None:
        self._available: bool | None = None

    def read(self) -> dict[str, float]:
        if self._available is None:
            self._available = tp.mps_available()
        got = tp.mps_memory() if self._available else None
        if got is None or got[:2] == (0, 0):  # a CPU run on a Mac: no VRAM curves of zeros
            return {}
        allocated, driver, recommended = got
        out = {"vram_allocated": float(allocated), "vram_reserved": float(driver)}
        if recommended:
            out.update(vram_total=float(recommended), vram_percent=driver / recommended * 100.0)
        return out


def accelerator_readings(xpu: XpuProbe, mps: MpsProbe) -> dict[str, float]:
    """The first of XPU, MPS that is in use (what the device probe reads where CUDA is not)."""
    return xpu.read() or mps.read()
