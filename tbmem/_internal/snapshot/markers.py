"""Step and phase boundaries in memory snapshots: ``mark("step 12")``, drawn on the viewer's x axis.

Recorders that are recording register here (:class:`~tbmem._internal.snapshot.recorder.DispatchRecorder`
keeps the marker in its trace; :class:`~tbmem._internal.snapshot.cuda_capture.CudaRecorder` records it
through torch's memory annotations where the running torch has them). With no recorder active
:func:`mark` is a cheap no-op, so training code and trainer adapters can call it every step.

Example:
    >>> from tbmem._internal.snapshot.markers import mark, recording
    >>> mark("step 3")  # nothing records: nothing happens
    >>> recording()
    False
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["mark", "register", "unregister", "recording", "KINDS"]

#: Marker kinds: a step boundary, a phase within a step (forward, backward, optimizer).
KINDS = ("step", "phase")
_active: list[Any] = []
_lock = threading.Lock()
_explicit_steps = False  # a caller marks its own steps: the writer's automatic marks stand aside


def register(recorder: Any) -> None:
    """A recorder that started recording (it has a ``mark(label, kind=...)`` method)."""
    with _lock:
        if recorder not in _active:
            _active.append(recorder)


def unregister(recorder: Any) -> None:
    """A recorder that stopped."""
    with _lock:
        if recorder in _active:
            _active.remove(recorder)


def recording() -> bool:
    """Whether any recorder is recording."""
    return bool(_active)


def mark(label: str, *, kind: str = "step", auto: bool = False) -> None:
    """Mark a step boundary (``kind="step"``) or the start of a phase (``"phase"``) in every
    recording. Never raises: a recorder that fails to mark is skipped.

    ``auto``: a boundary :class:`~tbmem.SnapshotManager` infers from
    ``log_memory(step)``; once any caller marks steps itself, those are no longer recorded.
    """
    global _explicit_steps
    if kind == "step" and not auto:
        _explicit_steps = True
    elif auto and _explicit_steps:
        return
    if not _active:
        return
    for rec in list(_active):
        try:
            rec.mark(str(label), kind=kind)
        except Exception:  # noqa: BLE001 - a marker must never break training
            pass
