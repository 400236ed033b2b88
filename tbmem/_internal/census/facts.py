"""What the census reads of each tensor in one pass, without making a storage object.

``t.untyped_storage()`` makes a Python object for the storage, which torch then keeps as long as
the storage: measuring 100k tensors that way leaves 100k objects behind for good, and makes every
later collection of the user's program longer. Here a tensor's storage is read where torch keeps it
(:func:`tbmem._internal._torch_private_census.storage_layout` finds and checks the offsets), together with what the
census asks of every tensor: whether it is nested, requires grad, has a ``grad_fn``, its dtype and
shape (each through torch's own getter, so that no subclass override runs; the shape where the
TensorImpl keeps it, as making a ``torch.Size`` costs more than all the rest).

One row of seven int64 per tensor: the StorageImpl address (0: the tensor has no storage), the data
address, the storage's size in bytes (negative while symbolic), flags, the index of its dtype in
:attr:`TensorFacts.dtypes` and of its shape in :attr:`TensorFacts.shapes` (-1 where ``shape`` raises),
and the tensor's ``id``. Flags: the device type | its index << 8 | resizable << 16 | made by a torch
allocator << 17 | nested << 18 | requires grad << 19 | has a grad_fn << 20 | exactly ``torch.Tensor`` << 21.
A plain dense tensor without autograd metadata is read without asking torch whether it is nested,
requires grad or has a grad_fn (it cannot). In C (``tbmem/_internal/census/_gcwalk.c``) where it was
built; :func:`_tensor_facts_py` is the Python twin (the same rows, lists and order).

Example:
    >>> import torch
    >>> from tbmem._internal.census.facts import tensor_facts
    >>> got = tensor_facts([torch.zeros(3), torch.ones(2, 2, dtype=torch.float64)])
    >>> got.rows[:, 2].tolist(), [str(d) for d in got.dtypes], got.shapes  # bytes, dtypes, shapes
    ([12, 32], ['torch.float32', 'torch.float64'], [(3,), (2, 2)])
"""

from __future__ import annotations

import ctypes
from typing import Any, NamedTuple

import numpy as np
import torch

from tbmem._internal import _torch_private_census as tpc

try:  # in C, where an extension built from this _gcwalk.c is
    from tbmem._internal.census._gcwalk import storage_facts as _storage_facts_c
    from tbmem._internal.census._gcwalk import tensor_facts as _tensor_facts_c
except ImportError:
    _storage_facts_c = _tensor_facts_c = None

__all__ = ["TensorFacts", "tensor_facts", "storage_facts", "device_of", "RESIZABLE", "ALLOCATED", "NESTED",
           "REQUIRES_GRAD", "HAS_GRAD_FN", "PLAIN", "impl_of"]

RESIZABLE, ALLOCATED, NESTED, REQUIRES_GRAD, HAS_GRAD_FN, PLAIN = (1 << k for k in range(16, 22))
_MASK = (1 << 64) - 1  # addresses read as signed words, compared unsigned
#: ``t._cdata`` through torch's own getter: the address of the tensor's C++ TensorImpl.
impl_of = tpc.tensor_impl_getter()


def _descriptor(name: str) -> Any:
    for klass in torch.Tensor.__mro__:
        if name in vars(klass):
            return vars(klass)[name]
    raise AttributeError(name)


# torch's own descriptors: the C walk calls their getters directly; the Python twin through __get__
_DESCRIPTORS = (*map(_descriptor, ("_cdata", "is_nested", "requires_grad", "grad_fn", "dtype", "shape")), torch.Tensor)
_GETTERS = tuple(d.__get__ for d in _DESCRIPTORS[:-1])
_COLUMNS = 7


class TensorFacts(NamedTuple):
    """What :func:`tensor_facts` read: ``rows[i]`` is tensor ``i``'s row (see the module docstring).

    Example:
        >>> import torch
        >>> got = tensor_facts([torch.zeros(2, 3)])
        >>> got.shapes[got.rows[0, 5]], bool(got.rows[0, 3] & RESIZABLE)
        ((2, 3), True)
    """

    rows: np.ndarray  # (n, 6) int64
    dtypes: list[torch.dtype]
    shapes: list[tuple[int, ...]]


