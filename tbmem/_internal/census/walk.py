"""Walks below Python objects: what a pack hook made, the frames' locals, and every numpy array.

Running frames' locals are not gc objects, numpy arrays are not gc-tracked, and CPython
does not track a dict or tuple that holds only untracked objects: these walks go
through ``gc.get_referents``, which does not care whether an object is tracked. Foreign
objects are looked at only through ``type(obj)``.

Example:
    >>> import numpy as np
    >>> import torch
    >>> from tbmem._internal.census import walk
    >>> packed = (torch.device("cpu"), torch.zeros(3))  # what save_on_cpu's pack hook returns
    >>> [t.shape for t in walk.tensors_below(packed, {torch.Tensor})]
    [torch.Size([3])]
"""

from __future__ import annotations

import gc
import itertools
import operator
import sys
import threading
from inspect import CO_OPTIMIZED
from types import FrameType
from typing import Any, Iterable, Iterator

import numpy as np
import torch

from tbmem._internal.census.layout import select_types

try:  # _instances_below in C (tbmem/_internal/census/_gcwalk.c), where it was built
    from tbmem._internal.census._gcwalk import instances_below as _instances_below_c
except ImportError:
    _instances_below_c = None

__all__ = ["tensors_below", "named_below", "labelled_steps", "step", "instance_dict", "attribute_path", "optimizers_in", "read_locals", "frame_arrays", "holder_arrays", "all_arrays", "own_types",
           "object_items"]

_NO_DESCEND = (type, type(sys), type(len), type(lambda: 0))
_OPTIMIZER = torch.optim.Optimizer


def tensors_below(obj: Any, ttypes: set[type] | frozenset[type], *, depth: int = 3,
                  budget: int = 10_000) -> Iterator[Any]:
    """Tensors reachable from ``obj`` through at most ``depth`` hops of gc referents (what a pack hook made,
    an optimizer's state entry, a wrapper's attributes), not looking inside tbmem's own objects."""
    yield from _below(obj, ttypes, depth, [budget], own_types())


_OWN_MODULES = ("tbmem.", "tbmem")
_own: tuple[int, frozenset[type]] = (-1, frozenset())


def own_types(*, refresh: bool = False) -> frozenset[type]:
    """The classes tbmem defines: what their instances hold (a census's columns, the writer's buffers)
    is tbmem's own, never the user's, so the walks do not look inside them. Listed again with
    ``refresh`` (once per census) when the number of imported modules changed."""
    global _own
    if _own[0] < 0 or (refresh and _own[0] != len(sys.modules)):
        count = len(sys.modules)
        modules = [m for name, m in list(sys.modules.items()) if name.startswith(_OWN_MODULES) and m is not None]
        found = set()
        for module in modules:
            for value in list(vars(module).values()):
                if type(value) is type and str(getattr(value, "__module__", "")).startswith(_OWN_MODULES):
                    found.add(value)
        _own = (count, frozenset(found))
    return _own[1]


def object_items(arr: Any, room: int) -> list[Any] | None:
    """The first ``room`` items of a numpy array of Python objects (``dtype=object``), None for another
    array: such an array refers to its items without the collector knowing (numpy arrays are not
    gc objects), so the walks look inside it as into a list."""
    if arr.dtype.hasobject is not True or room <= 0:
        return None
    return list(itertools.islice(arr.flat, room))


