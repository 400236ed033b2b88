"""Finding every live tensor instance: a pass over the whole heap, or over what is new since the last.

Only ``type(obj)`` is looked at for objects the census did not ask for: no
``isinstance`` (it reads ``__class__``, which runs user code, raises on dead
weakref proxies and emits deprecation warnings for lazy modules).

**Full scan.** ``gc.get_referrers(*tensor_types)`` traverses the heap once, in C,
and returns every gc-tracked object that points at one of those types, which
includes every instance of them (instances of Python classes reference their
class). A sentinel tensor checks that this still holds; otherwise, and when there
are many types to look for, ``gc.get_objects()`` is filtered by type instead.
Its cost is linear in the heap: about 25 ms for 320k objects.

**Incremental scan.** CPython's collector puts every new object in generation 0
and moves objects to generation 2 only in a collection of generation 1 or 2. So
when ``gc.get_stats()`` shows no such collection since the last scan (and
``gc.freeze()`` was not called), every instance created since is still in
generation 0 or 1: the instances alive now are the survivors of the last scan
(held by weak references, which keep nothing alive) plus the instances found
in the young generations. The result is the full scan's, at the cost of the
young generations (well under a millisecond).

Between :func:`start_capture` and :func:`stop_capture` (``MemoryWriter`` brackets
its life with them when the census is on), a ``gc.callbacks`` hook also notes the
instances in the young generations at the start of every collection that is about
to move them to generation 2, so promotions no longer force a full scan. It costs
a pass over the young generations (a few thousand objects) per such collection,
which itself traverses them.

Any doubt (a collection this module did not see, a collection during the scan, a
tensor type that did not exist at the last scan, an instance that cannot be weakly
referenced, an interpreter whose collector is not this one) means a full scan.

Example:
    >>> import torch
    >>> from tbmem.census import heap
    >>> keep = torch.zeros(256)
    >>> any(t is keep for t in heap.find_instances().objects)
    True
"""

from __future__ import annotations

import gc
import itertools
import sys
import sysconfig
import threading
import weakref
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

__all__ = [
    "Found", "INCREMENTAL_SUPPORTED", "tensor_types", "array_types", "holder_types", "find_instances",
    "frozen_objects", "start_capture", "stop_capture",
]

# Subclasses whose instances never own memory of their own outside tracing/tests:
# fake tensors live on the meta device, functional tensors wrap a tensor found anyway.
_SKIPPED_MODULE_PREFIXES = ("torch._subclasses.", "torch.testing.")
# Above this many types, one C-level pass per type costs more than filtering gc.get_objects().
_MAX_REFERRER_TYPES = 12
# The generational collector the incremental scan relies on: CPython 3.10-3.13 with the GIL
# (3.14 collects incrementally, and the free-threaded build has no generations to speak of).
INCREMENTAL_SUPPORTED = (sys.implementation.name == "cpython" and sys.version_info[:2] < (3, 14)
                         and not sysconfig.get_config_var("Py_GIL_DISABLED"))


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


def frozen_objects() -> int:
    """Objects moved out of the collector's sight by ``gc.freeze()``: no scan can see them."""
    return gc.get_freeze_count()


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
    method: str  # "referrers" or "objects" (full scans), "young" (incremental)


@dataclass
class _LastScan:
    """What the incremental scan needs from the previous one."""

    promotions: tuple[int, int]  # collections of generations 1 and 2 before it started
    observed: int  # _observed when it started
    frozen: int
    holders: bool
    types: frozenset[type]  # the instances of these were all found
    survivors: list[weakref.ref[Any]]


_last: _LastScan | None = None
_lock = threading.Lock()
# Written by the gc callback: promoting collections seen, and the instances they were about to promote.
_observed = 0
_promoted: list[weakref.ref[Any]] = []
_MAX_PROMOTED = 1_000_000  # beyond this, forget the index (a full scan is cheaper than the list)
_forgotten = 0  # times the callback dropped the index: a scan running meanwhile must not store its own
_capture_users = 0


def _promotions() -> tuple[int, int]:
    stats = gc.get_stats()
    return stats[1]["collections"], stats[2]["collections"]


