"""Finding every live tensor, storage and autograd node: a pass over the whole heap, or over what is new.

Only ``type(obj)`` is looked at for objects the census did not ask for: no
``isinstance`` (it reads ``__class__``, which runs user code, raises on dead
weakref proxies and emits deprecation warnings for lazy modules).

**What is looked for.** Instances of ``torch.Tensor`` and every subclass (no
heuristic decides that a subclass has no instances: each full scan looks for all of
them), bare storages (``UntypedStorage``, ``TypedStorage``), autograd nodes (a graph
may be held by nothing but its ``grad_fn``), and, on request, PhiML's array holders.

**Full scan.** One walk of the collector's lists in C that keeps the objects of the wanted
types (``tbmem/_internal/census/_gcwalk.c``, an optional extension built at install time): about 16
ms for 320k objects. Without it, ``gc.get_objects()`` and a selection by exact type
(:func:`tbmem._internal.census.layout.select_types`, which reads the type pointers in bulk): about
26 ms. Both see exactly the objects ``gc.get_objects()`` lists, in its order.

**Incremental scan.** CPython's collector puts every new object in generation 0
and moves objects to generation 2 only in a collection of generation 1 or 2, or when
``gc.unfreeze()`` returns frozen objects (to generation 2, without a collection). So
when ``gc.get_stats()`` shows no such collection since the last scan, the freeze
count is unchanged, and a marker object made at the end of the last scan is still in
a young generation (``gc.freeze(); gc.unfreeze()`` moves it too), every instance
created since is still in generation 0 or 1: the instances alive now are the
survivors of the last scan (held by weak references, which keep nothing alive) plus
the instances found in the young generations. The result is the full scan's, at the
cost of the young generations (well under a millisecond).

Between :func:`start_capture` and :func:`stop_capture` (``MemoryWriter`` brackets
its life with them when the census is on), a ``gc.callbacks`` hook also notes the
instances in the young generations at the start of every collection that is about
to move them to generation 2, so promotions no longer force a full scan; at its end
it makes a new marker. It costs a pass over the young generations (a few thousand
objects) per such collection, which itself traverses them. The hook is the extension's
``collection_hook``: the collector prints and drops what a Python callback raises, and a
Ctrl-C that arrives during a collection is raised in the first Python callback that runs;
the C hook raises it again in the interrupted code once the collection is over (and keeps
collections of generation 0 out of Python). Without the extension there is no hook
(:data:`CAPTURE_SUPPORTED` is False): every promotion means a full scan.

The types looked for are listed once and kept while no class was defined since
(:mod:`tbmem._internal.census.kinds`): the classes among the young objects are compared with
those young at the last scan, and the callback flags a new class it sees promoted.

Any doubt (a collection this module did not see, a collection during the scan, the
marker gone from the young generations, a type that did not exist at the last scan,
an old instance that cannot be weakly referenced, such as a C++ autograd node's
Python object, an interpreter whose collector is not this one) means a full scan.

Example:
    >>> import torch
    >>> from tbmem._internal.census import heap
    >>> keep = torch.zeros(256)
    >>> any(t is keep for t in heap.find_instances().objects)
    True
"""

from __future__ import annotations

import functools
import gc
import itertools
import operator
import sys
import sysconfig
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

from tbmem._internal.census.layout import select_types

from tbmem._internal.census.kinds import (
    _CPP_NODE_TYPES, Kinds, array_types, cpp_node_types, holder_types, list_kinds, metaclasses, new_kinds,
    node_types, outdated, split_classes, storage_types, tensor_types,
)

try:  # the heap pass in C (tbmem/_internal/census/_gcwalk.c), built where a C compiler was at install time (wheels have it)
    from tbmem._internal.census._gcwalk import own_anchors as _own_anchors
    from tbmem._internal.census._gcwalk import select_listed as _select_listed
    from tbmem._internal.census._gcwalk import select_tracked_from as _select_from
    from tbmem._internal.census._gcwalk import weak_refs as _weak_refs_c
except ImportError:  # the one Python fallback: gc.get_objects() and a selection by exact type
    _own_anchors = _select_listed = _select_from = _weak_refs_c = None
try:  # apart: an extension built before it had the hook still has the heap pass
    from tbmem._internal.census._gcwalk import collection_hook as _collection_hook
except ImportError:
    _collection_hook = None