def _instances_below(obj: Any, atypes: set[type] | frozenset[type], depth: int, budget: list[int],
                     stop: frozenset[type] = frozenset(), items: Any = None) -> Iterator[Any]:
    """Instances of ``atypes`` reachable from ``obj`` through at most ``depth`` hops of gc referents.

    ``budget[0]`` is the number of referents still allowed to be examined (shared
    between calls): a frame holding a list of a million objects costs a bounded scan.
    Containers CPython does not track (a dict or tuple holding only arrays) are
    walked like the others: ``gc.get_referents`` does not care whether they are tracked.
    Instances of ``stop`` are not looked inside. ``items(instance, room)``, where given,
    lists what a found instance refers to without the collector knowing (a numpy array
    of objects: :func:`object_items`); those items are its referents at the next hop.
    """
    if type(obj) in atypes:
        yield obj
        if items is None or depth <= 0 or budget[0] <= 0 or items(obj, 1) is None:
            return
        level = [obj]
    else:
        level = [obj] if _descends(type(obj)) and type(obj) not in stop else []
    for _ in range(depth):
        if budget[0] <= 0 or not level:
            return
        refs = _bounded_referents(level, budget[0], atypes, items)
        budget[0] -= len(refs)
        kinds = list(map(type, refs))
        found = list(itertools.compress(refs, map(atypes.__contains__, kinds)))
        yield from found
        for kind in set(kinds).difference(_DESCENDS):
            _descends(kind)
        level = [r for r, k in zip(refs, kinds) if _DESCENDS[k] and k not in stop]
        if items is not None:
            level += [a for a in found if items(a, 1) is not None]


def _below(obj: Any, atypes: set[type] | frozenset[type], depth: int, budget: list[int], stop: frozenset[type] = frozenset(),
           items: Any = None) -> Iterable[Any]:
    """:func:`_instances_below`, in C where it was built (the same instances in the same order, the same
    budget spent)."""
    if _instances_below_c is not None:
        return _instances_below_c(obj, atypes, depth, budget, stop, items)
    return _instances_below(obj, atypes, depth, budget, stop, items)


def named_below(value: Any, wanted: set[type] | frozenset[type], depth: int = 3, *,
                budget: list[int] | None = None) -> Iterator[tuple[Any, str]]:
    """``(instance, path)`` for each instance of ``wanted`` in ``value`` or below it, breadth first: list and
    tuple items (``[3]``), dict values (``['x']``), an object's attributes (``.L``: its instance dict or
    slots, read without running its code), at most ``depth`` hops; ``budget[0]`` objects may be looked
    into. Not inside tbmem's own objects, modules, types, functions, tensors or arrays.
    """
    left = budget if budget is not None else [10_000]
    stop = own_types()
    level: list[tuple[Any, str]] = [(value, "")]
    seen = {id(value)}
    for hop in range(depth + 1):
        following: list[tuple[Any, str]] = []
        for obj, path in level:
            kind = type(obj)
            if kind in wanted:
                yield obj, path
                continue
            if hop == depth or left[0] <= 0 or kind in stop or not _descends(kind):
                continue
            left[0] -= 1
            for label, item in _labelled_items(obj):
                if id(item) not in seen and (type(item) in wanted or _descends(type(item))):
                    seen.add(id(item))
                    following.append((item, path + label))
        level = following


_SAFE_KEYS = (str, int, float, bool, type(None))


def _labelled_items(obj: Any) -> list[tuple[str, Any]]:
    """What ``obj`` refers to, each with how a user would write it: ``[3]``, ``['x']``, ``.name``."""
    return [(label, item) for label, item, _ in labelled_steps(obj)]


def labelled_steps(obj: Any) -> list[tuple[str, Any, tuple[str, Any]]]:
    """:func:`_labelled_items`, each with the step that leads there again (:func:`step`)."""
    kind = type(obj)
    if kind in (list, tuple):
        return [(f"[{i}]", item, ("item", i)) for i, item in enumerate(obj[:1000])]
    if issubclass(kind, dict):
        items = list(itertools.islice(dict.items(obj), 1000))
        return [(f"[{k!r}]" if type(k) in _SAFE_KEYS else f"[<{type(k).__name__}>]", v, ("item", k)) for k, v in items]
    out: list[tuple[str, Any, tuple[str, Any]]] = []
    attrs = _attributes(obj)
    if attrs is not None:
        out += [(f".{k}", v, ("attr", k)) for k, v in list(attrs.items()) if type(k) is str]
    for klass in kind.__mro__:
        slots = vars(klass).get("__slots__", ())
        for slot in slots if type(slots) in (tuple, list) else ():
            member: Any = vars(klass).get(slot)
            if type(member).__name__ == "member_descriptor":
                try:
                    out.append((f".{slot}", member.__get__(obj, kind), ("slot", member)))
                except AttributeError:  # an empty slot
                    continue
    return out


