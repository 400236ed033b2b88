"""Naming an otherwise anonymous tensor after what holds it: ``trainer.val_batch['x']``, ``cache[3]``.

A tensor no model, optimizer or graph names is counted under ``other`` with its type's name
(``Tensor``), which says nothing about where it lives. The census names the largest of them after a
path that reaches it from a running frame's local variable (or a script's global): attributes
(``.val_batch``, an object's instance dict or slots), dict keys (``['x']``) and list or tuple items
(``[3]``), a submodule as ``.encoder``. The shortest path wins; among equally short ones, the outermost
frame's (a script's ``trainer`` rather than a method's ``self``); ``self`` is written as its class.

Paths are read without running user code (instance dicts, dict and list items, as
:func:`tbmem.census.walk.named_below` reads them), in a breadth-first search bounded by a budget of
objects looked into. A path found is remembered (with weak references to its root and its tensor) and
followed again at the next census before any search, so a training loop whose large tensors stay
where they are pays a few dictionary lookups per census.

Example:
    >>> import torch
    >>> from tbmem.census import take_census
    >>> cache = {"val": [torch.zeros(1000), torch.zeros(4000)]}
    >>> census = take_census()
    >>> [r.name for r in census.records if r.bytes == 16000]
    ["cache['val'][1]"]
"""

from __future__ import annotations

import os
import re
import sys
import threading
import weakref
from types import FrameType
from typing import Any, NamedTuple

from tbmem.census import walk

__all__ = ["holder_names", "BUDGET", "DEPTH"]

#: Objects looked into per search (about 2 us each) and hops below a local variable.
BUDGET, DEPTH = 2_000, 4
_SKIPPED_KEYS = frozenset({"_parameters", "_buffers", "_forward_hooks", "_forward_pre_hooks", "_backward_hooks",
                           "_state_dict_hooks", "_load_state_dict_pre_hooks", "_non_persistent_buffers_set"})
_OWN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # tbmem/
_SUBMODULE = re.compile(r"\._modules\['([^']+)'\]")  # model._modules['encoder'] reads model.encoder


class _Local(NamedTuple):
    """A running frame's local variable as the root of a path (a list or dict cannot be weakly referenced):
    found again among the frames of the next census by its code object and name."""

    code: Any
    var: str


class _Remembered(NamedTuple):
    tensor: weakref.ref[Any]
    root: weakref.ref[Any] | _Local | None  # None: searched for, not found (not searched again while it lives)
    steps: tuple[tuple[str, Any], ...]  # ("attr", name), ("item", key) or ("slot", member) from the root
    name: str
    parent: str = ""  # the name of what holds it (``trainer.val_set._cache``): looked into first next time


_remembered: dict[int, _Remembered] = {}
_lock = threading.Lock()
_Found = tuple[str, Any, tuple[tuple[str, Any], ...], str]  # name, root (a weakref or _Local), steps, parent's name


def holder_names(targets: list[Any], *, budget: int = BUDGET, depth: int = DEPTH) -> dict[int, str]:
    """``id(tensor) -> name`` for the ``targets`` a path from a running frame reaches (the others are left out).

    A target named (or searched for in vain) at the last census is not searched for again while its
    path still leads to it (while it lives): the search runs for new targets only.
    """
    with _lock:  # censuses of several threads share what is remembered
        return _names(targets, budget, depth)


def _names(targets: list[Any], budget: int, depth: int) -> dict[int, str]:
    roots = _roots()
    frames = {(code, var): value for var, value, code in roots}
    wanted = {id(t): t for t in targets}
    out: dict[int, str] = {}
    for key in list(wanted):
        known = _remembered.get(key)
        if known is not None and known.tensor() is wanted[key]:
            if known.root is None:
                del wanted[key]  # not found last time: not searched again
            elif _follow(known.root, known.steps, frames) is wanted[key]:
                out[key] = known.name
                del wanted[key]
    parents = {(_root_key(k.root), k.steps[:-1]): k for k in _remembered.values() if k.root is not None and k.steps}
    found = _look_into(list(parents.values()), wanted, frames) if wanted else {}  # an LRU cache's new entries
    missing = {k: t for k, t in wanted.items() if k not in found}
    searched = _search(missing, roots, budget, depth) if missing else {}
    searched.update(found)
    for key, tensor in wanted.items():
        name, root, steps, parent = searched.get(key, ("", None, (), ""))
        if name:
            out[key] = name
        try:
            _remembered[key] = _Remembered(weakref.ref(tensor), root, steps, name, parent)
        except TypeError:
            _remembered.pop(key, None)
    for key in [k for k in _remembered if k not in {id(t) for t in targets}]:
        del _remembered[key]
    return out


