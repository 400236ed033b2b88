"""The every-device allocation recorder: a ``TorchDispatchMode`` plus storage weak references.

Every torch operator call passes through :meth:`_RecordingMode.__torch_dispatch__`;
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
entered it (and the autograd threads that inherit it), so a recording is confined
to the thread that called :meth:`DispatchRecorder.start`. Only that thread can
remove it: :meth:`DispatchRecorder.stop` called from another thread switches the
mode to pass-through at once and parks it; :func:`release_detached` (called by the
snapshot manager at each step and by ``MemoryWriter.close``) removes it on its
own thread, and it goes with the thread when that thread ends.

Example:
    >>> import torch
    >>> from tbmem.snapshot.recorder import DispatchRecorder
    >>> rec = DispatchRecorder(max_entries=1000)
    >>> rec.start()
    >>> y = torch.ones(256) * 2
    >>> rec.stop()
    >>> snap = rec.snapshot(kind="snapshot", step=0)
    >>> int(snap.allocs["size"].max())
    1024
"""

from __future__ import annotations

import functools
import sys
import threading
import time
import weakref
from typing import Any, Callable, Iterable

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tbmem import _torch_private as tp
from tbmem.snapshot import markers
from tbmem.snapshot.frames import local_roots
from tbmem.snapshot.schema import Frame, Snapshot, SnapshotBuilder

__all__ = ["DispatchRecorder", "release_detached"]

# dispatch machinery between the user's code and __torch_dispatch__: never "the line that allocated"
_SKIP_FILES = ("_python_dispatch.py", "torch/_ops.py", "torch\\_ops.py", __file__)
_graph_task_id: Callable[[], int] = getattr(torch._C, "_current_graph_task_id", lambda: -1)


class _RecordingMode(TorchDispatchMode):
    """Forwards every operator to its owner's ``_record`` after running it."""

    def __init__(self, owner: "DispatchRecorder") -> None:
        super().__init__()
        self._owner = owner
        self.live = True  # False once stopped: the mode passes operators through until removed

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if not self.live:
            return func(*args, **kwargs)
        try:
            out = func(*args, **kwargs)
        except RuntimeError:
            # TorchScript/traced code passes "wrapped number" tensors, which reach a Python
            # dispatch mode as plain floats/ints the op's schema rejects. Rewrap them and retry;
            # when there is nothing to rewrap, the error is the user's own and propagates.
            fixed = _rewrap_numbers(func, args)
            if fixed is None:
                raise
            out = func(*fixed, **kwargs)
        try:
            if isinstance(out, torch.Tensor):
                self._owner._record(out, args)
            elif isinstance(out, (tuple, list)):
                for t in out:
                    if isinstance(t, torch.Tensor):
                        self._owner._record(t, args)
        except Exception as exc:  # noqa: BLE001 - a recorder bug must not break the user's op
            self._owner._fail(exc)
        return out


# thread id -> stopped modes still entered on that thread (only it can remove them)
_detached: dict[int | None, list[_RecordingMode]] = {}
_detached_lock = threading.Lock()


def _park(thread_id: int | None, mode: _RecordingMode) -> None:
    with _detached_lock:
        _detached.setdefault(thread_id, []).append(mode)


def release_detached() -> int:
    """Remove the stopped recording modes still entered on the calling thread; return how many.

    Cheap when there are none (one dict check): the snapshot manager calls it every step.
    """
    if not _detached:
        return 0
    me = threading.get_ident()
    with _detached_lock:
        modes = _detached.pop(me, [])
        alive = {t.ident for t in threading.enumerate()}
        for tid in [t for t in _detached if t not in alive]:
            del _detached[tid]  # a thread that ended took its modes with it
    removed = 0
    while modes:
        top = tp.current_dispatch_mode()
        if not any(top is m for m in modes):
            break  # a mode of the user's is above ours: wait until it is gone
        top.__exit__(None, None, None)
        modes = [m for m in modes if m is not top]
        removed += 1
    if modes:
        with _detached_lock:
            _detached.setdefault(me, []).extend(modes)
    return removed


