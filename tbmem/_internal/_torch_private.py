"""The one module that touches PyTorch's private or version-dependent memory APIs.

Everything else in tbmem goes through these functions, so a PyTorch upgrade
that moves ``torch.cuda.memory._record_memory_history``, ``_snapshot`` or the
out-of-memory observer breaks in one place, behind a feature check, and
degrades to "feature unavailable" instead of an exception in training.

None of these functions initialise CUDA: when CUDA is not initialised they
return ``None``/``False`` instead of reading the device.

Example:
    >>> from tbmem._internal import _torch_private as tp
    >>> tp.cuda_ready()  # False on a machine without an initialised GPU
    False
"""

from __future__ import annotations

import inspect
import pickle
import time
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any, BinaryIO, Callable, Iterator, NamedTuple

import torch

__all__ = [
    "profiler_running",
    "OutOfMemoryError",
    "cuda_ready",
    "cuda_memory_stats",
    "FlatStats",
    "cuda_mem_get_info",
    "cuda_current_device",
    "reset_cuda_peaks",
    "synchronize_if_pending",
    "has_memory_history",
    "record_memory_history",
    "stop_memory_history",
    "cuda_snapshot",
    "dump_snapshot_pickle",
    "cuda_segments",
    "private_pools_reserved",
    "private_pool_allocated",
    "cuda_pinned_host_bytes",
    "cuda_is_integrated",
    "xpu_available",
    "mps_available",
    "xpu_ready",
    "xpu_memory",
    "reset_xpu_peaks",
    "xpu_has_memory_history",
    "xpu_record_memory_history",
    "xpu_stop_memory_history",
    "xpu_snapshot",
    "xpu_current_device",
    "mps_memory",
    "memory_viz_trace_plot",
    "cuda_annotate",
    "attach_oom_observer",
    "OomRequest",
    "watch_oom_requests",
    "take_oom_request",
    "nvml_device_index",
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
]

#: torch.OutOfMemoryError since 2.5; torch.cuda.OutOfMemoryError before.
OutOfMemoryError: type[BaseException] = getattr(
    torch, "OutOfMemoryError", getattr(torch.cuda, "OutOfMemoryError", RuntimeError)
)


def profiler_running() -> bool:
    """Whether a torch.profiler (or autograd profiler) session is active in this process: starting and
    stopping another would end it (torch keeps one session per process)."""
    return bool(getattr(torch.autograd.profiler, "_is_profiler_enabled", False)) or bool(
        torch._C._autograd._profiler_enabled())


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


class FlatStats(Mapping[str, Any]):
    """``torch.cuda.memory_stats``'s flat keys (``"allocated_bytes.all.current"``), each looked up in
    the nested dict that ``torch.cuda.memory_stats_as_nested_dict`` returns.

    ``memory_stats()`` builds that same nested dict, then flattens, sorts and copies its ~120
    entries in Python at every call (about 120 us here); tbmem reads a handful of keys per
    record and per monitored batch, so it looks them up where torch already put them.

    Example:
        >>> stats = FlatStats({"allocated_bytes": {"all": {"current": 512}}, "num_ooms": 0})
        >>> stats["allocated_bytes.all.current"], stats.get("num_ooms"), stats.get("missing.key", -1)
        (512, 0, -1)
        >>> sorted(stats)
        ['allocated_bytes.all.current', 'num_ooms']
    """

    __slots__ = ("_nested",)

    def __init__(self, nested: Mapping[str, Any]) -> None:
        self._nested = nested

    def __getitem__(self, key: str) -> Any:
        node: Any = self._nested
        try:
            for part in key.split("."):
                node = node[part]
        except (KeyError, TypeError, IndexError):
            raise KeyError(key) from None
        if isinstance(node, Mapping):
            raise KeyError(key)
        return node

    def __iter__(self) -> Iterator[str]:
        stack: list[tuple[str, Mapping[str, Any]]] = [("", self._nested)]
        while stack:
            prefix, node = stack.pop()
            for k, v in node.items():
                if isinstance(v, Mapping):
                    stack.append((f"{prefix}{k}.", v))
                else:
                    yield prefix + k

    def __len__(self) -> int:
        return sum(1 for _ in self)


def cuda_memory_stats(device: int) -> Mapping[str, Any] | None:
    """``torch.cuda.memory_stats(device)``'s keys and values (a :class:`FlatStats` view where this
    torch has ``memory_stats_as_nested_dict``), or None when CUDA is not initialised."""
    if not cuda_ready():
        return None
    nested = getattr(torch.cuda, "memory_stats_as_nested_dict", None)
    if nested is None:
        return torch.cuda.memory_stats(device)
    return FlatStats(nested(device))


