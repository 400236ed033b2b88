"""The every-device allocation recorder: torch's CPU allocator wrapped, or a ``TorchDispatchMode``
plus storage weak references.

On CPU, where the compiled recorder can be built (:mod:`tbmem._internal.snapshot.native`), the allocations are
recorded by a wrapper around torch's CPU allocator (:mod:`tbmem._internal.snapshot.cpu_recorder`): every block the
recording thread allocates, at no cost per operator. Otherwise (another device, ``backend="dispatch"``,
no C++ compiler) every torch operator call passes through a dispatch mode
(:class:`~tbmem._internal.snapshot.dispatch_mode.RecordingMode`);
each output tensor whose storage the recorder has not seen is an allocation
(size, category, Python stack, time), and a weak reference on that storage
records the free when PyTorch releases it. Storages keep their Python object
alive as long as the C++ storage lives, so the free is seen when the memory
is really released (also for tensors saved for backward).

What it sees: tensors created by torch operators (forward, backward, optimizer
steps, data created with ``torch.*`` factories) on any device. What it misses:
memory that never becomes an operator's output (allocator caches, workspace
buffers inside kernels, tensors created by C++ code without dispatch such as
DataLoader collation in worker processes, NumPy arrays), and tensors created
before recording started unless they are watched parameters, gradients or
optimizer states. See docs/snapshots.md.

Threads: a dispatch mode lives in the thread-local state of the thread that
entered it (and the autograd threads that inherit it), an allocator recording in
that thread's list, so a recording is confined to the thread that called
:meth:`DispatchRecorder.start`. Only that thread can remove it:
:meth:`DispatchRecorder.stop` called from another thread switches it off at once
and parks it; :func:`release_detached` (called by the snapshot manager at each step
and by ``MemoryWriter.close``) removes it on its own thread, and it goes with the
thread when that thread ends (:mod:`tbmem._internal.snapshot.recording_threads`).

Example:
    >>> import torch
    >>> from tbmem._internal.snapshot.recorder import DispatchRecorder
    >>> rec = DispatchRecorder(max_entries=1000)
    >>> rec.start()
    >>> y = torch.ones(256) * 2
    >>> rec.stop()
    >>> snap = rec.snapshot(kind="snapshot", step=0)
    >>> int(snap.allocs["size"].max())
    1024
"""

from __future__ import annotations

import sys
import threading
import time
import weakref
from types import FrameType
from typing import Any, Callable, Iterable

import numpy as np
import torch

from tbmem._internal import _torch_private as tp
from tbmem._internal._log import report_once
from tbmem._internal.snapshot import dispatch_mode, markers, native
from tbmem._internal.snapshot.cpu_recorder import AllocatorRecording
from tbmem._internal.snapshot.dispatch_mode import RecordingMode
from tbmem._internal.snapshot.frames import local_roots
from tbmem._internal.snapshot.recording_threads import exit_at_thread_end, park, release_detached
from tbmem._internal.snapshot.schema import Frame, Snapshot, SnapshotBuilder

__all__ = ["BACKENDS", "DispatchRecorder", "release_detached"]

#: ``auto``: the CPU allocator wrapper where every watched tensor is on the CPU and it can be built,
#: else the dispatch mode; ``allocator``: the wrapper (the dispatch mode where it cannot be built);
#: ``dispatch``: the dispatch mode.
BACKENDS = ("auto", "allocator", "dispatch")

# dispatch machinery between the user's code and __torch_dispatch__: never "the line that allocated"
_SKIP_FILES = ("_python_dispatch.py", "torch/_ops.py", "torch\\_ops.py", __file__, dispatch_mode.__file__)
_graph_task_id: Callable[[], int] = tp.graph_task_id_getter()
_Tensor = torch.Tensor
_now_ns = time.perf_counter_ns
_grad_enabled = torch.is_grad_enabled


_ref = weakref.ref  # a plain weak reference: creating a subclass's instance costs six times as much


