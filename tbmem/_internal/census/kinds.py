"""The types whose instances the census looks for, and how it knows that none was defined since.

Listing them walks ``type.__subclasses__`` from a few roots: ``torch.Tensor``, the
storages, autograd nodes (every ``torch.autograd.Function`` has a node class: a
thousand types in a trainer process, 0.2 ms with cold caches) and PhiML's array
holders. :mod:`tbmem._internal.census.heap` lists them once and keeps the list while it can
show that no class was defined since: every class is an instance of a metaclass
(a subclass of ``type``), every class object is gc-tracked, and a class made since
the last scan is in a young generation or was seen by the gc callback before its
promotion. So the young objects that are classes are compared with those that were
young when the types were listed (:attr:`Kinds.metaclasses`). A new one means a new
listing when it derives (through ``__bases__``, which is what ``__subclasses__``
follows) from a type looked for or from ``type``; one that derives from none of them
(``torch.save`` defines a pickler class at every call) changes nothing. PhiML's
holder class is a root of its own: its appearance (PhiML imported since) means a new
listing too. A class whose ``__bases__`` are reassigned to make it a tensor
subclass is not a new class: its instances are counted once a full scan runs.

Example:
    >>> import torch
    >>> from tbmem._internal.census.kinds import list_kinds
    >>> kinds = list_kinds(holders=False)
    >>> torch.nn.Parameter in kinds.tensor_types and torch.nn.Parameter in kinds.types
    True
    >>> type(torch.nn.Parameter) in kinds.metaclasses  # a new tensor subclass would be an instance of one
    True
"""

from __future__ import annotations

import itertools
import sys
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

try:  # type.__subclasses__ walked in C (tbmem/_internal/census/_gcwalk.c), where it was built
    from tbmem._internal.census._gcwalk import subclasses as _subclasses_c
except ImportError:
    _subclasses_c = None

__all__ = [
    "Kinds", "list_kinds", "subclasses", "tensor_types", "module_types", "storage_types", "cpp_node_types", "node_types",
    "array_types", "holder_types", "metaclasses", "split_classes", "new_kinds", "outdated",
]

# Subclasses whose instances never own memory of their own: fake tensors live on the meta device, functional
# tensors (only while tracing) wrap a tensor found anyway. Every other subclass counts, torch's own included
# (torch.testing's TwoTensor, DTensor): a wrapper's optimizer state is optimizer state.
_SKIPPED_TENSOR_TYPES = (("torch._subclasses.fake_tensor", "FakeTensor"),
                         ("torch._subclasses.functional_tensor", "FunctionalTensor"))
# Modules whose memory only C++ holds: what the census reads of them is in tbmem/_torch_private_census.py.
_MODULE_HOLDERS = (("torch.jit._script", "RecursiveScriptModule"),
                   ("torch.nn.parallel.distributed", "DistributedDataParallel"),
                   ("torch.ao.nn.quantized.modules.linear", "LinearPackedParams"),
                   ("torch.ao.nn.sparse.quantized.linear", "LinearPackedParams"),
                   ("torch.ao.nn.quantized.modules.embedding_ops", "EmbeddingPackedParams"),
                   ("torch.ao.nn.quantized.modules.conv", "_ConvNd"))


def _defined(where: tuple[tuple[str, str], ...]) -> list[type]:
    """The classes named, among the modules imported now (none is imported here)."""
    found = (getattr(sys.modules.get(module), name, None) for module, name in where)
    return [cls for cls in found if isinstance(cls, type)]


def subclasses(root: type) -> set[type]:
    """``root`` and every subclass of it, recursively (``type.__subclasses__``, unbound)."""
    if _subclasses_c is not None:  # the same calls in C: a thousand types cost 90 us in Python
        return _subclasses_c(root)
    out: set[type] = {root}
    stack = [root]
    while stack:
        sub: type
        for sub in type.__subclasses__(stack.pop()):
            if sub not in out:
                out.add(sub)
                stack.append(sub)
    return out


def tensor_types() -> set[type]:
    """``torch.Tensor`` and every subclass defined now (nn.Parameter, DTensor, user subclasses), less fake
    and functional tensors."""
    skipped = set().union(*map(subclasses, _defined(_SKIPPED_TENSOR_TYPES)))
    return subclasses(torch.Tensor) - skipped


def module_types() -> set[type]:
    """Modules whose memory only C++ holds, and their subclasses: TorchScript modules (parameters and
    buffers live in the C++ module), quantized modules' packed weights, DistributedDataParallel (its
    gradient buckets), among the modules imported now."""
    return set().union(*map(subclasses, _defined(_MODULE_HOLDERS)))


def storage_types() -> set[type]:
    """``torch.UntypedStorage``, ``torch.TypedStorage`` and their subclasses (storages held without a tensor)."""
    return subclasses(torch.UntypedStorage) | subclasses(torch.TypedStorage)


