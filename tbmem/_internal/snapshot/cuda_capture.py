"""CUDA capture: drives ``torch.cuda.memory._record_memory_history`` and ``_snapshot`` (and the same of
``torch.xpu.memory`` for an Intel XPU, where torch records its history: :class:`XpuRecorder`).

Every private call goes through :mod:`tbmem._internal._torch_private`; the conversion of
torch's dict lives in :mod:`tbmem._internal.snapshot.cuda`, which does not import torch
(the TensorBoard plugin and ``tbmem snapshot`` read snapshots without it).

Example:
    >>> from tbmem._internal.snapshot.cuda_capture import CudaRecorder
    >>> CudaRecorder().start()  # False: CUDA is not initialised on this machine
    False
"""

from __future__ import annotations

import time
from typing import Any, Mapping

import numpy as np

from tbmem._internal import _torch_private as tp
from tbmem._internal.snapshot import markers
from tbmem._internal.snapshot.cuda import convert_torch_snapshot
from tbmem._internal.snapshot.frames import local_roots
from tbmem._internal.snapshot.schema import Snapshot

__all__ = ["CudaRecorder", "XpuRecorder"]


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

    device_type = "cuda"

    def _record(self, stacks: str) -> bool:
        return tp.record_memory_history(stacks=stacks, max_entries=self.max_entries)

    def _stop(self) -> None:
        tp.stop_memory_history()

    def _current(self) -> int | None:
        return tp.cuda_current_device()

    def start(self) -> bool:
        """Start recording; False when CUDA is not initialised or history is unsupported."""
        if self.active:
            return True
        stacks = "python" if self.stacks == "none" else self.stacks
        self.active = self._record(stacks)
        if self.active:
            self.marks: list[tuple[int, str, str]] = []
            markers.register(self)
        return self.active

    def mark(self, label: str, *, kind: str = "step") -> None:
        """A step or phase boundary: a torch memory annotation where this torch records them
        (``tbmem:<label>`` in the snapshot's ``external_annotations``), and always kept here."""
        self.marks.append((time.time_ns() // 1000, label, kind))
        tp.cuda_annotate(f"tbmem:{label}")

    def stop(self) -> None:
        """Stop recording (the history is discarded by torch)."""
        if self.active:
            markers.unregister(self)
            self._stop()
            self.active = False

    def raw_snapshot(self) -> dict[str, Any] | None:
        """torch's snapshot dict (works without recording too: segments only)."""
        return tp.cuda_snapshot()

    def snapshot(self, raw: Mapping[str, Any], *, kind: str, step: int, rank: int = 0) -> Snapshot:
        """Convert a raw dict for the current device."""
        snap = convert_torch_snapshot(raw, kind=kind, step=step, rank=rank, device=self._current(),
                                      device_type=self.device_type)
        packages, stdlibs = local_roots()
        snap.meta.update({"recorder": f"{self.device_type}._record_memory_history", "library_roots": list(packages),
                          "stdlib_roots": list(stdlibs)})
        self._add_marks(snap)
        kinds = {label: kind for _, label, kind in getattr(self, "marks", ())}
        for dev in snap.devices:  # an annotation carries its label only: the kind each mark was made with
            for m in dev.markers:
                if m.get("kind") in ("step", "phase") and m.get("label") in kinds:
                    m["kind"] = kinds[m["label"]]
        return snap

    def _add_marks(self, snap: Snapshot) -> None:
        """Markers kept here, on devices whose trace has none from annotations (older torch)."""
        for dev in snap.devices:
            if any(m.get("kind") in markers.KINDS for m in dev.markers) or not dev.has_time or not dev.n_events:
                continue
            t0 = int(round((snap.t0_unix or 0) * 1e6))
            for t, label, kind in getattr(self, "marks", ()):
                ev = int(np.searchsorted(dev.time_us, t - t0))
                if ev < dev.n_events:
                    dev.markers.append({"event": ev, "label": label, "kind": kind})
            dev.markers.sort(key=lambda m: m["event"])


class XpuRecorder(CudaRecorder):
    """:class:`CudaRecorder` for an Intel XPU: ``torch.xpu.memory._record_memory_history`` and ``_snapshot``
    (the same trace format, devices named ``xpu:N``), where this torch has them
    (:func:`tbmem._internal._torch_private.xpu_has_memory_history`)."""

    device_type = "xpu"

    def _record(self, stacks: str) -> bool:
        return tp.xpu_record_memory_history(stacks=stacks, max_entries=self.max_entries)

    def _stop(self) -> None:
        tp.xpu_stop_memory_history()

    def _current(self) -> int | None:
        return tp.xpu_current_device()

    def mark(self, label: str, *, kind: str = "step") -> None:
        """A step or phase boundary, kept here (torch annotates CUDA's history only)."""
        self.marks.append((time.time_ns() // 1000, label, kind))

    def raw_snapshot(self) -> dict[str, Any] | None:
        """torch's XPU snapshot dict."""
        return tp.xpu_snapshot()
