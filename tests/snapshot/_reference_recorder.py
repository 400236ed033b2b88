"""The dispatch recorder as it was before it was made fast (issue 18), kept as the reference the fast
one must agree with: the same allocations (sizes, categories, stacks, start and end events) and
markers. Straightforward code on purpose: a generator over the arguments, a fresh frame walk and
frame tuples per allocation, a ``functools.partial`` per weak reference, ``TorchDispatchMode``'s
own Dynamo wrapper.
"""

from __future__ import annotations

import functools
import sys
import time
import weakref
from typing import Any, Callable, Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tbmem._internal.snapshot.schema import Frame, Snapshot, SnapshotBuilder

_SKIP_FILES = ("_python_dispatch.py", "torch/_ops.py", "torch\\_ops.py", __file__)
_graph_task_id: Callable[[], int] = getattr(torch._C, "_current_graph_task_id", lambda: -1)
# frames of TorchDispatchMode's Dynamo wrapper around __torch_dispatch__ (the old recorder kept them)
WRAPPER_FRAMES = {("eval_frame.py", "_fn"), ("_compile.py", "inner")}


class _Mode(TorchDispatchMode):
    def __init__(self, owner: "ReferenceRecorder") -> None:
        super().__init__()
        self._owner = owner

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor):
            self._owner._record(out, args)
        elif isinstance(out, (tuple, list)):
            for t in out:
                if isinstance(t, torch.Tensor):
                    self._owner._record(t, args)
        return out


class ReferenceRecorder:
    """Records allocations and frees of the thread that starts it, the old way."""

    def __init__(self, *, stack_depth: int = 16, models: Callable[[], Iterable[torch.nn.Module]] = tuple,
                 optimizers: Callable[[], Iterable[torch.optim.Optimizer]] = tuple) -> None:
        self.stack_depth = stack_depth
        self._models = models
        self._optimizers = optimizers
        self._builder = SnapshotBuilder(source="dispatch", device="cpu")
        self._live: dict[int, list[Any]] = {}
        self._mode: _Mode | None = None

    def start(self) -> None:
        self._register_watched(category_from_role=True)
        self._mode = _Mode(self)
        self._mode.__enter__()

    def stop(self) -> None:
        assert self._mode is not None
        self._mode.__exit__(None, None, None)
        self._mode = None

    def mark(self, label: str, *, kind: str = "step") -> None:
        self._builder.mark(label, kind=kind, time_us=time.perf_counter_ns() // 1000)

    def _record(self, t: torch.Tensor, args: tuple) -> None:
        s = t.untyped_storage()
        sid = id(s)
        if sid in self._live:
            return
        size = s.nbytes()
        if size == 0:
            return
        b = self._builder
        if any(isinstance(a, torch.Tensor) and a.untyped_storage() is s for a in args):
            idx = b.alloc(size, category="before_recording", addr=s.data_ptr(), preexisting=True,
                          device=str(s.device))
        else:
            if _graph_task_id() != -1:
                category = "backward"
            elif torch.is_grad_enabled():
                category = "activation"
            else:
                category = "no_grad"
            idx = b.alloc(size, category=category, time_us=time.perf_counter_ns() // 1000,
                          addr=s.data_ptr(), stack_id=self._stack_id(b), device=str(s.device))
        self._live[sid] = [idx, weakref.ref(s, functools.partial(self._freed, b, sid))]

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
        entry = self._live.pop(sid, None)
        if entry is not None:
            builder.free(entry[0], time_us=time.perf_counter_ns() // 1000)

    def _register_watched(self, *, category_from_role: bool) -> dict[int, str]:
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
                self._live[id(s)] = [idx, weakref.ref(s, functools.partial(self._freed, b, id(s)))]
        return roles

    def snapshot(self, *, kind: str, step: int) -> Snapshot:
        b = self._builder
        cats = b.cols["category"]
        for sid, role in self._register_watched(category_from_role=False).items():
            entry = self._live.get(sid)
            if entry is not None:
                cats[entry[0]] = b.category_id(role)
        return b.build(kind=kind, step=step)
