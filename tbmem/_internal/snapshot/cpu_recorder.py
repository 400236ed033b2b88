"""One recording of the calling thread's CPU allocations through torch's CPU allocator (the compiled
recorder of :mod:`tbmem._internal.snapshot.native`), turned into the snapshot schema the dispatch recorder writes.

Against the dispatch-mode recorder it sees every block the CPU allocator hands out on the recording
thread (the 8-byte tensors that wrap Python numbers, temporaries freed inside an operator) and it
costs nothing per operator: an operator that allocates nothing never leaves C++. It does not see a
view of, or an in-place write to, a storage allocated before the recording (no allocation happens),
so those storages' frees are seen only for watched parameters, gradients and optimizer states.

:class:`~tbmem._internal.snapshot.recorder.DispatchRecorder` uses it for CPU recordings where the recorder
could be built; docs/snapshots.md says when.

Example:
    >>> import torch
    >>> from tbmem._internal.snapshot import native
    >>> from tbmem._internal.snapshot.cpu_recorder import AllocatorRecording
    >>> mod = native.load()
    >>> if mod is not None:
    ...     rec = AllocatorRecording(mod, max_entries=1000)
    ...     rec.start()
    ...     y = torch.ones(256) * 2
    ...     _ = rec.stop()
    ...     assert 1024 in rec.builder().cols["size"].tolist()
"""

from __future__ import annotations

import weakref
from types import ModuleType
from typing import Any

import numpy as np

from tbmem._internal import _torch_private as tp
from tbmem._internal.snapshot.schema import SnapshotBuilder

__all__ = ["AllocatorRecording"]

# the categories the compiled recorder assigns, by id (it asks autograd, as the dispatch recorder does)
_RECORDED = ("activation", "backward", "no_grad")


class AllocatorRecording:
    """The calling thread's CPU allocations between :meth:`start` and :meth:`stop`.

    Args:
        module: The loaded recorder (:func:`tbmem._internal.snapshot.native.load`).
        max_entries: Events kept; beyond it the oldest half is dropped.
        stacks: Record a Python stack per allocation.
        stack_depth: Frames kept per stack.
        skip_suffixes: Frames of files ending so are machinery, not the allocating code.
    """

    def __init__(self, module: ModuleType, *, max_entries: int = 100_000, stacks: bool = True,
                 stack_depth: int = 16, skip_suffixes: tuple[str, ...] = ()) -> None:
        self._categories: dict[str, int] = {name: i for i, name in enumerate(_RECORDED)}
        self._rec = module.Recording(max_entries=max(2, max_entries), stacks=stacks, stack_depth=stack_depth,
                                     categories=tuple(range(len(_RECORDED))),
                                     graph_task_id=tp.graph_task_id_getter(), skip_suffixes=tuple(skip_suffixes))
        self._marks: list[tuple[str, str]] = []
        self._watched: dict[int, list[Any]] = {}  # id(storage) -> [handle, weak reference]
        self._sids: dict[int, int] = {}  # id(weak reference) -> id(storage)
        self._on_free = self._freed

    @property
    def live(self) -> bool:
        """Whether it records now."""
        return bool(self._rec.live)

    def start(self) -> None:
        """Record the calling thread's CPU allocations from now on."""
        self._rec.start()

    def stop(self) -> bool:
        """Stop recording; False when called from another thread than the recording one (that
        thread drops it at its next ``module.release()``)."""
        return bool(self._rec.stop())

    def mark(self, label: str, kind: str = "step") -> None:
        """A step or phase boundary before the next recorded event."""
        self._rec.mark()
        self._marks.append((str(label), str(kind)))

    def category_id(self, name: str) -> int:
        cid = self._categories.get(name)
        if cid is None:
            cid = self._categories[name] = len(self._categories)
        return cid

    def watch(self, storage: Any, role: str) -> None:
        """Record ``storage`` as alive before the trace, with its free (a watched tensor)."""
        sid = id(storage)
        if sid in self._watched or storage.nbytes() == 0:
            return
        handle = self._rec.add(storage.nbytes(), self.category_id(role), storage.data_ptr(), True)
        ref = weakref.ref(storage, self._on_free)
        self._watched[sid] = [handle, ref]
        self._sids[id(ref)] = sid

    def _freed(self, ref: weakref.ref) -> None:
        sid = self._sids.pop(id(ref), None)
        entry = self._watched.get(sid) if sid is not None else None
        if sid is None or entry is None or entry[1] is not ref:
            return
        del self._watched[sid]
        self._rec.free_handle(entry[0])

    def builder(self, *, roles_by_addr: dict[int, str] | None = None,
                roles_by_storage: dict[int, str] | None = None) -> SnapshotBuilder:
        """A :class:`SnapshotBuilder` holding a copy of the recording; blocks alive now at an address
        of ``roles_by_addr`` (recorded ones) or with an ``id(storage)`` of ``roles_by_storage`` (watched
        ones) are named by their role (``parameter``, ``gradient``, ``optimizer_state``)."""
        raw = self._rec.columns()
        col = {k: np.frombuffer(v, dtype=np.int64) for k, v in raw.items() if isinstance(v, bytes)}
        category = col["category"].copy()
        live = dict(zip(col["live_addr"].tolist(), col["live_index"].tolist()))
        for addr, role in (roles_by_addr or {}).items():
            idx = live.get(addr, -1)
            if idx >= 0:
                category[idx] = self.category_id(role)
        handles = dict(zip(col["handle"].tolist(), col["handle_index"].tolist()))
        for sid, role in (roles_by_storage or {}).items():
            entry = self._watched.get(sid)
            idx = handles.get(entry[0], -1) if entry is not None else -1
            if idx >= 0:
                category[idx] = self.category_id(role)
        b = SnapshotBuilder(source="allocator", device="cpu")
        for name in self._categories:  # the same ids as the recording's
            b.category_id(name)
        b.device_id("cpu")
        stack_ids = np.array([b.stack_id(frames) for frames in self._rec.stacks()] + [-1], dtype=np.int64)
        n = category.shape[0]
        b.cols = {"start": col["start"], "end": col["end"], "size": col["size"], "category": category,
                  "stack": stack_ids[col["stack"]],  # -1 (no stack) picks the appended -1
                  "addr": col["addr"], "flags": np.zeros(n, dtype=np.int64), "device": np.zeros(n, dtype=np.int64)}
        b.time_us = col["time_us"]
        b.has_time = bool(col["time_us"].shape[0])
        b.dropped = int(raw["dropped"])
        b.markers = [(int(ev), label, kind) for ev, (label, kind) in zip(col["markers"].tolist(), self._marks)
                     if ev >= 0]
        return b
