"""The one module that touches PyTorch's private or version-dependent memory APIs.

Everything else in tbmem goes through these functions, so a PyTorch upgrade
that moves ``torch.cuda.memory._record_memory_history``, ``_snapshot`` or the
out-of-memory observer breaks in one place, behind a feature check, and
degrades to "feature unavailable" instead of an exception in training.

None of these functions initialise CUDA: when CUDA is not initialised they
return ``None``/``False`` instead of reading the device.

Example:
    >>> from tbmem import _torch_private as tp
    >>> tp.cuda_ready()  # False on a machine without an initialised GPU
    False
"""

from __future__ import annotations

import ctypes
import pickle
import warnings
from contextlib import AbstractContextManager, nullcontext
from typing import Any, BinaryIO, Callable, Iterator, NamedTuple

import torch

__all__ = [
    "OutOfMemoryError",
    "cuda_ready",
    "cuda_memory_stats",
    "cuda_mem_get_info",
    "cuda_current_device",
    "reset_cuda_peaks",
    "synchronize_if_pending",
    "has_memory_history",
    "record_memory_history",
    "stop_memory_history",
    "cuda_snapshot",
    "dump_snapshot_pickle",
    "memory_viz_trace_plot",
    "cuda_annotate",
    "attach_oom_observer",
    "disable_torch_function_subclass",
    "saved_tensors_of",
    "saved_tensor_attrs",
    "saved_tensor_fields",
    "read_saved_tensors",
    "SAVED_TENSOR_VALUE",
    "NODE_EDGES",
    "current_dispatch_mode",
    "op_callable",
    "eval_frame_setter",
    "graph_task_id_getter",
    "autocast_cache_dtype",
    "StorageLayout",
    "storage_layout",
    "tensor_impl_getter",
    "device_names",
    "mkldnn_nbytes",
    "layout_problem",
]

#: torch.OutOfMemoryError since 2.5; torch.cuda.OutOfMemoryError before.
OutOfMemoryError: type[BaseException] = getattr(
    torch, "OutOfMemoryError", getattr(torch.cuda, "OutOfMemoryError", RuntimeError)
)


def cuda_ready() -> bool:
    """True when CUDA is available *and* already initialised by the user's code.

    Reading the allocator of an uninitialised CUDA would create a context
    (hundreds of MB, seconds): monitoring must never do that.
    """
    # is_initialized() implies is_available() and is a flag read; is_available() queries the
    # driver (~15 us), and this check runs on every monitored batch.
    return bool(torch.cuda.is_initialized())


def cuda_current_device() -> int | None:
    """The current CUDA device index, or None when CUDA is not initialised."""
    return torch.cuda.current_device() if cuda_ready() else None


def cuda_memory_stats(device: int) -> dict[str, Any] | None:
    """``torch.cuda.memory_stats(device)`` or None when CUDA is not initialised."""
    if not cuda_ready():
        return None
    return torch.cuda.memory_stats(device)


def cuda_mem_get_info(device: int) -> tuple[int, int] | None:
    """(free, total) bytes of ``device`` as the driver sees them, or None."""
    if not cuda_ready():
        return None
    free, total = torch.cuda.mem_get_info(device)
    return int(free), int(total)


def reset_cuda_peaks(device: int) -> None:
    """Reset the allocator's peak counters (affects every other reader of the peaks)."""
    if cuda_ready():
        torch.cuda.reset_peak_memory_stats(device)


def synchronize_if_pending(device: int | None = None) -> None:
    """Wait for queued CUDA work so that a wall-clock timing includes it."""
    if cuda_ready():
        torch.cuda.synchronize(device)


def _memory_module() -> Any:
    return getattr(torch.cuda, "memory", None)


def has_memory_history() -> bool:
    """Whether this torch can record allocator history (``_record_memory_history``)."""
    mod = _memory_module()
    return mod is not None and hasattr(mod, "_record_memory_history") and hasattr(mod, "_snapshot")


def record_memory_history(*, stacks: str = "python", max_entries: int = 100_000) -> bool:
    """Start recording CUDA allocator history; False when unsupported or CUDA is not ready."""
    if not (cuda_ready() and has_memory_history()):
        return False
    _memory_module()._record_memory_history(enabled="all", stacks=stacks, max_entries=max_entries)
    return True


def stop_memory_history() -> None:
    """Stop recording CUDA allocator history (no-op when not recording or unsupported)."""
    if cuda_ready() and has_memory_history():
        _memory_module()._record_memory_history(enabled=None)


def cuda_snapshot() -> dict[str, Any] | None:
    """The allocator snapshot dict (segments + device_traces), or None when unavailable."""
    if not (cuda_ready() and has_memory_history()):
        return None
    return _memory_module()._snapshot()