def _rewrap_numbers(func: Any, args: tuple) -> tuple | None:
    """``args`` with Python numbers turned into tensors where the schema wants a Tensor, or None."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return None
    fixed, changed = list(args), False
    for i, (arg, spec) in enumerate(zip(args, schema.arguments)):
        if isinstance(arg, (bool, int, float)) and isinstance(spec.type, torch._C.TensorType):
            fixed[i] = torch.scalar_tensor(arg, dtype=torch.result_type(arg, arg))
            changed = True
    return tuple(fixed) if changed else None


class DispatchRecorder:
    """Records tensor allocations and frees on every device.

    Args:
        max_entries: Events kept in memory; beyond it the oldest half is dropped
            (allocations still alive then become "allocated before the trace").
        stacks: ``"python"``/``"all"`` record Python stacks, ``"none"`` skips them.
        stack_depth: Frames kept per allocation.
        models: Callable returning the watched models (names parameters, gradients).
        optimizers: Callable returning the watched optimizers (names their states).
    """

    def __init__(self, *, max_entries: int = 100_000, stacks: str = "python", stack_depth: int = 16,
                 models: Callable[[], Iterable[torch.nn.Module]] = tuple,
                 optimizers: Callable[[], Iterable[torch.optim.Optimizer]] = tuple) -> None:
        self.max_entries = max_entries
        self.stacks = stacks != "none"
        self.stack_depth = stack_depth
        self._models = models
        self._optimizers = optimizers
        self._mode: _RecordingMode | None = None
        self._builder = SnapshotBuilder(source="dispatch", device="cpu")
        self._live: dict[int, list[Any]] = {}  # id(storage) -> [alloc index, weakref]
        self._devices: set[str] = set()
        self.failed: BaseException | None = None
        self.owner: int | None = None  # thread id whose operators are recorded

    # --- lifecycle ----------------------------------------------------------------------
    @property
    def active(self) -> bool:
        """Whether the dispatch mode is entered."""
        return self._mode is not None

    def start(self) -> None:
        """Start a fresh recording (enters the dispatch mode until :meth:`stop`)."""
        if self._mode is not None:
            return
        self.reset()
        self._register_watched(category_from_role=True)
        self._mode = _RecordingMode(self)
        self.owner = threading.get_ident()
        self._mode.__enter__()
        markers.register(self)

    def stop(self) -> None:
        """Stop recording; frees of recorded storages are still seen until :meth:`reset`.

        On the thread that started it the dispatch mode is removed at once; from another
        thread it passes operators through and is removed by :func:`release_detached`
        on its own thread.
        """
        mode, self._mode = self._mode, None
        markers.unregister(self)
        if mode is None:
            return
        mode.live = False
        if self.owner == threading.get_ident() and tp.current_dispatch_mode() is mode:
            mode.__exit__(None, None, None)
        else:  # another thread's mode, or one entered below a mode of the user's
            _park(self.owner, mode)

    @property
    def on_own_thread(self) -> bool:
        """Whether the calling thread is the one being recorded (True when not recording)."""
        return self._mode is None or self.owner == threading.get_ident()

    def mark(self, label: str, *, kind: str = "step") -> None:
        """A step or phase boundary before the next recorded event."""
        self._builder.mark(label, kind=kind, time_us=time.perf_counter_ns() // 1000)

    def reset(self) -> None:
        """Forget everything recorded so far."""
        self._builder = SnapshotBuilder(source="dispatch", device="cpu")
        self._live = {}
        self._devices = set()
        self.failed = None

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
        if any(isinstance(a, torch.Tensor) and a.untyped_storage() is s for a in args):
            # a view of / in-place write to a storage created before recording
            idx = b.alloc(size, category="before_recording", addr=s.data_ptr(), preexisting=True,
                          device=str(s.device))
        else:
            if _graph_task_id() != -1:
                category = "backward"
            elif torch.is_grad_enabled():
                category = "activation"
            else:
                category = "no_grad"
            stack_id = self._stack_id(b) if self.stacks else -1
            idx = b.alloc(size, category=category, time_us=time.perf_counter_ns() // 1000,
                          addr=s.data_ptr(), stack_id=stack_id, device=str(s.device))
        self._devices.add(str(s.device))
        self._live[sid] = [idx, weakref.ref(s, functools.partial(self._freed, b, sid))]
        if len(b.time_us) > self.max_entries:
            self._compact()

    def _stack_id(self, b: SnapshotBuilder) -> int:
        frames: list[Frame] = []
        f = sys._getframe(3)
        while f is not None and len(frames) < self.stack_depth:
            filename = f.f_code.co_filename
            if not filename.endswith(_SKIP_FILES):
                frames.append((filename, f.f_lineno, f.f_code.co_name))
            f = f.f_back
        return b.stack_id(frames)

    def _freed(self, builder: SnapshotBuilder, sid: int, _ref: Any) -> None:
        if builder is not self._builder:
            return
        entry = self._live.pop(sid, None)
        if entry is not None:
            builder.free(entry[0], time_us=time.perf_counter_ns() // 1000)
            if len(builder.time_us) > self.max_entries:
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

    def _register_watched(self, *, category_from_role: bool) -> dict[int, str]:
        """Storages of watched parameters, gradients and optimizer states, by id -> role."""
        roles: dict[int, str] = {}
        tensors: list[tuple[torch.Tensor, str]] = []
        for model in self._models():
            tensors += [(p, "parameter") for p in model.parameters()]
            tensors += [(p.grad, "gradient") for p in model.parameters() if p.grad is not None]
            tensors += [(buf, "parameter") for buf in model.buffers()]
        for opt in self._optimizers():
            for state in opt.state.values():
                tensors += [(v, "optimizer_state") for v in state.values() if isinstance(v, torch.Tensor)]
        for t, role in tensors:
            s = t.untyped_storage()
            roles[id(s)] = role
            if category_from_role and id(s) not in self._live and s.nbytes() > 0:
                b = self._builder
                idx = b.alloc(s.nbytes(), category=role, addr=s.data_ptr(), preexisting=True, device=str(s.device))
                self._devices.add(str(s.device))
                self._live[id(s)] = [idx, weakref.ref(s, functools.partial(self._freed, b, id(s)))]
        return roles

    # --- output -------------------------------------------------------------------------
    def snapshot(self, *, kind: str, step: int, rank: int = 0) -> Snapshot:
        """The recording so far as a :class:`Snapshot`; live storages of watched objects are
        named ``parameter``, ``gradient`` or ``optimizer_state``."""
        b = self._builder
        roles = self._register_watched(category_from_role=False)
        cats = b.cols["category"]
        for sid, role in roles.items():
            entry = self._live.get(sid)
            if entry is not None:
                cats[entry[0]] = b.category_id(role)
        snap = b.build(kind=kind, step=step, rank=rank)
        packages, stdlibs = local_roots()  # where this process's libraries are, for the user frame
        snap.meta.update({"torch": torch.__version__, "recorder": "TorchDispatchMode",
                          "library_roots": list(packages), "stdlib_roots": list(stdlibs)})
        return snap