def _on_collection(phase: str, info: dict[str, Any]) -> None:
    """gc callback: before a collection moves the young generations to generation 2, note their instances."""
    global _observed, _last, _forgotten
    if phase != "start" or info.get("generation", 0) == 0:
        return
    _observed += 1
    last = _last
    if last is None:
        return
    try:
        young = gc.get_objects(generation=0)
        young += gc.get_objects(generation=1)
        _promoted.extend(map(weakref.ref, itertools.compress(young, map(last.types.__contains__, map(type, young)))))
        if len(_promoted) > _MAX_PROMOTED:
            raise OverflowError("too many promoted instances")
    except Exception:  # noqa: BLE001 - a gc callback must never raise; the next census scans fully
        _last = None
        _forgotten += 1
        _promoted.clear()


def start_capture() -> None:
    """Note promoted instances from now on, so that later incremental scans stay possible (counted)."""
    global _capture_users
    with _lock:
        _capture_users += 1
        if _capture_users == 1 and INCREMENTAL_SUPPORTED:
            gc.callbacks.append(_on_collection)


def stop_capture() -> None:
    """Undo one :func:`start_capture`; the last one removes the gc callback."""
    global _capture_users
    with _lock:
        if _capture_users == 0:
            return
        _capture_users -= 1
        if _capture_users == 0:
            while _on_collection in gc.callbacks:
                gc.callbacks.remove(_on_collection)
            _promoted.clear()


def find_instances(holders: bool = True, *, incremental: bool = True) -> Found:
    """Every gc-tracked tensor (and, with ``holders``, array holder) instance.

    Args:
        holders: Also find PhiML tensors (which hold numpy arrays).
        incremental: Scan only the young generations when that is known to find
            everything (see the module docstring); False forces a full scan.

    Rarely used subclasses (DTensor, NestedTensor, ...) are targets of the full scan
    only when their refcount grew since a census that found none of them. The type
    sets are built here, so the references this function holds to each type are the
    same on every call and the refcount comparison is meaningful.
    """
    global _last, _promoted
    with _lock:
        ttypes = tensor_types()
        htypes = holder_types() if holders else set()
        types = ttypes | htypes
        promotions, observed, frozen, forgotten = _promotions(), _observed, frozen_objects(), _forgotten
        promoted = _promoted
        _promoted = []
        found = None
        if incremental and _can_skip_old(_last, promotions, observed, frozen, holders, types):
            assert _last is not None
            found = _young(types, _last.survivors + promoted)
            if _promotions() != promotions:  # a collection ran meanwhile (another thread's gc.collect())
                found = None
        if found is None:
            found = _full(ttypes, htypes)
        del promoted
        fresh = _remember(found, promotions, observed, frozen, holders, frozenset(types))
        _last = fresh if _forgotten == forgotten else None
        return found._replace(tensor_types=ttypes, holder_types=htypes)


def _can_skip_old(last: _LastScan | None, promotions: tuple[int, int], observed: int, frozen: int,
                  holders: bool, types: set[type]) -> bool:
    if not INCREMENTAL_SUPPORTED or last is None or last.frozen != frozen or (holders and not last.holders):
        return False
    moved = sum(promotions) - sum(last.promotions)
    if moved == 0:
        return True
    # Every promoting collection since must have been seen by the callback, which looked for
    # the types of the last scan: a type defined since could have had instances promoted.
    return moved == observed - last.observed and types <= last.types


def _young(types: set[type], known: list[weakref.ref[Any]]) -> Found:
    young = gc.get_objects(generation=0)
    young += gc.get_objects(generation=1)
    objects, ids = [], set()
    for o in map(weakref.ref.__call__, known):
        if o is not None and type(o) in types and id(o) not in ids:
            ids.add(id(o))
            objects.append(o)
    objects += [o for o in itertools.compress(young, map(types.__contains__, map(type, young)))
                if id(o) not in ids]
    return Found(objects, set(), set(), "young")


def _remember(found: Found, promotions: tuple[int, int], observed: int, frozen: int, holders: bool,
              types: frozenset[type]) -> _LastScan | None:
    if not INCREMENTAL_SUPPORTED:
        return None
    try:
        survivors = [weakref.ref(o) for o in found.objects]
    except TypeError:  # an instance that cannot be weakly referenced: full scans from now on
        return None
    return _LastScan(promotions, observed, frozen, holders, types, survivors)


def _full(ttypes: set[type], htypes: set[type]) -> Found:
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
    return Found([o for o in found if o is not sentinel], set(), set(), method)