def dump_snapshot_pickle(snapshot: dict[str, Any], path: str | BinaryIO) -> None:
    """Write a snapshot as pickle protocol 4, the format PyTorch's memory_viz reads.

    ``path`` is a file name or an open binary file (for atomic writes through a temp file).
    """
    if hasattr(path, "write"):
        pickle.dump(snapshot, path, protocol=4)
        return
    with open(path, "wb") as fh:
        pickle.dump(snapshot, fh, protocol=4)


def cuda_annotate(label: str) -> bool:
    """Put ``label`` in the CUDA memory history (``external_annotations``, torch >= 2.5 records the
    start and end of every ``record_function`` while history is on); False when CUDA is not ready."""
    if not cuda_ready():
        return False
    record_function = getattr(getattr(torch, "autograd", None), "profiler", None)
    record_function = getattr(record_function, "record_function", None)
    if record_function is None:
        return False
    with record_function(label):
        pass
    return True


def memory_viz_trace_plot(snapshot: dict[str, Any]) -> str | None:
    """PyTorch's own ``trace_plot`` HTML for a snapshot dict, or None when this torch lacks it.

    Note: that page loads its viewer from a CDN, so it needs network access to display.
    """
    try:
        from torch.cuda import _memory_viz
    except ImportError:
        return None
    trace_plot = getattr(_memory_viz, "trace_plot", None)
    return None if trace_plot is None else str(trace_plot(snapshot))


def attach_oom_observer(callback: Callable[[int, int, int, int], None]) -> bool:
    """Call ``callback(device, alloc, device_allocated, device_free)`` on a CUDA OOM.

    Returns False when this torch has no observer hook or CUDA is not ready.
    """
    hook = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
    if hook is None or not cuda_ready():
        return False
    hook(callback)
    return True


def disable_torch_function_subclass() -> AbstractContextManager[object]:
    """A context in which tensor subclasses' ``__torch_function__`` overrides do not run.

    The census reads storages of user subclasses (phiml wraps native tensors); their overrides
    must not run, or recurse, while tbmem measures.
    """
    ctx = getattr(torch._C, "DisableTorchFunctionSubclass", None)
    return ctx() if ctx is not None else nullcontext()


def current_dispatch_mode() -> Any:
    """The innermost ``TorchDispatchMode`` entered on this thread, or None (also when unknowable)."""
    try:
        from torch.utils._python_dispatch import _get_current_dispatch_mode
    except ImportError:
        return None
    return _get_current_dispatch_mode()


def op_callable(func: Any) -> Callable[..., Any]:
    """What calling an ``OpOverload`` calls (its C++ operator), without ``OpOverload.__call__``'s frame."""
    return getattr(func, "_op", func)


def eval_frame_setter() -> Callable[[Any], Any] | None:
    """``set_eval_frame``: sets Dynamo's frame callback and returns the previous one; None without Dynamo.

    ``TorchDispatchMode`` wraps ``__torch_dispatch__`` in ``torch._disable_dynamo`` (five Python
    calls per operator) so that ``torch.compile`` never traces a mode's own frames; a mode can do
    the same with two calls to this.
    """
    try:
        from torch._C._dynamo.eval_frame import set_eval_frame
    except ImportError:
        return None
    return set_eval_frame


def graph_task_id_getter() -> Callable[[], int]:
    """A function returning the running backward pass's graph task id, -1 outside backward."""
    return getattr(torch._C, "_current_graph_task_id", lambda: -1)


_SAVED_ATTRS: dict[type, tuple[str, ...]] = {}
_SEQUENCES = (tuple, list)


def saved_tensor_attrs(node_type: type) -> tuple[str, ...]:
    """The ``_raw_saved_*`` attributes of an autograd node type (empty: it saves no tensor)."""
    attrs = _SAVED_ATTRS.get(node_type)
    if attrs is None:
        attrs = _SAVED_ATTRS[node_type] = tuple(n for n in dir(node_type) if n.startswith("_raw_saved_"))
    return attrs


_SAVED_FIELDS: dict[type, tuple[tuple[str, str], ...]] = {}
#: The attribute of a ``SavedTensor`` giving its tensor without running unpack hooks (None once released).
SAVED_TENSOR_VALUE = "data"
#: The attribute of an autograd node listing ``(next node, input index)`` pairs.
NODE_EDGES = "next_functions"


def saved_tensor_fields(node_type: type) -> tuple[tuple[str, str], ...]:
    """``(attribute, label)`` of each ``_raw_saved_*`` attribute of a node type (``("_raw_saved_self",
    "saved_self")``)."""
    fields = _SAVED_FIELDS.get(node_type)
    if fields is None:
        fields = _SAVED_FIELDS[node_type] = tuple((attr, attr[5:]) for attr in saved_tensor_attrs(node_type))
    return fields