def private_pools_reserved(stats: Mapping[str, Any]) -> dict[str, int] | None:
    """Per CUDA-graph / ``MemPool`` private pool (its id as ``"0_1"``) the bytes it reserves now, from
    ``memory_stats``' ``reserved_bytes_by_private_pools`` (torch >= 2.10), or None where torch lacks it."""
    nested = stats._nested if isinstance(stats, FlatStats) else None
    out: dict[str, int] = {}
    if nested is not None:
        pools = nested.get("reserved_bytes_by_private_pools")
        if not isinstance(pools, Mapping):
            return None
        for key, value in pools.items():
            name = "_".join(str(k) for k in key) if isinstance(key, tuple) else str(key)
            current = value.get("all", {}).get("current") if isinstance(value, Mapping) else None
            if isinstance(current, int):
                out[name] = current
        return out
    prefix, found = "reserved_bytes_by_private_pools.", False
    for key, value in stats.items():
        if key.startswith(prefix):
            found = True
            if key.endswith(".all.current"):
                out[key[len(prefix):-len(".all.current")]] = int(value)
    return out if found or "reserved_bytes_by_private_pools" in stats else None


def private_pool_allocated(device: int, pool: str) -> int | None:
    """Bytes allocated now in private pool ``pool`` (``"0_1"``, as :func:`private_pools_reserved` names it)
    on ``device``: the ``allocated_size`` of that pool's segments, ``torch.cuda.memory_snapshot(mempool_id=...,
    include_traces=False)`` (torch >= 2.10: the pool's own segments and no trace, so the cost is that pool's
    segment count), or None where this torch cannot read one pool's segments."""
    if not cuda_ready():
        return None
    snapshot = torch.cuda.memory_snapshot
    try:
        params = inspect.signature(snapshot).parameters
    except (TypeError, ValueError):
        return None
    if "mempool_id" not in params or "include_traces" not in params:
        return None
    try:
        ident = tuple(int(x) for x in pool.split("_"))
    except ValueError:
        return None
    if len(ident) != 2:
        return None
    try:
        segments = snapshot(mempool_id=ident, include_traces=False)
    except (RuntimeError, AttributeError, AssertionError):  # a torch built without CUDA; a pool just destroyed
        return None
    return sum(int(s.get("allocated_size", 0)) for s in segments
               if s.get("device", device) == device and tuple(s.get("segment_pool_id", ident)) == ident)


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


def cuda_segments(device: int) -> list[dict[str, Any]] | None:
    """The allocator's segments of ``device`` with their blocks (``torch.cuda.memory_snapshot()``: host
    objects only, nothing allocated on the device, so it can be read right after an out-of-memory error),
    or None when CUDA is not ready."""
    if not cuda_ready():
        return None
    return [s for s in torch.cuda.memory_snapshot() if s.get("device", 0) == device]


def cuda_pinned_host_bytes() -> int | None:
    """Bytes of pinned host blocks PyTorch's CUDA host allocator holds (``host_memory_stats``,
    torch >= 2.6), or None where this torch lacks it or CUDA is not ready."""
    stats = getattr(torch.cuda, "host_memory_stats", None)
    if stats is None or not cuda_ready():
        return None
    value = stats().get("allocated_bytes.current")
    return None if value is None else int(value)


def nvml_device_index(device: int) -> int:
    """NVML's index of CUDA device ``device`` (``CUDA_VISIBLE_DEVICES`` renumbers CUDA's, not NVML's):
    torch's own mapping where it has one (``torch.cuda._get_nvml_device_index``), else ``device``."""
    mapping = getattr(torch.cuda, "_get_nvml_device_index", None)
    if mapping is None:
        return device
    try:
        return int(mapping(device))
    except (RuntimeError, ValueError, AssertionError, AttributeError):  # an odd CUDA_VISIBLE_DEVICES
        return device


def cuda_is_integrated(device: int) -> bool:
    """Whether ``device`` shares the host's memory (a unified-memory device: Jetson, GB10/DGX Spark)."""
    if not cuda_ready():
        return False
    try:
        props = torch.cuda.get_device_properties(device)
    except (RuntimeError, AssertionError):  # a torch built without CUDA (a fake device in tests)
        return False
    return bool(getattr(props, "is_integrated", False))


def xpu_available() -> bool:
    """Whether this torch has an Intel XPU it can use (fixed for the process: probes ask once)."""
    xpu = getattr(torch, "xpu", None)
    return bool(xpu is not None and hasattr(xpu, "memory_stats") and xpu.is_available())


def mps_available() -> bool:
    """Whether this torch can use an Apple GPU (fixed for the process: probes ask once)."""
    backend = getattr(getattr(torch, "backends", None), "mps", None)
    return bool(backend is not None and backend.is_available() and hasattr(getattr(torch, "mps", None),
                                                                              "current_allocated_memory"))


def xpu_ready() -> bool:
    """Whether an Intel XPU is available and initialised (never initialises it)."""
    xpu = getattr(torch, "xpu", None)
    return bool(xpu is not None and hasattr(xpu, "memory_stats") and xpu.is_available() and xpu.is_initialized())


