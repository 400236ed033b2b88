"""How many bytes a training step may use: the default budget of :meth:`Forecast.max_batch_size`.

CUDA: the driver's free memory plus what this process's caching allocator already
reserved (its cached blocks are free for our tensors), minus a margin:

* ``CUDA_FRAGMENTATION_FRACTION`` (10%) of that: the caching allocator rounds
  blocks and splits segments, so it reserves more than the live tensors need
  (reserved / allocated is typically 1.02-1.15 at a step's peak);
* ``CUDA_LIBRARY_BYTES`` (256 MiB): memory outside the allocator that libraries may
  still create (cuBLAS/cuDNN handles, NCCL buffers, lazily loaded kernels);
* ``CUDA_CONTEXT_BYTES`` (512 MiB) only for free memory read before CUDA was initialised
  (``initialised=False``): the context itself, which the driver's free memory excludes
  once it exists.

CPU: the system's available RAM plus the tensor bytes the step needs that are resident
already (the model, gradients, optimizer state), minus ``CPU_MARGIN_FRACTION`` (10%)
of the available RAM for other processes, the allocator's own overhead and what the step
allocates outside tensors.

This module does not import torch (the analysis hints use the same margins).

Example:
    >>> from tbmem._internal.forecast.budget import cuda_budget
    >>> b = cuda_budget(free=60 * 2**30, reserved=4 * 2**30)
    >>> round(b.bytes / 2**30, 2)
    57.35
    >>> print(b.explanation)
    free 60.00 GiB + reserved by this process 4.00 GiB - 10% for fragmentation 6.40 GiB - 0.25 GiB for libraries
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Budget", "cuda_budget", "cpu_budget", "default_budget", "CUDA_FRAGMENTATION_FRACTION",
           "CUDA_LIBRARY_BYTES", "CUDA_CONTEXT_BYTES", "CPU_MARGIN_FRACTION"]

CUDA_FRAGMENTATION_FRACTION = 0.10
CUDA_LIBRARY_BYTES = 256 * 2**20
CUDA_CONTEXT_BYTES = 512 * 2**20
CPU_MARGIN_FRACTION = 0.10
_GIB = float(2**30)


@dataclass(frozen=True)
class Budget:
    """A byte budget and where it came from.

    Attributes:
        bytes: The budget.
        device: ``cpu`` or ``cuda:<index>``.
        explanation: The arithmetic, in words.
    """

    bytes: int
    device: str
    explanation: str


def cuda_budget(*, free: int, reserved: int, initialised: bool = True, device: str = "cuda:0") -> Budget:
    """The budget of a CUDA device from the driver's free bytes and this process's reserved bytes."""
    usable = free + reserved
    fragmentation = CUDA_FRAGMENTATION_FRACTION * usable
    margin = fragmentation + CUDA_LIBRARY_BYTES + (0 if initialised else CUDA_CONTEXT_BYTES)
    text = (f"free {free / _GIB:.2f} GiB + reserved by this process {reserved / _GIB:.2f} GiB - "
            f"{CUDA_FRAGMENTATION_FRACTION:.0%} for fragmentation {fragmentation / _GIB:.2f} GiB - "
            f"{CUDA_LIBRARY_BYTES / _GIB:.2f} GiB for libraries")
    if not initialised:
        text += f" - {CUDA_CONTEXT_BYTES / _GIB:.2f} GiB for the CUDA context"
    return Budget(bytes=max(int(usable - margin), 0), device=device, explanation=text)


def cpu_budget(*, available: int, resident: int) -> Budget:
    """The budget in host RAM: available RAM plus the step's tensors already resident, minus a margin."""
    margin = CPU_MARGIN_FRACTION * available
    text = (f"available RAM {available / _GIB:.2f} GiB + tensors already resident {resident / _GIB:.2f} GiB - "
            f"{CPU_MARGIN_FRACTION:.0%} of available {margin / _GIB:.2f} GiB")
    return Budget(bytes=max(int(available + resident - margin), 0), device="cpu", explanation=text)


def default_budget(device: str, *, resident: int = 0) -> Budget:
    """The budget of ``device`` (``cpu`` or ``cuda:<i>``) now.

    Args:
        device: Where the step runs.
        resident: CPU only: tensor bytes of the step that are already resident (parameters,
            gradients, optimizer state), so that available RAM does not count them as used.
    """
    if device.startswith("cuda"):
        from tbmem._internal import _torch_private as tp

        index = int(device.split(":")[1]) if ":" in device else 0
        info = tp.cuda_mem_get_info(index)
        if info is None:  # CUDA not initialised by the user's code: asking for its budget does it
            import torch

            free, _total = torch.cuda.mem_get_info(index)
            return cuda_budget(free=int(free), reserved=0, device=device)
        stats = tp.cuda_memory_stats(index) or {}
        return cuda_budget(free=info[0], reserved=int(stats.get("reserved_bytes.all.current", 0)), device=device)
    import psutil

    return cpu_budget(available=int(psutil.virtual_memory().available), resident=resident)
