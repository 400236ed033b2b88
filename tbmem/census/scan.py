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
import operator
import sys
import threading
from inspect import CO_OPTIMIZED
from types import FrameType
from typing import Any, Iterable, Iterator, NamedTuple

import numpy as np
import torch

from tbmem import _torch_private as tp
from tbmem.census.layout import select_types

__all__ = [
    "Storage", "NoStorageError", "device_name", "tensor_attr", "tensor_storages", "storage_key",
    "storage_storages", "array_storage",
    "walk_autograd", "tensors_below", "read_locals", "frame_arrays", "holder_arrays", "all_arrays",
]

_NO_DESCEND = (type, type(sys), type(len), type(lambda: 0))


class Storage(NamedTuple):
    """One memory block a tensor or array occupies."""

    key: tuple[str, int]  # (device, address): equal keys are the same memory
    nbytes: int
    dtype: str
    device: str
    shape: tuple[int, ...] = ()
    foreign: bool = False  # CPU memory torch did not allocate (from_numpy, frombuffer, DLPack, mmap)


class NoStorageError(Exception):
    """The tensor has no storage the census can measure (reported, not counted)."""


_DTYPE_NAMES: dict[Any, str] = {}


def _dtype_name(dtype: torch.dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).removeprefix("torch.")
    return name


_DEVICE_NAMES: dict[Any, str] = {}


def device_name(device: torch.device) -> str:
    """``"cpu"``, ``"cuda:0"``, ... (memoised: ``str(device)`` costs more than the rest of a lookup)."""
    name = _DEVICE_NAMES.get(device)
    if name is None:
        name = _DEVICE_NAMES[device] = str(device)
    return name


def _getter(name: str) -> Any:
    """torch's own accessor of a tensor attribute: a subclass's property of that name cannot intercept it."""
    for klass in torch.Tensor.__mro__:
        if name in vars(klass):
            return vars(klass)[name].__get__
    raise AttributeError(name)


#: ``tensor_attr["grad_fn"](t)`` reads ``t.grad_fn`` as torch stores it, bypassing subclass overrides.
tensor_attr: dict[str, Any] = {n: _getter(n) for n in (
    "grad_fn", "grad", "requires_grad", "is_leaf", "retains_grad", "device", "dtype", "layout", "shape",
    "is_nested")}
_layout, _shape, _is_nested, _dtype = (tensor_attr[n] for n in ("layout", "shape", "is_nested", "dtype"))
_untyped_storage = torch.Tensor.untyped_storage  # unbound: a subclass override cannot intercept it
_SPARSE_PARTS = {
    torch.sparse_coo: ("_indices", "_values"),
    torch.sparse_csr: ("crow_indices", "col_indices", "values"),
    torch.sparse_bsr: ("crow_indices", "col_indices", "values"),
    torch.sparse_csc: ("ccol_indices", "row_indices", "values"),
    torch.sparse_bsc: ("ccol_indices", "row_indices", "values"),
}
# Metadata a strided nested tensor keeps in tensors of its own, besides its buffer.
_NESTED_METADATA = ("_nested_tensor_size", "_nested_tensor_strides", "_nested_tensor_storage_offsets")