def read_saved_tensors(node: Any, attrs: tuple[str, ...]) -> list[tuple[torch.Tensor, str]]:
    """:func:`saved_tensors_of` for a node whose type has ``attrs`` (:func:`saved_tensor_attrs`), as a list."""
    out = []
    for attr in attrs:
        try:
            value = getattr(node, attr)
        except RuntimeError:  # released or never saved
            continue
        if type(value) in _SEQUENCES:
            for saved in value:
                data = getattr(saved, SAVED_TENSOR_VALUE, None)
                if data is not None:
                    out.append((data, attr[5:]))
        else:
            data = getattr(value, SAVED_TENSOR_VALUE, None)
            if data is not None:
                out.append((data, attr[5:]))
    return out


def saved_tensors_of(node: Any) -> Iterator[tuple[torch.Tensor, str]]:
    """``(tensor, attribute)`` for each tensor an autograd node saved for backward.

    Reads the private ``_raw_saved_*`` attributes (``SavedTensor.data``), which unlike
    ``_saved_*`` do not run saved-tensor unpack hooks (those may copy offloaded tensors back
    to the device). A graph already run backward has released them: nothing is yielded.
    """
    attrs = saved_tensor_attrs(type(node))
    if attrs:
        yield from read_saved_tensors(node, attrs)


def autocast_cache_dtype(device_type: str) -> torch.dtype | None:
    """The dtype of autocast's weight-cast cache on ``device_type``, or None when that cache is not in use.

    Inside an autocast region with the cache enabled (the default), autocast keeps a
    low-precision copy of each float32 leaf tensor requiring grad that an autocast op cast,
    until the region ends. torch offers no way to read that cache.
    """
    try:
        enabled = torch.is_autocast_enabled(device_type)
        cached = torch.is_autocast_cache_enabled()
        dtype = torch.get_autocast_dtype(device_type)
    except (AttributeError, TypeError, RuntimeError):  # torch < 2.4 names these per device
        if device_type != "cpu" or not hasattr(torch, "is_autocast_cpu_enabled"):
            return None
        enabled, cached = torch.is_autocast_cpu_enabled(), torch.is_autocast_cache_enabled()
        dtype = torch.get_autocast_cpu_dtype()
    return dtype if enabled and cached else None


class StorageLayout(NamedTuple):
    """Byte offsets of what the census reads in torch's C++ objects, found and checked by :func:`storage_layout`."""

    storage: int  # TensorImpl -> its StorageImpl pointer
    data: int  # StorageImpl -> the data pointer
    context: int  # StorageImpl -> the data pointer's context: the data itself where a torch allocator made it
    nbytes: int  # StorageImpl -> size in bytes (int64; negative while symbolic)
    device: int  # StorageImpl -> device type (int8), then device index (int8)
    resizable: int  # StorageImpl -> the resizable flag (one byte)
    sizes: int  # TensorImpl -> number of dimensions (int64), then the sizes, inline up to ``inline_sizes`` dims,
    inline_sizes: int  # else a pointer to them


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
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                _layout = _probe_layout()
        except (LookupError, AttributeError, TypeError, ValueError, RuntimeError, ImportError) as exc:
            _layout, layout_problem = None, f"{type(exc).__name__}: {exc}"
    return _layout  # type: ignore[return-value]


def _probe_layout() -> StorageLayout:
    import numpy as np

    owned = [torch.empty(n, dtype=torch.uint8) for n in (24, 40, 72, 136, 520)]
    borrowed = [torch.from_numpy(np.empty(n, dtype=np.uint8)) for n in (56, 104, 200)]  # not resizable
    meta = torch.empty(12, dtype=torch.uint8, device="meta")
    samples = owned + borrowed
    impl_of, storage_of = tensor_impl_getter(), torch._C._storage_address
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
    return StorageLayout(storage, 8 * data, 8 * context, 8 * nbytes, device, resizable, sizes, inline)


def _probe_sizes(impl_of: Callable[[Any], int]) -> tuple[int, int]:
    """Where a TensorImpl keeps its sizes: a dimension count, then the sizes inline up to some number of
    dimensions (5 in torch 2.x), else a pointer to them; checked on shapes of 0 to 7 dimensions."""
    shapes = [(), (7,), (3, 5), (2, 3, 4), (2, 3, 4, 5), (2, 3, 4, 5, 6), (2, 3, 4, 5, 6, 7), (3, 2, 2, 2, 2, 2, 2)]
    samples = [torch.empty(shape, dtype=torch.uint8) for shape in shapes] + [torch.empty(4, 6).t()]
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
        for name, code in getattr(torch._C._autograd, "DeviceType", {}).__members__.items():
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
