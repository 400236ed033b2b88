"""What the census reads of torch's C++ objects and private APIs (the census's part of ``_torch_private``).

Like :mod:`tbmem._internal._torch_private`, this is the only place that touches what torch does not promise to
keep: the byte layout of ``TensorImpl`` and ``StorageImpl`` (found and checked here on tensors made for
the purpose, see :func:`storage_layout`), the parameters of TorchScript modules, the packed weights of
quantized modules, DDP's gradient buckets and the oneDNN tensors' sizes. A torch where any of it moved
makes the function concerned return None, and the census says what it then could not see.

Example:
    >>> from tbmem._internal import _torch_private_census as tpc
    >>> layout = tpc.storage_layout()
    >>> layout is None or layout.storage > 0
    True
"""

from __future__ import annotations

import ctypes
import warnings
from typing import Any, Callable, NamedTuple

import torch

__all__ = ["StorageLayout", "storage_layout", "layout_problem", "tensor_impl_getter", "device_names",
           "mkldnn_nbytes", "packed_weights", "script_name", "ddp_bucket_bytes"]


class StorageLayout(NamedTuple):
    """Byte offsets of what the census reads in torch's C++ objects, found and checked by :func:`storage_layout`.

    Example:
        >>> layout = storage_layout()
        >>> layout is None or (layout.inline_sizes >= 1 and layout.nbytes != layout.data)
        True
    """

    storage: int  # TensorImpl -> its StorageImpl pointer
    data: int  # StorageImpl -> the data pointer
    context: int  # StorageImpl -> the data pointer's context: the data itself where a torch allocator made it
    nbytes: int  # StorageImpl -> size in bytes (int64; negative while symbolic)
    device: int  # StorageImpl -> device type (int8), then device index (int8)
    resizable: int  # StorageImpl -> the resizable flag (one byte)
    sizes: int  # TensorImpl -> number of dimensions (int64), then the sizes, inline up to ``inline_sizes`` dims,
    inline_sizes: int  # else a pointer to them
    autograd: int  # TensorImpl -> its autograd metadata (null: no grad required, no grad_fn)
    dense: int  # the vtable address of a plain dense TensorImpl (another one: nested, sparse, a wrapper's)


_LAYOUT_WORDS = 10  # a StorageImpl is at least 88 bytes in every torch 2.x; nothing is read past this
_layout: StorageLayout | None | bool = False  # False: not probed yet
#: Why :func:`storage_layout` returned None ("" while it did not).
layout_problem = ""


def tensor_impl_getter() -> Callable[[Any], int]:
    """``t._cdata`` (the address of the C++ TensorImpl) through torch's own getter: no subclass can intercept it."""
    return vars(torch._C.TensorBase)["_cdata"].__get__


def _word(address: int) -> int:
    return ctypes.c_uint64.from_address(address).value


def _byte(address: int) -> int:
    return ctypes.c_uint8.from_address(address).value


def _only(candidates: list[int]) -> int:
    if len(candidates) != 1:
        raise LookupError(f"{len(candidates)} candidate offsets")
    return candidates[0]


def storage_layout() -> StorageLayout | None:
    """Where a tensor's storage, its data pointer, size, device and flags sit in torch's C++ objects, or None.

    Measuring a tensor through ``untyped_storage()`` makes a Python object for its storage, which torch
    then keeps as long as the storage: one more gc-tracked object per storage measured. The census reads
    the same facts from the C++ objects instead (``TensorImpl::storage_``, ``StorageImpl``'s data pointer,
    its context, ``size_bytes_``, device and ``resizable_``), at offsets found here on tensors made for the
    purpose, whose facts are known (three or more samples per offset; every offset must be the only one
    that fits). Where that check fails (another torch, another ABI) this returns None and the census
    measures through the storage objects: slower, and the objects stay, but the same result.
    """
    global _layout, layout_problem
    if _layout is False:
        if _mode_active():  # a dispatch mode (FakeTensorMode while tracing) would make the samples: not now
            return None
        try:
            # The samples need autograd metadata (a leaf requiring grad, a graph's output): a first census
            # inside torch.no_grad() or inference_mode (an evaluation loop) made none, and the census then
            # measured through storage objects for the rest of the process.
            with warnings.catch_warnings(), torch.inference_mode(False), torch.enable_grad():
                warnings.simplefilter("ignore")
                _layout = _probe_layout()
        except (LookupError, AttributeError, TypeError, ValueError, RuntimeError, ImportError) as exc:
            _layout, layout_problem = None, f"{type(exc).__name__}: {exc}"
    return _layout  # type: ignore[return-value]


