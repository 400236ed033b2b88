"""CUDA capture: drives ``torch.cuda.memory._record_memory_history`` and ``_snapshot``.

Every private call goes through :mod:`tbmem._torch_private`; the conversion of
torch's dict lives in :mod:`tbmem.snapshot.cuda`, which does not import torch
(the TensorBoard plugin and ``tbmem snapshot`` read snapshots without it).

Example:
    >>> from tbmem.snapshot.cuda_capture import CudaRecorder
    >>> CudaRecorder().start()  # False: CUDA is not initialised on this machine
    False
"""

from __future__ import annotations

from typing import Any, Mapping

from tbmem import _torch_private as tp
from tbmem.snapshot.cuda import convert_torch_snapshot
from tbmem.snapshot.schema import Snapshot

__all__ = ["CudaRecorder"]


class CudaRecorder:
    """Records CUDA allocator history and converts it.

    Args:
        max_entries: Trace entries torch keeps (its ring buffer).
        stacks: ``"python"`` or ``"all"`` (adds C++ frames; slower), ``"none"``.
    """

    def __init__(self, *, max_entries: int = 100_000, stacks: str = "python") -> None:
        self.max_entries = max_entries
        self.stacks = stacks
        self.active = False

    def start(self) -> bool:
        """Start recording; False when CUDA is not initialised or history is unsupported."""
        if self.active:
            return True
        stacks = "python" if self.stacks == "none" else self.stacks
        self.active = tp.record_memory_history(stacks=stacks, max_entries=self.max_entries)
        return self.active

    def stop(self) -> None:
        """Stop recording (the history is discarded by torch)."""
        if self.active:
            tp.stop_memory_history()
            self.active = False

    def raw_snapshot(self) -> dict[str, Any] | None:
        """torch's snapshot dict (works without recording too: segments only)."""
        return tp.cuda_snapshot()

    def snapshot(self, raw: Mapping[str, Any], *, kind: str, step: int, rank: int = 0) -> Snapshot:
        """Convert a raw dict for the current device."""
        snap = convert_torch_snapshot(raw, kind=kind, step=step, rank=rank, device=tp.cuda_current_device())
        snap.meta["recorder"] = "cuda._record_memory_history"
        return snap