def tensor_storages(t: torch.Tensor) -> list[Storage]:
    """The storages ``t`` occupies; empty for meta/fake tensors and freed storages.

    Sparse tensors occupy their index and value storages; strided nested tensors
    their buffer and size/stride/offset tensors; wrapper subclasses (DTensor, jagged
    nested tensors: a storage without a data pointer, and ``__tensor_flatten__``)
    the storages of their inner tensors.

    Raises:
        NoStorageError: neither a storage nor inner tensors can be found.
    """
    parts = _SPARSE_PARTS.get(_layout(t))
    if parts is not None:
        return [s for part in parts for s in tensor_storages(getattr(t, part)())]
    try:
        storage = _untyped_storage(t)
        dev = device_name(storage.device)
        if dev == "meta":
            return []
        nbytes = storage.nbytes()
        address = storage.data_ptr()  # raises for a wrapper subclass's placeholder storage
    except (RuntimeError, NotImplementedError, TypeError) as exc:
        return _inner_storages(t, exc)
    if nbytes == 0:  # a freed storage (resize_(0), as FSDP does) holds nothing
        return []
    foreign = dev == "cpu" and not storage.resizable() and not storage.is_shared()
    dtype = _dtype(t)
    if _is_nested(t):  # strided nested: sizes live in tensors of their own, not in ``shape``
        buffer = Storage((dev, address), nbytes, _dtype_name(dtype), dev, (nbytes // dtype.itemsize,), foreign)
        return [buffer] + [s for meta in _NESTED_METADATA for s in tensor_storages(getattr(t, meta)())]
    return [Storage((dev, address), nbytes, _dtype_name(dtype), dev, tuple(_shape(t)), foreign)]


def _inner_storages(t: torch.Tensor, exc: BaseException) -> list[Storage]:
    flatten = getattr(type(t), "__tensor_flatten__", None)
    if flatten is None:
        raise NoStorageError(f"{type(t).__name__} ({_layout(t)}) has no storage: {exc}") from exc
    names, _ = flatten(t)
    out: list[Storage] = []
    for name in names:
        inner = getattr(t, name)
        if issubclass(type(inner), torch.Tensor):  # skips None and non-tensor parts (a device mesh)
            out += tensor_storages(inner)
    return out


def storage_key(s: Any) -> tuple[str, int, int]:
    """``(device, address, nbytes)`` of a storage object (``UntypedStorage``, ``TypedStorage``)."""
    untyped = s if issubclass(type(s), torch.UntypedStorage) else s._untyped_storage
    return device_name(untyped.device), untyped.data_ptr(), untyped.nbytes()


def storage_storages(s: Any) -> list[Storage]:
    """The memory of a storage object held without a tensor (``UntypedStorage``, ``TypedStorage``)."""
    typed = not issubclass(type(s), torch.UntypedStorage)
    untyped = s._untyped_storage if typed else s
    dev, address, nbytes = storage_key(untyped)
    if dev == "meta" or nbytes == 0:
        return []
    dtype = s.dtype if typed else torch.uint8
    foreign = dev == "cpu" and not untyped.resizable() and not untyped.is_shared()
    return [Storage((dev, address), nbytes, _dtype_name(dtype), dev, (nbytes // dtype.itemsize,), foreign)]


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
    return Storage(("cpu", address), nbytes, root.dtype.name, "cpu", tuple(a.shape))


# --- autograd graph -----------------------------------------------------------------------
def walk_autograd(nodes: Iterable[Any], visited: set[int], keep: list[Any],
                  errors: list[BaseException]) -> Iterator[tuple[Any, str]]:
    """Yield ``(saved, name)`` for everything saved for backward in the graphs of ``nodes``.

    ``saved`` is a tensor, or what a saved-tensor pack hook returned for it (a
    ``(device, tensor)`` tuple of ``save_on_cpu``, checkpoint's placeholder, ...).
    Reads ``_raw_saved_*`` (``SavedTensor.data``), which does not run saved-tensor
    unpack hooks (those may copy offloaded tensors back to the device). A graph
    already run backward has released them. ``visited`` holds ids of nodes seen
    (shared between calls); ``keep`` keeps them alive so ids stay unique while the
    census runs; a node that cannot be read is appended to ``errors`` and skipped.
    """
    stack = [n for n in nodes if n is not None]
    while stack:
        node = stack.pop()
        if id(node) in visited:
            continue
        visited.add(id(node))
        keep.append(node)
        kind = type(node).__name__
        try:
            saved = list(tp.saved_tensors_of(node))
            nexts = [n for n, _ in node.next_functions if n is not None]
        except Exception as exc:  # noqa: BLE001 - one odd node (a custom Function's) must not stop the walk
            errors.append(exc)
            continue
        for data, attr in saved:
            yield data, f"{kind}.{attr}"
        stack.extend(nexts)


def tensors_below(obj: Any, ttypes: set[type], *, depth: int = 3, budget: int = 10_000) -> Iterator[Any]:
    """Tensors reachable from ``obj`` through at most ``depth`` hops of gc referents (what a pack hook made)."""
    yield from _instances_below(obj, ttypes, depth, [budget])


# --- numpy arrays -------------------------------------------------------------------------
def _instances_below(obj: Any, atypes: set[type], depth: int, budget: list[int]) -> Iterator[Any]:
    """Instances of ``atypes`` reachable from ``obj`` through at most ``depth`` hops of gc referents.

    ``budget[0]`` is the number of referents still allowed to be examined (shared
    between calls): a frame holding a list of a million objects costs a bounded scan.
    Containers CPython does not track (a dict or tuple holding only arrays) are
    walked like the others: ``gc.get_referents`` does not care whether they are tracked.
    """
    if type(obj) in atypes:
        yield obj
        return
    level = [obj] if _descends(type(obj)) else []
    for _ in range(depth):
        if budget[0] <= 0 or not level:
            return
        refs = _bounded_referents(level, budget[0])
        budget[0] -= len(refs)
        kinds = list(map(type, refs))
        yield from itertools.compress(refs, map(atypes.__contains__, kinds))
        for kind in set(kinds).difference(_DESCENDS):
            _descends(kind)
        level = list(itertools.compress(refs, map(_DESCENDS.__getitem__, kinds)))


_CONTAINERS = frozenset({list, tuple, dict, set, frozenset})
_HAVE_GC = 1 << 14  # Py_TPFLAGS_HAVE_GC: only instances of such types can refer to other objects
_DESCENDS: dict[type, bool] = {}


def _descends(kind: type) -> bool:
    """Whether the walk looks inside instances of ``kind``: objects that can hold references, but not
    modules, types or functions (which lead everywhere)."""
    verdict = _DESCENDS.get(kind)
    if verdict is None:
        verdict = _DESCENDS[kind] = bool(kind.__flags__ & _HAVE_GC) and not issubclass(kind, _NO_DESCEND)
    return verdict


def _bounded_referents(level: list[Any], limit: int) -> list[Any]:
    """At most ``limit`` referents of ``level``, without listing all items of a huge container first."""
    containers = itertools.compress(level, map(_CONTAINERS.__contains__, map(type, level)))
    big = [o for o in containers if len(o) > limit]
    refs = gc.get_referents(*(o for o in level if not any(o is b for b in big))) if big else gc.get_referents(*level)
    for container in big:
        items = container.values() if type(container) is dict else container
        refs.extend(itertools.islice(items, max(limit - len(refs), 0)))
    if len(refs) > limit:
        del refs[limit:]
    return refs


_UNTRACKABLE = frozenset({dict, tuple})  # containers CPython untracks when all they hold is untracked


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
                        for arr in _instances_below(value, atypes, depth, left):
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
        for arr in _instances_below(holder, atypes, 2, left):
            yield arr, f"numpy in {type(holder).__name__}"


def all_arrays(atypes: set[type]) -> Iterator[tuple[np.ndarray, str]]:
    """Arrays referenced by any gc-tracked object, directly or through untracked dicts and tuples.

    CPython does not track a dict or tuple that holds only untracked objects (arrays are
    untracked), so ``gc.get_objects()`` misses them: their items are reached here through
    the tracked objects that refer to them. Running frames' locals are not gc objects:
    :func:`frame_arrays` finds those.
    """
    objs = gc.get_objects()
    refs = gc.get_referents(*objs)
    del objs
    wanted = set(atypes) | _UNTRACKABLE
    seen: set[int] = set()
    while refs:
        picked = select_types(refs, wanted)
        del refs
        kinds = list(map(type, picked))
        for arr in itertools.compress(picked, map(atypes.__contains__, kinds)):
            yield arr, "numpy.ndarray"
        containers = list(itertools.compress(picked, map(_UNTRACKABLE.__contains__, kinds)))
        del picked, kinds
        untracked = list(itertools.compress(containers, map(operator.not_, map(gc.is_tracked, containers))))
        by_id = dict(zip(map(id, untracked), untracked))
        fresh = by_id.keys() - seen
        seen |= fresh
        refs = gc.get_referents(*map(by_id.__getitem__, fresh))
        del containers, untracked, by_id
