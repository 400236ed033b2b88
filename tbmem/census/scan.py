"""Turning what the heap scan found into storages; the autograd-graph walk; the array walks.

Nothing here categorises. The heap scan itself is :mod:`tbmem.census.heap`. As
there, foreign objects are looked at only through ``type(obj)``.

Example:
    >>> import torch
    >>> from tbmem.census import scan
    >>> base = torch.zeros(64, 64)
    >>> [s.nbytes for s in scan.tensor_storages(base[:2].t())]  # a view occupies its whole base
    [16384]
"""

from __future__ import annotations

import gc
import itertools
import sys
import threading
from inspect import CO_OPTIMIZED
from types import FrameType
from typing import Any, Iterable, Iterator, NamedTuple

import numpy as np
import torch

from tbmem import _torch_private as tp

__all__ = [
    "Storage", "NoStorageError", "tensor_storages", "array_storage", "walk_autograd", "read_locals",
    "frame_arrays", "holder_arrays", "all_arrays",
]

_NO_DESCEND = (type, type(sys), type(len), type(lambda: 0))


class Storage(NamedTuple):
    """One memory block a tensor or array occupies."""

    key: tuple[str, int]  # (device, address): equal keys are the same memory
    nbytes: int
    dtype: str
    device: str


class NoStorageError(Exception):
    """The tensor has no storage the census can measure (reported, not counted)."""


_DTYPE_NAMES: dict[Any, str] = {}


def _dtype_name(dtype: torch.dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).removeprefix("torch.")
    return name


_untyped_storage = torch.Tensor.untyped_storage  # unbound: a subclass override cannot intercept it
_SPARSE_PARTS = {
    torch.sparse_coo: ("_indices", "_values"),
    torch.sparse_csr: ("crow_indices", "col_indices", "values"),
    torch.sparse_bsr: ("crow_indices", "col_indices", "values"),
    torch.sparse_csc: ("ccol_indices", "row_indices", "values"),
    torch.sparse_bsc: ("ccol_indices", "row_indices", "values"),
}


def tensor_storages(t: torch.Tensor) -> list[Storage]:
    """The storages ``t`` occupies; empty for meta/fake tensors and freed storages.

    Sparse tensors occupy their index and value storages; wrapper subclasses
    (``__tensor_flatten__``) the storages of their inner tensors.

    Raises:
        NoStorageError: neither a storage nor inner tensors can be found.
    """
    parts = _SPARSE_PARTS.get(t.layout)
    if parts is not None:
        return [s for part in parts for s in tensor_storages(getattr(t, part)())]
    try:
        storage = _untyped_storage(t)
    except (RuntimeError, NotImplementedError, TypeError) as exc:
        flatten = getattr(type(t), "__tensor_flatten__", None)
        if flatten is None:
            raise NoStorageError(f"{type(t).__name__} ({t.layout}) has no storage: {exc}") from exc
        names, _ = flatten(t)
        return [s for name in names for s in tensor_storages(getattr(t, name))]
    device = storage.device
    if device.type == "meta":
        return []
    nbytes = storage.nbytes()
    if nbytes == 0:  # a freed storage (resize_(0), as FSDP does) holds nothing
        return []
    dev = str(device)
    return [Storage((dev, storage.data_ptr()), nbytes, _dtype_name(t.dtype), dev)]


def array_storage(a: np.ndarray, ttypes: set[type]) -> Storage | torch.Tensor | None:
    """The buffer an array occupies, found through its ``base`` chain.

    Returns the torch tensor instead when the array is a view of one
    (``tensor.numpy()``), so that memory is counted once, as the tensor.
    """
    root = a
    while issubclass(type(root.base), np.ndarray):
        root = root.base
    base = root.base
    if type(base) in ttypes:
        return base
    nbytes = int(root.nbytes)
    if nbytes == 0:
        return None
    address = root.__array_interface__["data"][0]
    return Storage(("cpu", address), nbytes, root.dtype.name, "cpu")


# --- autograd graph -----------------------------------------------------------------------
def walk_autograd(nodes: Iterable[Any], visited: set[int], keep: list[Any]) -> Iterator[tuple[torch.Tensor, str]]:
    """Yield ``(tensor, name)`` for every tensor saved for backward in the graphs of ``nodes``.

    Reads ``_raw_saved_*`` (``SavedTensor.data``), which does not run
    saved-tensor unpack hooks (those may copy offloaded tensors back to the
    device). A graph already run backward has released them: ``data`` is None.
    ``visited`` holds ids of nodes seen (shared between calls); ``keep`` keeps
    them alive so ids stay unique while the census runs.
    """
    stack = [n for n in nodes if n is not None]
    while stack:
        node = stack.pop()
        if id(node) in visited:
            continue
        visited.add(id(node))
        keep.append(node)
        kind = type(node).__name__
        for data, attr in tp.saved_tensors_of(node):
            yield data, f"{kind}.{attr}"
        try:
            nexts = node.next_functions
        except (AttributeError, RuntimeError):
            continue
        stack.extend(n for n, _ in nexts if n is not None)


