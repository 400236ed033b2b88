"""Naming an otherwise anonymous tensor after what holds it: ``trainer.val_batch['x']``, ``cache[3]``.

A tensor no model, optimizer or graph names is counted under ``other`` with its type's name
(``Tensor``), which says nothing about where it lives. The census names the largest of them after a
path that reaches it from a running frame's local variable (or a script's global): attributes
(``.val_batch``, an object's instance dict or slots), dict keys (``['x']``) and list or tuple items
(``[3]``), a submodule as ``.encoder``. The shortest path wins; among equally short ones, the outermost
frame's (a script's ``trainer`` rather than a method's ``self``); ``self`` is written as its class.

Paths are read without running user code (instance dicts, dict and list items, as
:func:`tbmem._internal.census.walk.named_below` reads them), in a breadth-first search bounded by a budget of
objects looked into. A path found is remembered (with weak references to its root and its tensor) and
followed again at the next census before any search, so a training loop whose large tensors stay
where they are pays a few dictionary lookups per census.

Example:
    >>> import torch
    >>> from tbmem._internal.census import take_census
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

from tbmem._internal.census import walk

__all__ = ["holder_names", "BUDGET", "DEPTH", "wrapper_prefix", "unwrapped", "module_of", "module_depth",
           "MODULE_DEPTH_ENV", "parameter_holders", "WRAPPER_PARTS"]

#: Objects looked into per search (about 2 us each) and hops below a local variable.
BUDGET, DEPTH = 2_000, 4
_SKIPPED_KEYS = frozenset({"_parameters", "_buffers", "_forward_hooks", "_forward_pre_hooks", "_backward_hooks",
                           "_state_dict_hooks", "_load_state_dict_pre_hooks", "_non_persistent_buffers_set"})
_OWN_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep  # tbmem/
_SUBMODULE = re.compile(r"\._modules\['([^']+)'\]")  # model._modules['encoder'] reads model.encoder
#: Path parts that only wrappers add, wherever they are (torch.compile, FSDP1, activation checkpointing).
WRAPPER_PARTS = ("_orig_mod.", "_fsdp_wrapped_module.", "_checkpoint_wrapped_module.")
_DDP_TYPES = ("DistributedDataParallel", "DataParallel", "FullyShardedDataParallel")


def wrapper_prefix(model: Any) -> str:
    """The path the wrappers around ``model`` put before each of its names: ``module.`` for DDP, DataParallel
    and FSDP, ``_orig_mod.`` for torch.compile, ``base_model.model.`` for a peft model, in their order.

    Example:
        >>> import torch
        >>> wrapper_prefix(torch.nn.DataParallel(torch.nn.Linear(2, 2)))
        'module.'
    """
    prefix = ""
    for _ in range(8):  # wrappers nest a few deep; a cycle of attributes must not loop
        kind = type(model)
        if kind.__name__ == "OptimizedModule" and hasattr(model, "_orig_mod"):
            prefix, model = prefix + "_orig_mod.", model._orig_mod
        elif kind.__name__ in _DDP_TYPES and isinstance(getattr(model, "module", None), _module_type()):
            prefix, model = prefix + "module.", model.module
        elif kind.__module__.startswith("peft.") and hasattr(getattr(model, "base_model", None), "model"):
            prefix, model = prefix + "base_model.model.", model.base_model.model
        else:
            break
    return prefix


def unwrapped(name: str, prefix: str = "") -> str:
    """``name`` as the user's own model spells it: the wrappers' ``prefix`` and their parts taken out.

    Example:
        >>> unwrapped("module._orig_mod.encoder.weight", "module._orig_mod.")
        'encoder.weight'
        >>> unwrapped("encoder._orig_mod.layer.bias")
        'encoder.layer.bias'
    """
    if prefix and name.startswith(prefix):
        name = name[len(prefix):]
    for part in WRAPPER_PARTS:
        if part in name:
            name = name.replace("." + part, ".").removeprefix(part)
    return name


#: Overrides the configured depth of the by-module breakdown in the training process (``MemoryWriterConfig.module_depth``).
MODULE_DEPTH_ENV = "TBMEM_MODULE_DEPTH"


def module_depth(configured: int = 1) -> int:
    """How many levels of a model the by-module breakdown names: ``TBMEM_MODULE_DEPTH`` where it is set (a
    positive integer; anything else is reported once and ignored), else ``configured`` (1: ``model.encoder``;
    2: ``model.encoder.layers``).

    Example:
        >>> import os
        >>> module_depth(2) if "TBMEM_MODULE_DEPTH" not in os.environ else 2
        2
    """
    raw = os.environ.get(MODULE_DEPTH_ENV, "").strip()
    if raw:
        if raw.isdigit() and int(raw) >= 1:
            return int(raw)
        from tbmem._internal._log import report_once

        report_once("census:module_depth", f"tbmem: {MODULE_DEPTH_ENV}={raw!r} is not a number of levels >= 1; "
                    f"the by-module breakdown uses the configured depth ({configured})")
    return max(1, int(configured))


def module_of(name: str, label: str, depth: int) -> str:
    """The module a tensor named ``name`` (a parameter's or buffer's path) counts under in the by-module
    breakdown: ``label`` and the first ``depth`` parts of its path, its own name left out.

    Example:
        >>> module_of("transformer.h.0.attn.weight", "model", 2), module_of("bias", "model", 2)
        ('model.transformer.h', 'model')
    """
    parts = name.split(".")[:-1][:depth]
    return ".".join([label, *parts])


def parameter_holders(targets: list[Any], depth: int = 1) -> dict[int, tuple[str, str]]:
    """``id(parameter) -> (name, module)`` for the ``targets`` (parameters no watched model names) that a module
    held by a running frame's local variable, or by an attribute or item of one, holds: ``teacher.encoder.weight``
    under ``teacher.encoder`` (``depth`` levels of it: :func:`module_of`). The outermost frame's modules first, as for
    :func:`holder_names`."""
    wanted = {id(t) for t in targets}
    out: dict[int, tuple[str, str]] = {}
    module = _module_type()
    for var, value, _ in _roots():
        label = type(value).__name__ if var in ("self", "cls") else var
        # type(), not isinstance: a hostile object's __class__ is not read
        found = [(label, value)] if issubclass(type(value), module) else [
            (label + lab, item) for lab, item, _ in walk.labelled_steps(value) if issubclass(type(item), module)]
        for where, m in found:
            prefix = wrapper_prefix(m)
            for name, p in m.named_parameters():
                if id(p) in wanted and id(p) not in out:
                    name = unwrapped(name, prefix)
                    out[id(p)] = (f"{where}.{name}", module_of(name, where, depth))
            if len(out) == len(wanted):
                return out
    return out


def _module_type() -> type:
    import torch

    return torch.nn.Module


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
