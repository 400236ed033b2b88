"""Device memory: the CUDA caching allocator's counters, and NVML's view of the device.

Nothing here initialises CUDA. When CUDA is unavailable or not yet initialised
by the user's code, :meth:`CudaProbe.read` returns an empty dict: readings are
skipped, never zero-filled, so a CPU run has no fake VRAM curves.

Example:
    >>> from tbmem._internal.probes.device import CudaProbe
    >>> CudaProbe().read()  # {} until CUDA is initialised
    {}
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

from tbmem._internal import _torch_private as tp
from tbmem._internal._extras import require
from tbmem._internal._log import report_once
from tbmem._internal.probes.accel import MpsProbe, XpuProbe, accelerator_readings
from tbmem._internal.probes.base import Probe
from tbmem._internal.tags import named_reading

__all__ = ["CudaProbe", "NvmlProbe", "NvmlProcesses", "fragmentation_percent", "nvml_processes",
           "read_nvml_processes"]

#: Pools with a series of their own (by id); a run that makes a MemPool per step would otherwise make
#: a tag per step: the pools past these are in vram_private_pools_reserved only.
_MAX_POOLS = 16


class NvmlProcesses(NamedTuple):
    """Device memory as NVML attributes it per process (``nvmlDeviceGetComputeRunningProcesses``): this
    process's (None where NVML lists no process with its pid: another pid namespace, as in a container),
    the other processes' (all of them where this one is not found), how many others, and the bytes of
    processes whose use NVML does not report (counted in none of these)."""

    own: int | None
    others: int
    n_others: int
    not_reported: int


def nvml_processes(nvml: Any, handle: Any, pid: int | None = None) -> NvmlProcesses:
    """:class:`NvmlProcesses` of the device ``handle`` (``nvml``: the pynvml module); ``pid`` defaults to this process."""
    pid = os.getpid() if pid is None else pid
    own: int | None = None
    others = n_others = not_reported = 0
    for proc in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
        used = getattr(proc, "usedGpuMemory", None)
        if used is None:  # NVML_VALUE_NOT_AVAILABLE (pynvml gives None): the process is there, its bytes not
            not_reported += 1
        elif int(proc.pid) == pid:
            own = (own or 0) + int(used)
        else:
            others += int(used)
            n_others += 1
    return NvmlProcesses(own=own, others=others, n_others=n_others, not_reported=not_reported)


def read_nvml_processes(cuda_device: int) -> NvmlProcesses:
    """:func:`nvml_processes` of CUDA device ``cuda_device`` (initialises NVML for the call; no CUDA context).

    Raises:
        tbmem.MissingExtraError: nvidia-ml-py is not installed.
    """
    nvml = require("pynvml", extra="nvml")
    nvml.nvmlInit()
    try:
        return nvml_processes(nvml, nvml.nvmlDeviceGetHandleByIndex(tp.nvml_device_index(cuda_device)))
    finally:
        nvml.nvmlShutdown()


def fragmentation_percent(allocated: float, reserved: float) -> float:
    """Share of reserved memory that holds no tensor: ``(reserved - allocated) / reserved * 100``."""
    return (reserved - allocated) / reserved * 100.0 if reserved > 0 else 0.0


class CudaProbe(Probe):
    """Reads ``torch.cuda.memory_stats`` of one device; without CUDA, an Intel XPU's or Apple GPU's
    memory into the same readings.

    Args:
        device: CUDA device index; None means the current device at read time.
        peak_mode: ``"window"`` resets the allocator's peak counters after each
            read (each record shows the peak since the previous one; note this
            also resets what ``torch.cuda.max_memory_allocated`` returns to
            other code); ``"run"`` never resets them.
    """

    name = "cuda"

    def __init__(self, *, device: int | None = None, peak_mode: str = "window") -> None:
        if peak_mode not in ("window", "run"):
            raise ValueError(f"peak_mode must be 'window' or 'run', got {peak_mode!r}")
        self.device = device
        self.peak_mode = peak_mode
        self._integrated: bool | None = None
        self._watching = False
        self._xpu = XpuProbe(device=device or 0, peak_mode=peak_mode)
        self._mps = MpsProbe()

    def _device(self) -> int | None:
        return self.device if self.device is not None else tp.cuda_current_device()

    def start(self) -> None:
        device = self._device()
        if device is not None and self.peak_mode == "window":
            tp.reset_cuda_peaks(device)

    def read(self) -> dict[str, float]:
        device = self._device()
        stats = None if device is None else tp.cuda_memory_stats(device)
        if device is None or stats is None:  # no CUDA: an Intel XPU or Apple GPU, under the same tags
            return accelerator_readings(self._xpu, self._mps)
        if not self._watching:  # the exact bytes of an out-of-memory request (tbmem._internal.oom), once CUDA is up
            self._watching = tp.watch_oom_requests()
        allocated = float(stats.get("allocated_bytes.all.current", 0))
        reserved = float(stats.get("reserved_bytes.all.current", 0))
        readings: dict[str, Any] = {
            "vram_allocated": allocated,
            "vram_reserved": reserved,
            "vram_active": float(stats.get("active_bytes.all.current", 0)),
            "vram_inactive_split": float(stats.get("inactive_split_bytes.all.current", 0)),
            "vram_peak_allocated": float(stats.get("allocated_bytes.all.peak", allocated)),
            "vram_peak_reserved": float(stats.get("reserved_bytes.all.peak", reserved)),
            "fragmentation": fragmentation_percent(allocated, reserved),
            "vram_alloc_retries": float(stats.get("num_alloc_retries", 0)),
            "vram_ooms": float(stats.get("num_ooms", 0)),
        }
        pools = tp.private_pools_reserved(stats)
        if pools is not None:  # CUDA graphs' and MemPools' private pools (their reserved bytes are in vram_reserved)
            readings["vram_private_pools_reserved"] = float(sum(pools.values()))
            for name, nbytes in sorted(pools.items())[:_MAX_POOLS]:  # a pool's series, once torch has one
                readings[named_reading("vram_pool_reserved", name)] = float(nbytes)
                allocated_in = tp.private_pool_allocated(device, name)
                if allocated_in is not None:
                    readings[named_reading("vram_pool_allocated", name)] = float(allocated_in)
        info = tp.cuda_mem_get_info(device)
        if info is not None:
            free, total = info
            readings["vram_free"] = float(free)
            readings["vram_total"] = float(total)
            readings["vram_percent"] = reserved / total * 100.0 if total else 0.0
            # what the driver counts in use and the allocator did not reserve (may include other processes)
            readings["vram_outside_allocator"] = float(total - free) - reserved
            if self._integrated is None:
                self._integrated = tp.cuda_is_integrated(device)
                if self._integrated:
                    report_once("cuda:integrated", f"tbmem: cuda:{device} shares the host's memory (unified memory): "
                                "nvidia-smi shows no device memory for it; mem_get_info's free and total are the "
                                "system's, so the bytes outside PyTorch's allocator include every host process")
        pinned = tp.cuda_pinned_host_bytes()
        if pinned is not None:
            readings["ram_pinned_host"] = float(pinned)
        if self.peak_mode == "window":
            tp.reset_cuda_peaks(device)
        return readings


class NvmlProbe(Probe):
    """Device memory used as nvidia-smi reports it (all contexts, not only PyTorch's allocator).

    Needs the ``nvml`` extra (nvidia-ml-py). NVML does not create a CUDA context.

    Args:
        device: Physical device index as NVML numbers them.

    Raises:
        tbmem.MissingExtraError: nvidia-ml-py is not installed.
    """

    name = "nvml"

    def __init__(self, *, device: int = 0) -> None:
        self._nvml = require("pynvml", extra="nvml")
        self.device = device
        self._handle: Any = None
        self._processes = True

    def start(self) -> None:
        if self._handle is None:
            self._nvml.nvmlInit()
            self._handle = self._nvml.nvmlDeviceGetHandleByIndex(self.device)

    def read(self) -> dict[str, float]:
        self.start()
        info = self._nvml.nvmlDeviceGetMemoryInfo(self._handle)
        readings = {"vram_nvml_used": float(info.used)}
        if self._processes:
            try:
                split = nvml_processes(self._nvml, self._handle)
            except self._nvml.NVMLError as exc:  # not supported on this device or driver: used only
                self._processes = False
                report_once("nvml:processes", "tbmem: NVML does not attribute this device's memory to processes; "
                            "only the device's used bytes are recorded", exc=exc)
                split = None
            if split is not None and split.own is not None:
                readings["vram_nvml_process"] = float(split.own)
                readings["vram_nvml_other_processes"] = float(split.others)
        return readings

    def stop(self) -> None:
        if self._handle is not None:
            self._nvml.nvmlShutdown()
            self._handle = None
