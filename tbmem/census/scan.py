"""Turning what the heap scan found into memory blocks; the autograd-graph walk.

Nothing here categorises. The heap scan itself is :mod:`tbmem.census.heap`, the walks
below Python objects (frames' locals, packed saved tensors, numpy arrays)
:mod:`tbmem.census.walk`. As there, foreign objects are looked at only through
``type(obj)``.

Example:
    >>> import torch
    >>> from tbmem.census import scan
    >>> base = torch.zeros(64, 64)
    >>> [s.nbytes for s in scan.tensor_storages(base[:2].t())]  # a view occupies its whole base
    [16384]
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, NamedTuple

import numpy as np
import torch

from tbmem import _torch_private as tp

try:  # the graph walk's loop in C (tbmem/census/_gcwalk.c), where it was built
    from tbmem.census._gcwalk import walk_graph as _walk_graph_c
except ImportError:
    _walk_graph_c = None

__all__ = [
    "Storage", "NoStorageError", "device_name", "tensor_attr", "tensor_storages", "storage_key",
    "storage_storages", "array_storage", "walk_autograd",
]


class Storage(NamedTuple):
    """One memory block a tensor or array occupies."""

    key: tuple[str, int]  # (device, address): equal keys are the same memory
    nbytes: int
    dtype: str
    device: str
    shape: tuple[int, ...] = ()
    foreign: bool = False  # CPU memory torch did not allocate (from_numpy, frombuffer, DLPack, mmap)


_tuple_new = tuple.__new__  # Storage(...) without NamedTuple's Python-level __new__ (a third of a lookup's cost)


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
    name = _DTYPE_NAMES.get(dtype) or _dtype_name(dtype)
    return [_tuple_new(Storage, ((dev, address), nbytes, name, dev, tuple(_shape(t)), foreign))]


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
    if _walk_graph_c is not None:  # the same reads in the same order, 0.4 ms -> 0.1 ms for a step's graph
        yield from _walk_graph_c(stack, visited, keep, errors, tp.saved_tensor_fields, tp.SAVED_TENSOR_VALUE,
                                 tp.NODE_EDGES)
        return
    attrs_of, read = tp.saved_tensor_attrs, tp.read_saved_tensors
    types_attrs: dict[type, tuple[str, ...]] = {}
    seen, remember, push = visited.add, keep.append, stack.extend
    # One pass per node, no generator or f-string unless it saved something: after backward (the
    # usual census point) every saved tensor of the graph was released, and the walk is just its nodes.
    while stack:
        node = stack.pop()
        if id(node) in visited:
            continue
        seen(id(node))
        remember(node)
        kind = type(node)
        attrs = types_attrs.get(kind)
        if attrs is None:
            attrs = types_attrs[kind] = attrs_of(kind)
        try:
            saved = read(node, attrs) if attrs else None
            nexts = [n for n, _ in node.next_functions if n is not None]
        except Exception as exc:  # noqa: BLE001 - one odd node (a custom Function's) must not stop the walk
            errors.append(exc)
            continue
        if saved:
            name = kind.__name__
            for data, attr in saved:
                yield data, f"{name}.{attr}"
        push(nexts)