def _mode_active() -> bool:
    try:
        from torch.utils._python_dispatch import _get_current_dispatch_mode
    except ImportError:
        return False
    return _get_current_dispatch_mode() is not None


def _probe_layout() -> StorageLayout:
    import numpy as np

    owned = [torch.empty(n, dtype=torch.uint8, device="cpu") for n in (24, 40, 72, 136, 520)]
    borrowed = [torch.from_numpy(np.empty(n, dtype=np.uint8)) for n in (56, 104, 200)]  # not resizable
    meta = torch.empty(12, dtype=torch.uint8, device="meta")
    samples = owned + borrowed
    impl_of, storage_of = tensor_impl_getter(), torch._C._storage_address  # type: ignore[attr-defined]
    storage = 8 * _only([w for w in range(1, 8)
                         if all(_word(impl_of(t) + 8 * w) == storage_of(t) for t in [*samples, meta])])
    stores = [t.untyped_storage() for t in samples]  # the facts to compare with (these objects die with the probe)
    words = [[_word(storage_of(t) + 8 * i) for i in range(_LAYOUT_WORDS)] for t in samples]
    meta_words = [_word(storage_of(meta) + 8 * i) for i in range(_LAYOUT_WORDS)]
    data = _only([i for i in range(2, _LAYOUT_WORDS) if all(w[i] == s.data_ptr() for w, s in zip(words, stores))])
    context = _only([i for i in range(2, _LAYOUT_WORDS) if i != data and all(
        (w[i] == s.data_ptr()) == (k < len(owned)) for k, (w, s) in enumerate(zip(words, stores)))])
    nbytes = _only([i for i in range(2, _LAYOUT_WORDS) if meta_words[i] == 12 and all(
        w[i] == s.nbytes() for w, s in zip(words, stores))])
    meta_code = torch._C._autograd.DeviceType.Meta.value
    cpu_code = torch._C._autograd.DeviceType.CPU.value

    def bytes_at(t: torch.Tensor, b: int) -> tuple[int, int]:
        return _byte(storage_of(t) + b), _byte(storage_of(t) + b + 1)

    top = 8 * _LAYOUT_WORDS - 1
    device = _only([b for b in range(16, top) if bytes_at(meta, b) == (meta_code, 0xFF) and all(
        bytes_at(t, b) == (cpu_code, 0xFF) for t in samples)])
    resizable = _only([b for b in range(16, top) if all(
        _byte(storage_of(t) + b) == int(s.resizable()) for t, s in zip(samples, stores))])
    if not all(stores[k].resizable() for k in range(len(owned))) or any(s.resizable() for s in stores[len(owned):]):
        raise LookupError("the samples' resizable flags are not as expected")
    sizes, inline = _probe_sizes(impl_of)
    autograd, dense = _probe_autograd(impl_of, storage)
    return StorageLayout(storage, 8 * data, 8 * context, 8 * nbytes, device, resizable, sizes, inline, autograd, dense)


def _probe_autograd(impl_of: Callable[[Any], int], storage: int) -> tuple[int, int]:
    """Where a TensorImpl points to its autograd metadata (null on a fresh tensor, set on one requiring grad
    and on a graph's output), and the vtable shared by plain dense TensorImpls (not by a nested one's)."""
    fresh = [torch.empty(n, device="cpu") for n in (3, 5, 8)]
    leaf = torch.ones(4, device="cpu", requires_grad=True)
    tracked = [leaf, leaf * 2, torch.zeros(6, device="cpu", requires_grad=True)]
    word = _only([w for w in range(1, 8) if 8 * w != storage and all(_word(impl_of(t) + 8 * w) == 0 for t in fresh)
                  and all(_word(impl_of(t) + 8 * w) != 0 for t in tracked)])
    vtables = {_word(impl_of(t)) for t in fresh + tracked}
    nested = torch.nested.nested_tensor([torch.ones(2, device="cpu"), torch.ones(3, device="cpu")])
    if len(vtables) != 1 or _word(impl_of(nested)) in vtables:
        raise LookupError("plain tensors do not share one vtable, or a nested one has it too")
    return 8 * word, vtables.pop()