def _cpp_node_types() -> frozenset[type]:
    """Python types of C++ autograd nodes, less ``AccumulateGrad`` (a leaf: nothing saved, nothing below).

    Their objects cannot be weakly referenced, and torch keeps each one alive as long as
    its node once it exists (``AccumulateGrad``'s as long as its parameter is in a graph).
    """
    functions = getattr(torch._C, "_functions", None)
    if functions is None:
        return frozenset()
    return frozenset(v for k, v in vars(functions).items() if isinstance(v, type) and k != "AccumulateGrad")


_CPP_NODE_TYPES = _cpp_node_types()


def cpp_node_types() -> frozenset[type]:
    """The types of C++ autograd nodes' Python objects (no weak references to these)."""
    return _CPP_NODE_TYPES


def node_types() -> set[type]:
    """Types of autograd nodes: those of C++ functions (``MulBackward0``, ...) and of Python ``Function``s."""
    base = getattr(torch._C, "_FunctionBase", None)
    return set(_CPP_NODE_TYPES) | (subclasses(base) if isinstance(base, type) else set())


def array_types() -> set[type]:
    """``numpy.ndarray`` and its subclasses."""
    return subclasses(np.ndarray)


def holder_types() -> set[type]:
    """Types of objects known to wrap arrays: PhiML's dense tensors, when PhiML is imported."""
    mod = sys.modules.get("phiml.math._tensors")
    dense = getattr(mod, "Dense", None) if mod is not None else None
    return set(subclasses(dense)) if isinstance(dense, type) else set()


def metaclasses() -> frozenset[type]:
    """``type`` and every metaclass defined now: each class is an instance of one of them."""
    return frozenset(subclasses(type))


@dataclass(frozen=True)
class Kinds:
    """The types one heap scan looks for.

    Attributes:
        holders: Whether PhiML's array holders are among them.
        tensor_types, storage_types, node_types, holder_types, module_types: As the functions of these names.
        types: Their union: what the scan selects.
        metaclasses: Every metaclass when these were listed (a class made since is an instance of one).
        watch: ``types | metaclasses``: what the incremental scan selects among the young objects.
    """

    holders: bool
    tensor_types: frozenset[type]
    storage_types: frozenset[type]
    node_types: frozenset[type]
    holder_types: frozenset[type]
    types: frozenset[type]
    metaclasses: frozenset[type]
    watch: frozenset[type]
    module_types: frozenset[type] = frozenset()
    module_roots: frozenset[type] = frozenset()  # those of _MODULE_HOLDERS imported when listed


def list_kinds(holders: bool) -> Kinds:
    """List the types afresh (``holders``: PhiML's dense tensors too)."""
    metas = metaclasses()
    ttypes, stypes, ntypes = frozenset(tensor_types()), frozenset(storage_types()), frozenset(node_types())
    htypes = frozenset(holder_types()) if holders else frozenset()
    roots = frozenset(_defined(_MODULE_HOLDERS))
    mtypes = frozenset(module_types())
    types = frozenset().union(ttypes, stypes, ntypes, htypes, mtypes)
    return Kinds(holders, ttypes, stypes, ntypes, htypes, types, metas, types | metas, mtypes, roots)


def split_classes(picked: list[Any], kinds: Kinds) -> tuple[list[Any], list[type]]:
    """``picked`` split into the instances of ``kinds.types`` and the classes (instances of a metaclass)."""
    of = list(map(type, picked))
    classes = list(itertools.compress(picked, map(kinds.metaclasses.__contains__, of)))
    return list(itertools.compress(picked, map(kinds.types.__contains__, of))), classes


_bases_of = vars(type)["__bases__"].__get__  # type's own: a metaclass's property cannot intercept it


def new_kinds(classes: list[type], known: dict[int, weakref.ref[type]], kinds: Kinds) -> bool:
    """Whether a class among ``classes`` that was not young at the last scan derives from a type
    looked for (or is a metaclass): then the listing may lack it. ``type.__subclasses__`` lists
    the classes naming a type among their ``__bases__``, so only those can join a listing; a class
    that derives from none (``torch.save`` makes a pickler class per call) changes nothing."""
    for cls in classes:
        ref = known.get(id(cls))
        if ref is not None and ref() is cls:
            continue
        stack, seen = [cls], {id(cls)}
        while stack:
            kind = stack.pop()
            if kind in kinds.watch:
                return True
            for base in _bases_of(kind):
                if id(base) not in seen:
                    seen.add(id(base))
                    stack.append(base)
    return False


def outdated(classes: list[type], known: dict[int, weakref.ref[type]], kinds: Kinds) -> bool:
    """Whether ``kinds`` must be listed again: a new class may be a type looked for, or PhiML's
    holder class or a module class whose memory C++ holds appeared (imported since: roots of their own)."""
    return (new_kinds(classes, known, kinds) or (kinds.holders and frozenset(holder_types()) != kinds.holder_types)
            or frozenset(_defined(_MODULE_HOLDERS)) != kinds.module_roots)