try:  # the permanent generation (gc.freeze()), where the extension can read it (CPython 3.10, 3.11)
    from tbmem._internal.census._gcwalk import select_frozen as _select_frozen

    _select_frozen(())
except (ImportError, NotImplementedError):
    _select_frozen = None
#: Whether full scans also see the objects frozen by ``gc.freeze()`` (else no scan does).
FROZEN_READABLE = _select_frozen is not None
#: Whether full scans walk the heap in C (False: ``gc.get_objects()``, as fast as numpy makes it).
C_HEAP_PASS = _select_from is not None

__all__ = [  # the type listings are re-exported from tbmem._internal.census.kinds
    "Found", "INCREMENTAL_SUPPORTED", "CAPTURE_SUPPORTED", "C_HEAP_PASS", "MAX_INDEXED", "FROZEN_READABLE", "tensor_types", "storage_types", "node_types", "array_types",
    "holder_types", "cpp_node_types", "find_instances", "frozen_objects", "forget", "start_capture", "stop_capture",
]

# The generational collector the incremental scan relies on: CPython 3.10-3.13 with the GIL
# (3.14 collects incrementally, and the free-threaded build has no generations to speak of).
INCREMENTAL_SUPPORTED = (sys.implementation.name == "cpython" and sys.version_info[:2] < (3, 14)
                         and not sysconfig.get_config_var("Py_GIL_DISABLED"))
#: Whether :func:`start_capture` notes promoted instances (it needs the extension's gc hook).
CAPTURE_SUPPORTED = INCREMENTAL_SUPPORTED and _collection_hook is not None


def _weak_refs(objs: list[Any]) -> list[weakref.ref[Any]]:
    """Weak references to ``objs``, less the C++ nodes' objects, which cannot have one (see :func:`forget`).

    In C where it was built: the same references, untracked by the collector (a weak reference without
    a callback is in no reference cycle), so that the index adds nothing to the user's collections.

    Raises:
        TypeError: another object cannot be weakly referenced.
    """
    if _weak_refs_c is not None:
        return _weak_refs_c(objs, _CPP_NODE_TYPES)
    weak = map(operator.not_, map(_CPP_NODE_TYPES.__contains__, map(type, objs)))
    return list(map(weakref.ref, itertools.compress(objs, weak)))


def frozen_objects() -> int:
    """Objects moved out of the collector's sight by ``gc.freeze()``: no scan can see them."""
    return gc.get_freeze_count()


class Found(NamedTuple):
    """What one heap pass found."""

    objects: list[Any]  # instances of the types below
    tensor_types: frozenset[type]  # shared between scans: never to be changed
    holder_types: frozenset[type]
    method: str  # "objects" (full scan) or "young" (incremental)
    storage_types: frozenset[type] = frozenset()
    node_types: frozenset[type] = frozenset()
    module_types: frozenset[type] = frozenset()


class _Marker:
    """Made at the end of each scan: while it is in a young generation, so is everything made after it."""

    __slots__ = ("__weakref__",)


@dataclass
class _LastScan:
    """What the incremental scan needs from the previous one."""

    promotions: tuple[int, int]  # collections of generations 1 and 2 before it started
    observed: int  # _observed when it started
    frozen: int
    holders: bool
    types: frozenset[type]  # the instances of these were all found
    survivors: list[weakref.ref[Any]]
    marker: _Marker
    kinds: Kinds  # those types, listed at this scan or one before (see tbmem._internal.census.kinds)
    classes: dict[int, weakref.ref[type]]  # the classes young when it started: one not among them is new


_last: _LastScan | None = None
_lock = threading.Lock()
# Written by the gc callback: promoting collections seen, and the instances they were about to promote.
_observed = 0
_promoted: list[weakref.ref[Any]] = []
#: At most this many weak references in the index (survivors and promoted instances, about 90 bytes each);
#: a heap holding more instances is scanned fully each time, so that the census keeps no more than 1 MB.
MAX_INDEXED = 10_000
_forgotten = 0  # times the callback dropped the index: a scan running meanwhile must not store its own
_new_class = False  # the callback saw a class made since the last scan: list the types afresh
_capture_users = 0
_hook: Callable[[str, dict[str, Any]], None] | None = None  # in gc.callbacks while capturing


def _promotions() -> tuple[int, int]:
    stats = gc.get_stats()
    return stats[1]["collections"], stats[2]["collections"]


def _young_objects() -> list[Any]:
    young = gc.get_objects(generation=0)
    young += gc.get_objects(generation=1)
    return young