# --- numpy arrays -------------------------------------------------------------------------
def _arrays_below(obj: Any, atypes: set[type], depth: int, budget: list[int]) -> Iterator[np.ndarray]:
    """Arrays reachable from ``obj`` through at most ``depth`` hops of gc referents.

    ``budget[0]`` is the number of referents still allowed to be examined (shared
    between calls): a frame holding a list of a million objects costs a bounded scan.
    """
    if type(obj) in atypes:
        yield obj
        return
    level = [obj]
    for _ in range(depth):
        if budget[0] <= 0 or not level:
            return
        level = [o for o in level if not issubclass(type(o), _NO_DESCEND) and gc.is_tracked(o)]
        refs = _bounded_referents(level, budget[0])
        budget[0] -= len(refs)
        kinds = list(map(type, refs))
        yield from itertools.compress(refs, map(atypes.__contains__, kinds))
        level = list(itertools.compress(refs, map(_tracked_kind, kinds)))


_CONTAINERS = frozenset({list, tuple, dict, set, frozenset})


def _bounded_referents(level: list[Any], limit: int) -> list[Any]:
    """At most ``limit`` referents of ``level``, without listing all items of a huge container first."""
    big = [o for o in level if type(o) in _CONTAINERS and len(o) > limit]
    refs = gc.get_referents(*(o for o in level if not any(o is b for b in big))) if big else gc.get_referents(*level)
    for container in big:
        items = container.values() if type(container) is dict else container
        refs.extend(itertools.islice(items, max(limit - len(refs), 0)))
    if len(refs) > limit:
        del refs[limit:]
    return refs


def _tracked_kind(kind: type) -> bool:
    return kind not in _ATOMIC


_ATOMIC = frozenset({str, bytes, int, float, bool, complex, type(None), range, slice})


# Before Python 3.13, reading ``f_locals`` of a function frame copies its locals into a dict
# kept on the frame; the copy holds them until the frame exits or f_locals is read again, so a
# census would keep the previous step's batch and loss alive. The copy is emptied after reading
# when nothing else can need it: the frame is on this thread's stack (not mid-way through
# another thread's tracer, which writes the copy back into the frame), no Python-level tracer
# or profiler is installed, and no one else holds the dict (``locals()`` returns this very dict).
_LOCALS_ARE_COPIED = sys.version_info < (3, 13)
_UNSHARED_REFS = 3  # the frame's, ours, and getrefcount's argument


def _tracing() -> bool:
    return any(hook() is not None for hook in (sys.gettrace, sys.getprofile, threading.gettrace,
                                               threading.getprofile))


def read_locals(frame: FrameType, *, release: bool) -> list[tuple[str, Any]]:
    """``(name, value)`` of a running frame's local variables.

    Args:
        frame: A frame of the calling thread (``release=True``) or of any thread.
        release: Empty the copy of the locals that reading them left on the frame (a no-op
            where that is unsafe or unnecessary, see above).
    """
    local_dict = frame.f_locals
    items = list(local_dict.items())
    if (release and _LOCALS_ARE_COPIED and type(local_dict) is dict and frame.f_code.co_flags & CO_OPTIMIZED
            and sys.getrefcount(local_dict) <= _UNSHARED_REFS):
        local_dict.clear()
    return items


def frame_arrays(atypes: set[type], *, depth: int = 2, budget: int = 20_000,
                 skip_module: str = "tbmem.census") -> Iterator[tuple[np.ndarray, str]]:
    """Arrays held by the local variables of every thread's running frames.

    Running frames are not gc-tracked: this is how SciPy's L-BFGS-B state (locals
    of ``_minimize_lbfgsb``, in PhiML's worker thread) is found. The calling thread's
    frames are left holding nothing extra (see :func:`read_locals`); on Python < 3.13,
    other threads' frames keep their copy until the next census or until they exit.
    """
    left = [budget]
    release_mine = not _tracing()
    me = threading.get_ident()
    stacks = list(sys._current_frames().items())
    try:
        for thread, frame in stacks:
            while frame is not None:
                if not str(frame.f_globals.get("__name__", "")).startswith(skip_module):
                    where = frame.f_code.co_name
                    for var, value in read_locals(frame, release=release_mine and thread == me):
                        for arr in _arrays_below(value, atypes, depth, left):
                            yield arr, f"numpy {where}:{var}"
                frame = frame.f_back
    finally:
        # This generator's own frame is on the stack it walks: a reference to it from its own
        # locals would be a cycle keeping the last array seen alive until the next collection.
        stacks = frame = value = arr = None  # type: ignore[assignment]


def holder_arrays(holders: Iterable[Any], atypes: set[type]) -> Iterator[tuple[np.ndarray, str]]:
    """Arrays wrapped by known holder objects (PhiML tensors: instance dict -> native array)."""
    left = [1 << 62]
    for holder in holders:
        for arr in _arrays_below(holder, atypes, 2, left):
            yield arr, f"numpy in {type(holder).__name__}"


def all_arrays(atypes: set[type]) -> Iterator[tuple[np.ndarray, str]]:
    """Arrays referenced by any gc-tracked object (complete, and about 5x the cost of the tensor scan)."""
    objs = gc.get_objects()
    refs = gc.get_referents(*objs)
    del objs
    for arr in itertools.compress(refs, map(atypes.__contains__, map(type, refs))):
        yield arr, "numpy.ndarray"