def _attributes(obj: Any) -> dict[str, Any] | None:
    try:
        attrs = object.__getattribute__(obj, "__dict__")  # not a __getattr__ of the class
    except AttributeError:
        return None
    return attrs if type(attrs) is dict else None


def instance_dict(obj: Any) -> dict[str, Any]:
    """``obj``'s instance dict, read without running its class's code ({} where it has none)."""
    return _attributes(obj) or {}


def attribute_path(path: str) -> str:
    """``['mask']`` (a key of an instance dict, as :func:`named_below` writes it) -> ``.mask``."""
    if path.startswith("['") and "']" in path:
        key, rest = path[2:].split("']", 1)
        return f".{key}{rest}"
    return path


def optimizers_in(opt: Any, path: str = "", depth: int = 2) -> Iterator[tuple[str, Any]]:
    """``opt`` and the optimizers it wraps (``ZeroRedundancyOptimizer.optim``, a lookahead's ``optimizer``),
    each with its attribute path; found through instance attributes only (no code of the wrapper runs)."""
    yield path, opt
    if depth <= 0:
        return
    for name, value in list(instance_dict(opt).items()):
        if value is not opt and issubclass(type(value), _OPTIMIZER):
            yield from optimizers_in(value, f"{path}.{name}", depth - 1)


def step(obj: Any, kind: str, key: Any) -> Any:
    """Follow one step of :func:`labelled_steps` again from ``obj``; None where it no longer leads anywhere."""
    try:
        if kind == "attr":
            attrs = _attributes(obj)
            return None if attrs is None else attrs.get(key)
        if kind == "slot":
            return key.__get__(obj, type(obj))
        if type(obj) in (list, tuple):
            return obj[key] if type(key) is int and 0 <= key < len(obj) else None
        return dict.get(obj, key) if issubclass(type(obj), dict) else None
    except (AttributeError, TypeError):
        return None


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


def _bounded_referents(level: list[Any], limit: int, atypes: set[type] | frozenset[type] | None = None, items: Any = None) -> list[Any]:
    """At most ``limit`` referents of ``level``, without listing all items of a huge container first:
    the gc referents of the others, then those containers' items, then the items of the arrays of
    objects among ``level`` (``items``), up to the limit."""
    expandable = [o for o in level if type(o) in atypes] if items is not None and atypes else []
    gc_level = [o for o in level if not any(o is e for e in expandable)] if expandable else level
    containers = itertools.compress(gc_level, map(_CONTAINERS.__contains__, map(type, gc_level)))
    big = [o for o in containers if len(o) > limit]
    refs = (gc.get_referents(*(o for o in gc_level if not any(o is b for b in big))) if big
            else gc.get_referents(*gc_level))
    for container in big:
        values = container.values() if type(container) is dict else container
        refs.extend(itertools.islice(values, max(limit - len(refs), 0)))
    for arr in expandable:
        refs.extend(items(arr, max(limit - len(refs), 0)) or ())
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
                 skip_module: str = "tbmem._internal.census") -> Iterator[tuple[np.ndarray, str]]:
    """Arrays held by the local variables of every thread's running frames.

    Running frames are not gc-tracked: this is how SciPy's L-BFGS-B state (locals
    of ``_minimize_lbfgsb``, in PhiML's worker thread) is found. The calling thread's
    frames are left holding nothing extra (see :func:`read_locals`); on Python < 3.13,
    other threads' frames keep their copy until the next census or until they exit.
    """
    left = [budget]
    own = own_types()
    release_mine = not _tracing()
    me = threading.get_ident()
    stacks = list(sys._current_frames().items())
    # An object several frames hold (each method's ``self``, a shared config) is walked once: what
    # it leads to was named by the innermost frame holding it, as the first claim names a storage.
    walked: dict[int, Any] = {}  # id -> the object, held so that no id is reused during the walk
    frame: FrameType | None
    try:
        for thread, frame in stacks:
            while frame is not None:
                if not str(frame.f_globals.get("__name__", "")).startswith(skip_module):
                    where = frame.f_code.co_name
                    for var, value in read_locals(frame, release=release_mine and thread == me):
                        if id(value) in walked:
                            continue
                        walked[id(value)] = value
                        for arr in _below(value, atypes, depth, left, own, object_items):
                            yield arr, f"numpy {where}:{var}"
                frame = frame.f_back
    finally:
        # This generator's own frame is on the stack it walks: a reference to it from its own
        # locals would be a cycle keeping the last array seen alive until the next collection.
        stacks = frame = value = arr = walked = None  # type: ignore[assignment]