class DispatchRecorder:
    """Records tensor allocations and frees on every device.

    Args:
        max_entries: Events kept in memory; beyond it the oldest half is dropped
            (allocations still alive then become "allocated before the trace").
        stacks: ``"python"``/``"all"`` record Python stacks, ``"none"`` skips them.
        stack_depth: Frames kept per allocation.
        models: Callable returning the watched models (names parameters, gradients).
        optimizers: Callable returning the watched optimizers (names their states).
        backend: One of :data:`BACKENDS`; :attr:`backend_used` says which one the last
            :meth:`start` took.

    Cost with the allocator backend: about 1 us per CPU allocation (an interned stack, the event);
    operators that allocate nothing cost nothing. With the dispatch backend, every operator of the
    recorded thread passes through Python. What is recorded per
    allocation is one interned stack (looked up by the chain of code objects and instruction
    offsets, so a line seen before costs no line-number lookups and no frame tuples), the size,
    category, address, device and time appended to the builder's columns, and one weak
    reference whose callback records the free (docs/benchmarks.md, "Dispatch recorder").
    """

    def __init__(self, *, max_entries: int = 100_000, stacks: str = "python", stack_depth: int = 16,
                 models: Callable[[], Iterable[torch.nn.Module]] = tuple,
                 optimizers: Callable[[], Iterable[torch.optim.Optimizer]] = tuple,
                 backend: str = "auto") -> None:
        if backend not in BACKENDS:
            raise ValueError(f"DispatchRecorder.backend must be one of {BACKENDS}, got {backend!r}")
        self.backend = backend
        self.backend_used: str | None = None
        self._alloc: AllocatorRecording | None = None
        self._alloc_on = False
        self.max_entries = max_entries
        self.stacks = stacks != "none"
        self.stack_depth = stack_depth
        self._models = models
        self._optimizers = optimizers
        self._mode: RecordingMode | None = None
        self._on_free = self._freed  # one bound method for every weak reference's callback
        self._codes: dict[int, Any] = {}  # id(code) -> code, for every code object seen in a stack
        self._skipped: set[int] = set()  # ids of code objects in dispatch machinery (_SKIP_FILES)
        self.failed: BaseException | None = None
        self.owner: int | None = None  # thread id whose operators are recorded
        self.reset()

    # --- lifecycle ----------------------------------------------------------------------
    @property
    def active(self) -> bool:
        """Whether it is recording (the dispatch mode entered, or the allocator recording on)."""
        return self._mode is not None or self._alloc_on

    def start(self) -> None:
        """Start a fresh recording (until :meth:`stop`)."""
        if self.active:
            return
        self.reset()
        watched = self._watched_storages()
        self._alloc = self._allocator_recording(watched)
        self.backend_used = "dispatch" if self._alloc is None else "allocator"
        self._register_watched(category_from_role=True, watched=watched)
        if self._alloc is not None:
            self.owner = threading.get_ident()
            exit_at_thread_end()
            self._alloc.start()
            self._alloc_on = True
            markers.register(self)
            return
        self._mode = RecordingMode(self)
        self.owner = threading.get_ident()
        exit_at_thread_end()
        self._mode.__enter__()
        markers.register(self)

    def stop(self) -> None:
        """Stop recording; frees of recorded storages are still seen until :meth:`reset`.

        On the thread that started it the dispatch mode is removed at once; from another
        thread it passes operators through and is removed by :func:`release_detached`
        on its own thread.
        """
        if self._alloc_on:
            self._alloc_on = False
            markers.unregister(self)
            assert self._alloc is not None
            if not self._alloc.stop():
                park(self.owner, self._alloc)
            return
        mode, self._mode = self._mode, None
        markers.unregister(self)
        if mode is None:
            return
        mode.live = False
        if self.owner == threading.get_ident() and tp.current_dispatch_mode() is mode:
            mode.__exit__(None, None, None)
        else:  # another thread's mode, or one entered below a mode of the user's
            park(self.owner, mode)

    @property
    def on_own_thread(self) -> bool:
        """Whether the calling thread is the one being recorded (True when not recording)."""
        return not self.active or self.owner == threading.get_ident()

    def mark(self, label: str, *, kind: str = "step") -> None:
        """A step or phase boundary before the next recorded event."""
        if self._alloc is not None:
            self._alloc.mark(label, kind)
        else:
            self._builder.mark(label, kind=kind, time_us=_now_ns() // 1000)

    def _allocator_recording(self, watched: list[tuple[Any, str]]) -> AllocatorRecording | None:
        """A recording through torch's CPU allocator when the backend allows it (``watched``: the
        watched storages, all on the CPU for ``auto``), else None."""
        if self.backend == "dispatch":
            return None
        if self.backend == "auto" and not all(s.device.type == "cpu" for s, _ in watched):
            return None
        mod = native.load()
        reason = native.unavailable_reason() if mod is None else None
        if mod is not None and not mod.installed():
            reason = "another CPU allocator replaced tbmem's after it was installed"
        if reason is not None:
            report_once("snapshot:native", f"tbmem: CPU snapshots use the dispatch-mode recorder (slower while "
                        f"recording): {reason}")
            return None
        assert mod is not None  # unavailable_reason() names why when load() gave None
        return AllocatorRecording(mod, max_entries=self.max_entries, stacks=self.stacks,
                                  stack_depth=self.stack_depth, skip_suffixes=_SKIP_FILES)

    def reset(self) -> None:
        """Forget everything recorded so far."""
        self._builder = SnapshotBuilder(source="dispatch", device="cpu")
        # id(storage) -> [event index of its allocation, weak reference]; id(reference) -> id(storage)
        self._live: dict[int, list[Any]] = {}
        self._sids: dict[int, int] = {}
        self._stack_ids: dict[tuple[Any, ...], int] = {}  # (id(code), lasti, ...) -> stack id
        self._category_ids: dict[str, int] = {}
        self._device_ids: dict[Any, int] = {}  # torch.device -> device id
        self._alloc = None
        self.failed = None
        self._bind()

    def _bind(self) -> None:
        """Keep the builder's columns at hand (again after :meth:`_compact` replaced them)."""
        b = self._builder
        c = b.cols
        self._time_us = b.time_us
        self._ends = c["end"]
        self._sizes = c["size"]
        self._appends = tuple(c[name].append for name in
                              ("start", "end", "size", "category", "stack", "addr", "flags", "device"))

    def _fail(self, exc: BaseException) -> None:
        # leaving the mode from inside dispatch is unsafe: go quiet; the manager reports and stops
        self.failed = exc

    # --- recording ----------------------------------------------------------------------
    def _record(self, t: torch.Tensor, args: tuple) -> None:
        if self.failed is not None:
            return
        s = t.untyped_storage()
        sid = id(s)
        if sid in self._live:
            return
        size = s.nbytes()
        if size == 0:
            return
        b = self._builder
        for a in args:
            if isinstance(a, _Tensor) and a.untyped_storage() is s:
                # a view of / in-place write to a storage created before recording
                idx = b.alloc(size, category="before_recording", addr=s.data_ptr(), preexisting=True,
                              device=str(s.device))
                break
        else:
            if _graph_task_id() != -1:
                category = "backward"
            elif _grad_enabled():
                category = "activation"
            else:
                category = "no_grad"
            cid = self._category_ids.get(category)
            if cid is None:
                cid = self._category_ids[category] = b.category_id(category)
            device = s.device
            did = self._device_ids.get(device)
            if did is None:
                did = self._device_ids[device] = b.device_id(str(device))
            stack_id = self._stack_id() if self.stacks else -1
            time_us = self._time_us
            time_us.append(_now_ns() // 1000)
            b.has_time = True
            start, end, size_, category_, stack, addr, flags, device_ = self._appends
            start(len(time_us) - 1)
            end(-1)
            size_(size)
            category_(cid)
            stack(stack_id)
            addr(s.data_ptr())
            flags(0)
            device_(did)
            idx = len(self._sizes) - 1
        ref = _ref(s, self._on_free)  # _watch, inline: this runs for every allocation
        self._live[sid] = [idx, ref]
        self._sids[id(ref)] = sid
        if len(self._time_us) > self.max_entries:
            self._compact()

    def _watch(self, s: Any, sid: int, idx: int) -> None:
        """Keep a weak reference on storage ``s`` whose callback records the free of ``idx``."""
        ref = _ref(s, self._on_free)
        self._live[sid] = [idx, ref]
        self._sids[id(ref)] = sid

    def _stack_id(self) -> int:
        # 3 frames up: past _stack_id, _record and __torch_dispatch__, the frame that called the operator
        f: FrameType | None = sys._getframe(3)
        known = self._codes
        skipped = self._skipped
        key: list[int] = []
        append = key.append
        left = self.stack_depth
        while f is not None:
            code = f.f_code
            cid = id(code)
            if cid not in known:
                self._learn(code)
            if cid not in skipped:
                append(cid)
                append(f.f_lasti)
                left -= 1
                if not left:
                    break
            f = f.f_back
        chain = tuple(key)
        stack_id = self._stack_ids.get(chain)
        if stack_id is None:  # a new chain: the same walk once more, reading line numbers
            frames: list[Frame] = []
            f = sys._getframe(3)
            while f is not None and len(frames) < self.stack_depth:
                if id(f.f_code) not in skipped:
                    frames.append((f.f_code.co_filename, f.f_lineno, f.f_code.co_name))
                f = f.f_back
            stack_id = self._stack_ids[chain] = self._builder.stack_id(frames)
        return stack_id

    def _learn(self, code: Any) -> None:
        # the code object is kept, so that its id names it for as long as this recorder lives
        self._codes[id(code)] = code
        if code.co_filename.endswith(_SKIP_FILES):
            self._skipped.add(id(code))

    def _freed(self, ref: weakref.ref) -> None:
        # a reference of a recording before reset() died with that recording's dicts: its
        # callback never runs, so every reference seen here is one of this recording's
        sid = self._sids.pop(id(ref), None)
        entry = self._live.get(sid) if sid is not None else None
        if sid is None or entry is None or entry[1] is not ref:
            return
        del self._live[sid]
        time_us = self._time_us
        time_us.append(_now_ns() // 1000)
        self._ends[entry[0]] = len(time_us) - 1
        if len(time_us) > self.max_entries:
            self._compact()

    def _compact(self) -> None:
        """Drop the oldest half of the events (a ring buffer, amortised O(1) per event)."""
        b = self._builder
        cut = len(b.time_us) - self.max_entries // 2
        start = np.asarray(b.cols["start"], dtype=np.int64)
        end = np.asarray(b.cols["end"], dtype=np.int64)
        keep = (end < 0) | (end >= cut)
        new_index = np.cumsum(keep) - 1
        for c in b.cols:
            b.cols[c] = np.asarray(b.cols[c], dtype=np.int64)[keep].tolist()
        b.cols["start"] = np.where(start[keep] >= cut, start[keep] - cut, -1).tolist()
        b.cols["end"] = np.where(end[keep] >= 0, end[keep] - cut, -1).tolist()
        b.time_us = b.time_us[cut:]
        b.markers = [(ev - cut, label, kind) for ev, label, kind in b.markers if ev >= cut]
        b.dropped += cut
        for entry in self._live.values():
            entry[0] = int(new_index[entry[0]])
        self._bind()

    def _register_watched(self, *, category_from_role: bool,
                          watched: list[tuple[Any, str]] | None = None) -> dict[int, str]:
        """Storages of watched parameters, gradients and optimizer states (``watched``, else listed
        now), by id -> role."""
        roles: dict[int, str] = {}
        for s, role in self._watched_storages() if watched is None else watched:
            roles[id(s)] = role
            if not category_from_role or s.nbytes() == 0:
                continue
            if self._alloc is not None:
                self._alloc.watch(s, role)
            elif id(s) not in self._live:
                idx = self._builder.alloc(s.nbytes(), category=role, addr=s.data_ptr(), preexisting=True,
                                          device=str(s.device))
                self._watch(s, id(s), idx)
        return roles

    def _watched_storages(self) -> list[tuple[Any, str]]:
        """(untyped storage, role) of every watched parameter, gradient, buffer and optimizer state."""
        tensors: list[tuple[torch.Tensor, str]] = []
        for model in self._models():
            tensors += [(p, "parameter") for p in model.parameters()]
            tensors += [(p.grad, "gradient") for p in model.parameters() if p.grad is not None]
            tensors += [(buf, "parameter") for buf in model.buffers()]
        for opt in self._optimizers():
            for state in opt.state.values():
                tensors += [(v, "optimizer_state") for v in state.values() if isinstance(v, torch.Tensor)]
        return [(t.untyped_storage(), role) for t, role in tensors]

    # --- output -------------------------------------------------------------------------
    def snapshot(self, *, kind: str, step: int, rank: int = 0) -> Snapshot:
        """The recording so far as a :class:`Snapshot`; live storages of watched objects are
        named ``parameter``, ``gradient`` or ``optimizer_state``."""
        if self._alloc is not None:
            watched = self._watched_storages()
            b = self._alloc.builder(roles_by_addr={s.data_ptr(): role for s, role in watched},
                                    roles_by_storage={id(s): role for s, role in watched})
        else:
            b = self._builder
            roles = self._register_watched(category_from_role=False)
            cats = b.cols["category"]
            for sid, role in roles.items():
                entry = self._live.get(sid)
                if entry is not None:
                    cats[entry[0]] = b.category_id(role)
        snap = b.build(kind=kind, step=step, rank=rank)
        packages, stdlibs = local_roots()  # where this process's libraries are, for the user frame
        recorder = "CPU allocator" if self._alloc is not None else "TorchDispatchMode"
        snap.meta.update({"torch": torch.__version__, "recorder": recorder,
                          "library_roots": list(packages), "stdlib_roots": list(stdlibs)})
        return snap