def _look_into(parents: list[_Remembered], wanted: dict[int, Any], frames: dict[Any, Any]) -> dict[int, _Found]:
    """Targets among the items of what held a named tensor at the last census."""
    found: dict[int, _Found] = {}
    for known in parents:
        holder = _follow(known.root, known.steps[:-1], frames)
        if holder is None:
            continue
        for label, item, step in walk.labelled_steps(holder):
            if id(item) in wanted and id(item) not in found:
                found[id(item)] = (_SUBMODULE.sub(r".\1", known.parent + label), known.root,
                                   known.steps[:-1] + (step,), known.parent)
    return found


def _root_key(root: Any) -> Any:
    """What identifies a remembered root (a dead weak reference cannot be hashed)."""
    return tuple(root) if type(root) is _Local else id(root)


def _root_of(value: Any, code: Any, var: str) -> weakref.ref[Any] | _Local:
    """How a path's root is found again: a weak reference to it, or the local variable that held it."""
    try:
        return weakref.ref(value)
    except TypeError:
        return _Local(code, var)


def _follow(root: Any, steps: tuple[tuple[str, Any], ...], frames: dict[Any, Any]) -> Any:
    obj = frames.get(tuple(root)) if type(root) is _Local else root()
    for kind, key in steps:
        if obj is None:
            return None
        obj = walk.step(obj, kind, key)
    return obj


def _roots() -> list[tuple[str, Any, Any]]:
    """``(variable, value, code)`` of every running frame's locals, outermost frame first, tbmem's own left out."""
    out: list[tuple[str, Any, Any]] = []
    release_mine = not walk._tracing()
    me = threading.get_ident()
    frame: FrameType | None
    for thread, frame in list(sys._current_frames().items()):
        stack = []
        while frame is not None:
            if not frame.f_code.co_filename.startswith(_OWN_DIR):  # tbmem's own frames hold nothing of the user's
                stack.append(frame)
            frame = frame.f_back
        for f in reversed(stack):
            code = f.f_code
            out += [(var, value, code) for var, value in walk.read_locals(f, release=release_mine and thread == me)]
        del stack
    return out


def _search(wanted: dict[int, Any], roots: list[tuple[str, Any, Any]], budget: int, depth: int) -> dict[int, _Found]:
    """Breadth first from every local variable: ``id(target) -> (name, root, steps, parent's name)``."""
    stop = walk.own_types()
    found: dict[int, _Found] = {}
    # (object, name, root, steps, parent's name)
    level: list[tuple[Any, str, Any, tuple[tuple[str, Any], ...], str]] = []
    seen: dict[int, Any] = {}  # id -> object, held so that no id is reused meanwhile
    for var, value, code in roots:
        if id(value) not in seen:
            seen[id(value)] = value
            label = type(value).__name__ if var in ("self", "cls") else var
            level.append((value, label, (value, code, var), (), ""))
    left = budget
    try:
        for hop in range(depth + 1):
            following = []
            for obj, name, root, steps, parent in level:  # this hop's targets first: a shorter path is never missed
                if id(obj) in wanted and id(obj) not in found:
                    found[id(obj)] = (_SUBMODULE.sub(r".\1", name), _root_of(*root), steps, parent)
            if len(found) == len(wanted):
                return found
            for obj, name, root, steps, _parent in level:
                if id(obj) in wanted:
                    continue
                kind = type(obj)
                if hop == depth or left <= 0 or kind in stop or not walk._descends(kind):
                    continue
                left -= 1
                for label, item, step in walk.labelled_steps(obj):
                    if id(item) in seen or label[1:] in _SKIPPED_KEYS:
                        continue
                    seen[id(item)] = item
                    if id(item) in wanted or walk._descends(type(item)):
                        following.append((item, name + label, root, steps + (step,), name))
            level = following
        return found
    finally:
        seen.clear()
        level = following = []