def _split_marker(objs: list[Any], types: frozenset[type] | set[type], marker: _Marker) -> tuple[list[Any], bool]:
    """The instances of ``types`` among ``objs``, and whether ``marker`` is among them."""
    if _select_listed is not None:  # in C: a few thousand objects, a thousand types
        instances, marked = _select_listed(objs, types, marker)
        return instances, marked
    picked = select_types(objs, {*types, _Marker})
    instances = [o for o in picked if type(o) is not _Marker]
    return instances, any(o is marker for o in picked)


def _on_collection(phase: str, info: dict[str, Any]) -> None:
    """gc callback (through ``collection_hook``, which leaves out collections of generation 0): before a
    collection moves the young generations to generation 2, note their instances."""
    global _observed, _last, _forgotten, _new_class
    last = _last
    if phase == "stop":  # what is made from now on is young again
        if last is not None:
            last.marker = _Marker()
        return
    if phase != "start":
        return
    try:
        _observed += 1
        if last is None:
            return
        picked, marked = _split_marker(_young_objects(), last.kinds.watch, last.marker)
        if not marked:
            raise LookupError("gc.unfreeze() moved young objects to the oldest generation")
        instances, classes = split_classes(picked, last.kinds)
        if new_kinds(classes, last.classes, last.kinds):
            _new_class = True
        _promoted.extend(_weak_refs(instances))
        if len(_promoted) + len(last.survivors) > MAX_INDEXED:
            raise OverflowError("too many promoted instances")
    except BaseException as exc:  # noqa: BLE001 - a gc callback must never raise; the next census scans fully
        _last = None
        _forgotten += 1
        _promoted.clear()
        if not isinstance(exc, Exception):
            raise  # Ctrl-C, handled in here: the hook raises it again once the collection is over


def start_capture() -> None:
    """Note promoted instances from now on, so that later incremental scans stay possible (counted)."""
    global _capture_users, _hook
    with _lock:
        _capture_users += 1
        if _capture_users == 1 and CAPTURE_SUPPORTED:
            _hook = functools.partial(_collection_hook, _on_collection)
            gc.callbacks.append(_hook)


def stop_capture() -> None:
    """Undo one :func:`start_capture`; the last one removes the gc callback."""
    global _capture_users, _hook
    with _lock:
        if _capture_users == 0:
            return
        _capture_users -= 1
        if _capture_users == 0:
            while _hook is not None and _hook in gc.callbacks:
                gc.callbacks.remove(_hook)
            _hook = None
            _promoted.clear()


def find_instances(holders: bool = True, *, incremental: bool = True) -> Found:
    """Every gc-tracked tensor, storage and autograd node (and, with ``holders``, array holder) instance.

    Args:
        holders: Also find PhiML tensors (which hold numpy arrays).
        incremental: Scan only the young generations when that is known to find
            everything (see the module docstring); False forces a full scan.
    """
    global _last, _promoted, _new_class
    with _lock:
        promotions, observed, frozen, forgotten = _promotions(), _observed, frozen_objects(), _forgotten
        promoted = _promoted
        _promoted = []
        new_class, _new_class = _new_class, False
        found: Found | None = None
        kinds: Kinds | None = None
        classes: list[type] | None = None
        if incremental and _last is not None:
            found, kinds, classes = _incremental(_last, promoted, promotions, observed, frozen, holders, new_class)
            if _promotions() != promotions:  # a collection ran meanwhile (another thread's gc.collect())
                found = None
        if found is None:
            # The young classes before the types are listed: one defined in between is new next time.
            classes = _select(_young_objects(), metaclasses())
            kinds = list_kinds(holders)
            found = _full(kinds.types)
        del promoted
        assert kinds is not None and classes is not None  # each branch that finds also lists the types
        fresh = _remember(found, promotions, observed, frozen, holders, kinds, classes)
        _last = fresh if _forgotten == forgotten else None
        return found._replace(tensor_types=kinds.tensor_types, holder_types=kinds.holder_types,
                              storage_types=kinds.storage_types, node_types=kinds.node_types,
                              module_types=kinds.module_types)


def _select(objs: list[Any], types: frozenset[type]) -> list[Any]:
    return _select_listed(objs, types, None)[0] if _select_listed is not None else select_types(objs, types)