def xpu_memory(device: int) -> tuple[Mapping[str, Any], tuple[int, int] | None] | None:
    """(``torch.xpu.memory_stats(device)``, ``mem_get_info`` or None where this torch lacks it), or None."""
    if not xpu_ready():
        return None
    info = getattr(torch.xpu, "mem_get_info", None)
    return torch.xpu.memory_stats(device), (None if info is None else tuple(int(x) for x in info(device)))  # type: ignore[return-value]


def reset_xpu_peaks(device: int) -> None:
    """Reset the XPU allocator's peak counters (where this torch has them)."""
    reset = getattr(getattr(torch, "xpu", None), "reset_peak_memory_stats", None)
    if reset is not None and xpu_ready():
        reset(device)


def xpu_has_memory_history() -> bool:
    """Whether this torch records XPU allocator history (``torch.xpu.memory._record_memory_history``)."""
    mod = getattr(getattr(torch, "xpu", None), "memory", None)
    return mod is not None and hasattr(mod, "_record_memory_history") and hasattr(mod, "_snapshot")


def _xpu_memory_module() -> Any:
    return getattr(getattr(torch, "xpu", None), "memory", None)


def xpu_record_memory_history(*, stacks: str = "python", max_entries: int = 100_000) -> bool:
    """Start recording XPU allocator history (the same trace as CUDA's); False where this torch has none
    (:func:`xpu_has_memory_history`) or no XPU is initialised."""
    if not (xpu_ready() and xpu_has_memory_history()):
        return False
    _xpu_memory_module()._record_memory_history(enabled="all", stacks=stacks, max_entries=max_entries)
    return True


def xpu_stop_memory_history() -> None:
    """Stop recording XPU allocator history (no-op where unsupported)."""
    if xpu_ready() and xpu_has_memory_history():
        _xpu_memory_module()._record_memory_history(enabled=None)


def xpu_snapshot() -> dict[str, Any] | None:
    """The XPU allocator's snapshot dict (segments and device_traces, CUDA's format), or None."""
    if not (xpu_ready() and xpu_has_memory_history()):
        return None
    return _xpu_memory_module()._snapshot()


def xpu_current_device() -> int | None:
    """The current XPU index, or None where no XPU is initialised."""
    return int(torch.xpu.current_device()) if xpu_ready() else None


def mps_memory() -> tuple[int, int, int | None] | None:
    """(``torch.mps.current_allocated_memory()``, ``driver_allocated_memory()``, ``recommended_max_memory()``
    or None) on an Apple GPU this process used, else None (nothing is initialised)."""
    mps = getattr(torch, "mps", None)
    backend = getattr(getattr(torch, "backends", None), "mps", None)
    if mps is None or backend is None or not backend.is_available() or not hasattr(mps, "current_allocated_memory"):
        return None
    allocated, driver = int(mps.current_allocated_memory()), int(mps.driver_allocated_memory())
    if allocated == driver == 0:  # the process has not used the Apple GPU
        return 0, 0, None
    rec = getattr(mps, "recommended_max_memory", None)
    return allocated, driver, None if rec is None else int(rec())


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
    """Call ``callback(device, alloc, device_total, device_free)`` on a CUDA OOM (c10's ``OutOfMemoryObserver``:
    the bytes the allocator tried to allocate, the device's total bytes, or the limit a memory fraction
    sets, and the driver's free bytes).

    Returns False when this torch has no observer hook or CUDA is not ready.
    """
    hook = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
    if hook is None or not cuda_ready():
        return False
    hook(callback)
    return True


class OomRequest(NamedTuple):
    """What torch's out-of-memory observer reported: the exact bytes the allocator tried to allocate (what
    its message prints rounded), the device's total bytes (or the limit ``set_per_process_memory_fraction``
    sets), the driver's free bytes at that moment, and when (``time.monotonic``)."""

    requested: int
    device_total: int
    device_free: int
    at: float


_oom_requests: dict[int, OomRequest] = {}
_oom_watched = False


def _on_oom(device: int, alloc: int, device_total: int, device_free: int) -> None:
    try:  # called by the allocator right before it raises: nothing may escape into it
        _oom_requests[int(device)] = OomRequest(int(alloc), int(device_total), int(device_free), time.monotonic())
    except Exception:  # noqa: BLE001, S110 - an odd argument: the explanation falls back to the message
        pass


def watch_oom_requests() -> bool:
    """Attach tbmem's out-of-memory observer (once per process; torch keeps every observer attached and
    calls each at an allocator OOM), so that :func:`take_oom_request` knows the exact bytes requested.
    False where this torch has no observer hook or CUDA is not ready (then the explanation reads the
    bytes from the error message, rounded as torch prints them)."""
    global _oom_watched
    if not _oom_watched:
        _oom_watched = attach_oom_observer(_on_oom)
    return _oom_watched


def take_oom_request(device: int) -> OomRequest | None:
    """The observer's last report for ``device``, removed (each OOM explained once); None if there is none."""
    return _oom_requests.pop(device, None)


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