def tensor_facts(tensors: list[Any]) -> TensorFacts | None:
    """The rows of ``tensors``, or None where torch's layout could not be checked (then nothing is read)."""
    layout = tpc.storage_layout()
    if layout is None:
        return None
    if _tensor_facts_c is not None:
        raw, dtypes, shapes = _tensor_facts_c(tensors, _DESCRIPTORS, tuple(layout))
        return TensorFacts(np.frombuffer(raw, dtype=np.int64).reshape(-1, _COLUMNS), dtypes, shapes)
    return _tensor_facts_py(tensors, layout)


def _tensor_facts_py(tensors: list[Any], layout: tpc.StorageLayout) -> TensorFacts:
    impl, nested_of, requires_of, grad_fn_of, dtype_of, shape_of = _GETTERS
    rows: list[tuple[int, ...]] = []
    dtypes: list[torch.dtype] = []
    shapes: list[tuple[int, ...]] = []
    dtype_index: dict[Any, int] = {}
    shape_index: dict[Any, int] = {}
    for t in tensors:
        address = impl(t)
        dense = bool(address) and _word(address) & _MASK == layout.dense
        bare = dense and _word(address + layout.autograd) == 0
        nested = False if dense else nested_of(t)
        requires, grad_fn = (False, None) if bare else (requires_of(t), grad_fn_of(t))
        dtype = dtype_of(t)
        shape = _sizes(address, layout) if address else None
        if shape is None:
            try:
                shape = shape_of(t)
            except Exception:  # noqa: BLE001 - a nested tensor has no single shape
                shape = None
        storage, data, nbytes, flags = _row(_word(address + layout.storage) if address else 0, layout)
        flags |= ((nested is True) << 18 | (requires is True) << 19 | (grad_fn is not None) << 20
                  | (type(t) is torch.Tensor) << 21)
        d = dtype_index.get(dtype)
        if d is None:
            d = dtype_index[dtype] = len(dtypes)
            dtypes.append(dtype)
        s = -1
        if shape is not None:
            s = shape_index.get(shape, -1)
            if s == -1:
                s = shape_index[shape] = len(shapes)
                shapes.append(tuple(shape))
        rows.append((storage, data, nbytes, flags, d, s, id(t)))
    return TensorFacts(np.asarray(rows, dtype=np.int64).reshape(-1, _COLUMNS), dtypes, shapes)


def storage_facts(addresses: list[int]) -> np.ndarray | None:
    """Rows ``(StorageImpl address, data address, nbytes, flags)`` of StorageImpl addresses (a storage
    object's ``_cdata``), or None without torch's layout."""
    layout = tpc.storage_layout()
    if layout is None:
        return None
    if _storage_facts_c is not None:
        return np.frombuffer(_storage_facts_c(addresses, tuple(layout)), dtype=np.int64).reshape(-1, 4)
    return np.asarray([_row(a, layout) for a in addresses], dtype=np.int64).reshape(-1, 4)


def _sizes(impl: int, layout: tpc.StorageLayout) -> tuple[int, ...] | None:
    """The sizes where the TensorImpl keeps them (the twin of ``_gcwalk.c``'s), None where implausible."""
    at = impl + layout.sizes
    dims = _word(at)
    if not 0 <= dims <= 64:
        return None
    sizes = at + 8 if dims <= layout.inline_sizes else _word(at + 8)
    return tuple(_word(sizes + 8 * d) for d in range(dims)) if sizes else None


def _word(address: int) -> int:
    return ctypes.c_int64.from_address(address).value


def _byte(address: int) -> int:
    return ctypes.c_uint8.from_address(address).value


def _row(storage: int, layout: tpc.StorageLayout) -> tuple[int, int, int, int]:
    """The Python twin of ``_gcwalk.c``'s ``read_storage``."""
    if storage == 0:
        return 0, 0, 0, 0
    data, context = _word(storage + layout.data), _word(storage + layout.context)
    flags = (_byte(storage + layout.device) | _byte(storage + layout.device + 1) << 8
             | (_byte(storage + layout.resizable) & 1) << 16 | (context == data) << 17)
    return storage, data, _word(storage + layout.nbytes), flags


_DEVICES: dict[int, str | None] = {}


def device_of(flags: int) -> str | None:
    """The device name of a row's flags (``"cpu"``, ``"cuda:0"``); None for a type torch.device does not know."""
    code = int(flags) & 0xFFFF
    name = _DEVICES.get(code, "")
    if name == "":
        kind = tpc.device_names().get(code & 0xFF)
        index = (code >> 8) - 256 if code >> 8 > 127 else code >> 8
        name = _DEVICES[code] = None if kind is None else str(
            torch.device(kind, index) if index >= 0 else torch.device(kind))
    return name