def _probe_sizes(impl_of: Callable[[Any], int]) -> tuple[int, int]:
    """Where a TensorImpl keeps its sizes: a dimension count, then the sizes inline up to some number of
    dimensions (5 in torch 2.x), else a pointer to them; checked on shapes of 0 to 7 dimensions."""
    shapes = [(), (7,), (3, 5), (2, 3, 4), (2, 3, 4, 5), (2, 3, 4, 5, 6), (2, 3, 4, 5, 6, 7), (3, 2, 2, 2, 2, 2, 2)]
    samples = [torch.empty(shape, dtype=torch.uint8, device="cpu") for shape in shapes]
    samples.append(torch.empty(4, 6, device="cpu").t())
    shapes.append((6, 4))

    def inline_at(t: torch.Tensor, w: int, shape: tuple[int, ...]) -> bool:
        base = impl_of(t) + 8 * w
        return _word(base) == len(shape) and all(_word(base + 8 * (i + 1)) == n for i, n in enumerate(shape))

    small = [(t, s) for t, s in zip(samples, shapes) if len(s) <= 5]
    word = _only([w for w in range(3, 20) if all(inline_at(t, w, s) for t, s in small)])
    inline = max(n for n in range(1, 8) if all(inline_at(t, word, s) for t, s in zip(samples, shapes) if len(s) <= n))
    for t, shape in zip(samples, shapes):
        if len(shape) > inline:
            outside = _word(impl_of(t) + 8 * word + 8)
            if _word(impl_of(t) + 8 * word) != len(shape) or [_word(outside + 8 * i) for i in range(len(shape))] != list(
                    shape):
                raise LookupError("the sizes of a tensor of many dimensions are not where expected")
    return 8 * word, inline


_DEVICE_NAMES: dict[int, str] | None = None


def device_names() -> dict[int, str]:
    """torch's ``DeviceType`` codes -> the device type's name (``0 -> "cpu"``), for the types torch.device knows."""
    global _DEVICE_NAMES
    if _DEVICE_NAMES is None:
        names: dict[int, str] = {}
        # an enum of torch's C++ API: absent from its stubs, and from builds without autograd's bindings
        members = getattr(getattr(torch._C._autograd, "DeviceType", None), "__members__", {})
        for name, code in members.items():
            kind = "privateuseone" if name == "PrivateUse1" else name.lower()
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # torch.device("mkldnn") warns that it is deprecated
                    names[int(code.value)] = torch.device(kind).type
            except (RuntimeError, ValueError, TypeError):
                continue
        _DEVICE_NAMES = names
    return _DEVICE_NAMES


def mkldnn_nbytes(t: torch.Tensor) -> int | None:
    """Bytes an MKL-DNN (oneDNN) tensor holds (it has no storage), or None where torch cannot say."""
    op = getattr(getattr(torch.ops, "mkldnn", None), "_nbytes", None)
    if op is None:
        return None
    try:
        return int(op(t))
    except (RuntimeError, TypeError):
        return None


def packed_weights(module: Any) -> list[tuple[str, torch.Tensor]]:
    """A quantized module's weights, which it keeps packed in a C++ object Python cannot measure:
    ``[("weight", w), ("bias", b)]`` through the module's own unpacking (``_weight_bias``, ``_weight``);
    [] where it has none. The weight is a copy the size of the packed one (give or take its padding);
    the bias is the tensor the module holds."""
    kind = type(module)
    for attr in ("_weight_bias", "_weight"):
        unpack = getattr(kind, attr, None)
        if callable(unpack):
            got = unpack(module)
            parts = got if isinstance(got, tuple) else (got,)
            return [(name, t) for name, t in zip(("weight", "bias"), parts) if isinstance(t, torch.Tensor)]
    return []


def script_name(module: Any) -> str:
    """The name a TorchScript module was scripted from (``"Sequential"``)."""
    return str(getattr(module, "original_name", type(module).__name__))


def ddp_bucket_bytes(module: Any) -> int | None:
    """Bytes of a DistributedDataParallel module's gradient buckets that no gradient views: all of them
    with ``gradient_as_bucket_view=False`` (the buckets are copies), or while a gradient is None with
    ``True`` (before the first backward); None where torch does not report them. The buckets are C++
    tensors of the reducer; Python sees only their sizes, in DDP's logging data."""
    data_of = getattr(module, "_get_ddp_logging_data", None)
    if data_of is None:
        return None
    data = data_of()
    sizes = str(data.get("bucket_sizes", "")).replace(" ", "")
    if not sizes:
        return None
    total = sum(int(part) for part in sizes.split(",") if part)
    if not data.get("gradient_as_bucket_view"):
        return total
    params = [p for p in module.parameters() if p.requires_grad]
    return total if any(p.grad is None for p in params) else 0