def holder_arrays(holders: Iterable[Any], atypes: set[type]) -> Iterator[tuple[np.ndarray, str]]:
    """Arrays wrapped by known holder objects (PhiML tensors: instance dict -> native array)."""
    left = [1 << 62]
    own = own_types()
    for holder in holders:  # a PhiML tensor holds its native array itself (no array of objects between)
        for arr in _below(holder, atypes, 2, left, own):
            yield arr, f"numpy in {type(holder).__name__}"


def all_arrays(atypes: set[type]) -> Iterator[tuple[np.ndarray, str]]:
    """Arrays referenced by any gc-tracked object, directly or through untracked dicts and tuples.

    CPython does not track a dict or tuple that holds only untracked objects (arrays are
    untracked), so ``gc.get_objects()`` misses them: their items are reached here through
    the tracked objects that refer to them. Arrays of Python objects are looked inside too.
    Running frames' locals are not gc objects: :func:`frame_arrays` finds those. Arrays that
    tbmem itself holds (:func:`own_arrays`) are not the user's and are left out.
    """
    own = own_arrays(atypes)
    objs = gc.get_objects()
    refs = gc.get_referents(*objs)
    del objs
    wanted = set(atypes) | _UNTRACKABLE
    seen: set[int] = set()
    while refs:
        picked = select_types(refs, wanted)
        del refs
        kinds = list(map(type, picked))
        arrays = [a for a in itertools.compress(picked, map(atypes.__contains__, kinds)) if id(a) not in own]
        for arr in arrays:
            yield arr, "numpy.ndarray"
        containers = list(itertools.compress(picked, map(_UNTRACKABLE.__contains__, kinds)))
        del picked, kinds
        untracked = list(itertools.compress(containers, map(operator.not_, map(gc.is_tracked, containers))))
        by_id = dict(zip(map(id, untracked), untracked))
        # arrays of objects: their items are referents the collector does not know of
        by_id.update((id(a), a) for a in arrays if object_items(a, 1) is not None)
        fresh = [by_id[key] for key in by_id.keys() - seen]
        seen.update(map(id, fresh))
        refs = gc.get_referents(*(o for o in fresh if type(o) not in atypes))
        for arr in fresh:
            if type(arr) in atypes:
                refs += object_items(arr, arr.size) or ()
        del containers, untracked, by_id, arrays, fresh


def own_arrays(atypes: set[type]) -> set[int]:
    """Ids of the arrays tbmem holds: below its modules' globals (a cache of lookup tables) and inside
    instances of its classes (a census's columns), four hops deep."""
    roots: list[Any] = [vars(m) for name, m in list(sys.modules.items()) if name.startswith(_OWN_MODULES) and m]
    roots += select_types(gc.get_objects(), own_types())
    left = [1 << 62]
    return {id(a) for root in roots for a in _instances_below(root, atypes, 4, left)}