def _incremental(last: _LastScan, promoted: list[weakref.ref[Any]], promotions: tuple[int, int], observed: int,
                 frozen: int, holders: bool, new_class: bool) -> tuple[Found | None, Kinds, list[type] | None]:
    """The survivors plus the young instances, or None (a full scan is needed); the types; the young classes."""
    kinds = last.kinds if not new_class and last.holders == holders else list_kinds(holders)
    young = _young_objects()
    while True:
        if not _can_skip_old(last, promotions, observed, frozen, holders, kinds.types):
            return None, kinds, None
        picked, marked = _split_marker(young, kinds.watch, last.marker)
        if not marked:  # gc.freeze(); gc.unfreeze() moved what is new to the oldest generation
            return None, kinds, None
        instances, classes = split_classes(picked, kinds)
        if kinds is last.kinds and outdated(classes, last.classes, kinds):
            kinds = list_kinds(holders)  # a class that may be one of them was defined since the listing
            continue
        return _young(kinds.types, last.survivors + promoted, instances), kinds, classes


def _can_skip_old(last: _LastScan | None, promotions: tuple[int, int], observed: int, frozen: int,
                  holders: bool, types: frozenset[type]) -> bool:
    if not INCREMENTAL_SUPPORTED or last is None or last.frozen != frozen or (holders and not last.holders):
        return False
    moved = sum(promotions) - sum(last.promotions)
    if moved == 0:
        return True
    # Every promoting collection since must have been seen by the callback, which looked for
    # the types of the last scan: a type defined since could have had instances promoted.
    return moved == observed - last.observed and types <= last.types


def _young(types: frozenset[type], known: list[weakref.ref[Any]], instances: list[Any]) -> Found:
    """The survivors still alive, then the young instances not among them."""
    alive = list(map(weakref.ref.__call__, known))  # None for the dead: not of any of the types
    kept = list(itertools.compress(alive, map(types.__contains__, map(type, alive))))
    by_id = dict(zip(map(id, kept), kept))  # the first of each, in order (one id: one object while held)
    objects = list(by_id.values())
    objects += itertools.compress(instances, map(operator.not_, map(by_id.__contains__, map(id, instances))))
    return Found(objects, frozenset(), frozenset(), "young")


def _remember(found: Found, promotions: tuple[int, int], observed: int, frozen: int, holders: bool,
              kinds: Kinds, classes: list[type]) -> _LastScan | None:
    if not INCREMENTAL_SUPPORTED or len(found.objects) > MAX_INDEXED:
        return None
    try:
        survivors = _weak_refs(found.objects)
        known = {id(c): weakref.ref(c) for c in classes}
    except TypeError:  # an instance that cannot be weakly referenced: full scans from now on
        return None
    return _LastScan(promotions, observed, frozen, holders, kinds.types, survivors, _Marker(), kinds, known)


def forget() -> None:
    """Make the next scan a full one.

    The census calls this when it found a graph that only the Python object of a C++
    autograd node holds (``fn = loss.grad_fn`` with every tensor of the graph gone): such
    an object cannot be weakly referenced, so once it is in the oldest generation only a
    full scan finds it again. Objects of C++ nodes that belong to graphs a tensor holds
    are left out of the incremental bookkeeping: those graphs are walked from the tensor.
    """
    global _last
    with _lock:
        _last = None


#: Stretches of the oldest generation walked side by side (see ``select_tracked_from`` in _gcwalk.c).
STRETCHES = 32
# Empty lists of tbmem's own (_gcwalk.own_anchors), which each full walk places evenly along the oldest
# generation for the next (objects of the heap picked as anchors had to be weakly referenceable, which
# left long stretches where a heap holds none: lists, dicts, tuples)
_anchors: list[list[Any]] = []
_spacing = 0


def _full(types: frozenset[type]) -> Found:
    found = _tracked(types)
    if FROZEN_READABLE and gc.get_freeze_count():
        found.objects.extend(_select_frozen(tuple(types)))
    return found


def _tracked(types: frozenset[type]) -> Found:
    global _spacing
    if _select_from is not None:
        try:
            if not _anchors:
                _anchors.extend(_own_anchors())
            objs, _, length = _select_from(tuple(types), _anchors, _spacing, True)
        except (NotImplementedError, MemoryError, RuntimeError):
            pass  # the Python pass below lists the same objects
        else:
            _spacing = max(1, length // (4 * STRETCHES))
            return Found(objs, frozenset(), frozenset(), "objects")
    objs = gc.get_objects()
    found = select_types(objs, types)
    del objs
    return Found(found, frozenset(), frozenset(), "objects")
