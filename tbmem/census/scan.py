"""Finding live tensors and arrays: the gc scan, the autograd-graph walk, the frame walk.

Nothing here categorises; it only finds objects and turns a tensor into the
storages it occupies. Two rules keep the scan cheap and safe on any heap:

* Only ``type(obj)`` is looked at for objects the scan did not ask for: no
  ``isinstance`` (it reads ``__class__``, which runs user code, raises on dead
  weakref proxies and emits deprecation warnings for lazy modules).
* The heap is traversed once, in C: ``gc.get_referrers(*tensor_types)`` returns
  every gc-tracked object that points at one of those types, which includes
  every instance of them (instances of Python classes reference their class).
  A sentinel tensor checks that this still holds; otherwise, and when there
  are many types to look for, ``gc.get_objects()`` is filtered by type instead.

Example:
    >>> import torch
    >>> from tbmem.census import scan
    >>> keep = torch.zeros(256)
    >>> any(t is keep for t in scan.find_instances().objects)
    True
"""

from __future__ import annotations

import gc
import itertools
import sys
import weakref
from typing import Any, Iterable, Iterator, NamedTuple

import numpy as np
import torch

from tbmem import _torch_private as tp

__all__ = [
    "Storage", "Found", "NoStorageError", "tensor_types", "array_types", "holder_types", "find_instances",
    "tensor_storages", "array_storage", "walk_autograd", "frame_arrays", "holder_arrays", "all_arrays",
]

# Subclasses whose instances never own memory of their own outside tracing/tests:
# fake tensors live on the meta device, functional tensors wrap a tensor found anyway.
_SKIPPED_MODULE_PREFIXES = ("torch._subclasses.", "torch.testing.")
# Above this many types, one C-level pass per type costs more than filtering gc.get_objects().
_MAX_REFERRER_TYPES = 12
_NO_DESCEND = (type, type(sys), type(len), type(lambda: 0))


class Storage(NamedTuple):
    """One memory block a tensor or array occupies."""

    key: tuple[str, int]  # (device, address): equal keys are the same memory
    nbytes: int
    dtype: str
    device: str


class NoStorageError(Exception):
    """The tensor has no storage the census can measure (reported, not counted)."""


def _subclasses(root: type) -> set[type]:
    out, stack = {root}, [root]
    while stack:
        for sub in type.__subclasses__(stack.pop()):
            if sub not in out:
                out.add(sub)
                stack.append(sub)
    return out


def tensor_types() -> set[type]:
    """``torch.Tensor`` and every subclass defined now (nn.Parameter, user subclasses)."""
    return {t for t in _subclasses(torch.Tensor) if not t.__module__.startswith(_SKIPPED_MODULE_PREFIXES)}


def array_types() -> set[type]:
    """``numpy.ndarray`` and its subclasses."""
    return _subclasses(np.ndarray)


def holder_types() -> set[type]:
    """Types of objects known to wrap arrays: PhiML's dense tensors, when PhiML is imported."""
    mod = sys.modules.get("phiml.math._tensors")
    dense = getattr(mod, "Dense", None) if mod is not None else None
    return set(_subclasses(dense)) if isinstance(dense, type) else set()


# type -> its refcount at a census that found no instance of it. Every instance of a Python
# class holds a reference to it, so an unchanged refcount means "still no instances" and
# the type need not be a target of the heap pass (each target adds to its cost).
_EMPTY_AT: "weakref.WeakKeyDictionary[type, int]" = weakref.WeakKeyDictionary()
_ALWAYS = frozenset({torch.Tensor, torch.nn.Parameter})


class Found(NamedTuple):
    """What one heap pass found."""

    objects: list[Any]  # instances of tensor or holder types
    tensor_types: set[type]
    holder_types: set[type]
    method: str  # "referrers" or "objects"


def find_instances(holders: bool = True) -> Found:
    """Every gc-tracked tensor (and, with ``holders``, array holder) instance.

    Rarely used subclasses (DTensor, NestedTensor, ...) are searched for only when
    their refcount grew since a census that found none of them. The type sets are
    built here, so the references this function holds to each type are the same on
    every call and the refcount comparison is meaningful.
    """
    ttypes = tensor_types()
    htypes = holder_types() if holders else set()
    types = ttypes | htypes
    counts = {t: sys.getrefcount(t) for t in types}
    sentinel = torch.empty(0)
    targets = {t for t in types if t in _ALWAYS or counts[t] > _EMPTY_AT.get(t, -1)}
    found: list[Any] | None = None
    method = "referrers"
    if len(targets) <= _MAX_REFERRER_TYPES:
        found = [o for o in gc.get_referrers(*targets) if type(o) in targets]
        if not any(o is sentinel for o in found):
            found = None
    if found is None:
        targets, method = set(types), "objects"
        objs = gc.get_objects()
        found = list(itertools.compress(objs, map(targets.__contains__, map(type, objs))))
        del objs
    present = set(map(type, found))
    for t in targets:
        if t not in present and t not in _ALWAYS:
            before = sys.getrefcount(t)
            _EMPTY_AT[t] = 0  # the first insertion may itself reference t: measure that too
            _EMPTY_AT[t] = counts[t] + sys.getrefcount(t) - before
    return Found([o for o in found if o is not sentinel], ttypes, htypes, method)


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
        refs = gc.get_referents(*level)
        if len(refs) > budget[0]:
            del refs[budget[0]:]
        budget[0] -= len(refs)
        kinds = list(map(type, refs))
        yield from itertools.compress(refs, map(atypes.__contains__, kinds))
        level = list(itertools.compress(refs, map(_tracked_kind, kinds)))


def _tracked_kind(kind: type) -> bool:
    return kind not in _ATOMIC


_ATOMIC = frozenset({str, bytes, int, float, bool, complex, type(None), range, slice})


def frame_arrays(atypes: set[type], *, depth: int = 2, budget: int = 20_000,
                 skip_module: str = "tbmem.census") -> Iterator[tuple[np.ndarray, str]]:
    """Arrays held by the local variables of every thread's running frames.

    Running frames are not gc-tracked: this is how SciPy's L-BFGS-B state (locals
    of ``_minimize_lbfgsb``, in PhiML's worker thread) is found.
    """
    left = [budget]
    for top in list(sys._current_frames().values()):
        frame = top
        while frame is not None:
            if not str(frame.f_globals.get("__name__", "")).startswith(skip_module):
                where = frame.f_code.co_name
                for var, value in list(frame.f_locals.items()):
                    for arr in _arrays_below(value, atypes, depth, left):
                        yield arr, f"numpy {where}:{var}"
            frame = frame.f_back


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
