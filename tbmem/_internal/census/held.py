"""Memory that only C++ holds: counted where torch lets Python reach it, else named with its bytes.

A TorchScript module keeps its parameters and buffers in its C++ module (a ``torch.jit.load``-ed model
that no one handed to the census has no Python tensor until asked for one); a quantized module keeps
its weights packed in a C++ object (``LinearPackedParams``); DistributedDataParallel keeps gradient
buckets in its reducer. The heap pass finds these modules (:func:`tbmem._internal.census.kinds.module_types`);
here the census asks TorchScript modules for their tensors (which makes a Python object for each,
that torch keeps with the tensor: one per tensor, once), unpacks packed weights (a copy, the size of
the packed weight give or take its padding), and, for DDP's buckets, which Python cannot reach, names
their bytes as a blind spot.

Example:
    >>> import io, warnings, torch
    >>> from tbmem._internal.census import take_census
    >>> buffer = io.BytesIO()
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore")  # torch.jit is deprecated, and in use
    ...     torch.jit.save(torch.jit.script(torch.nn.Linear(16, 8)), buffer)
    ...     _ = buffer.seek(0)
    ...     loaded = torch.jit.load(buffer)  # never handed to the census
    >>> census = take_census()
    >>> sorted(r.bytes for r in census.records if r.name.startswith("torchscript Linear"))
    [32, 512]
"""

from __future__ import annotations

from typing import Any

import torch

from tbmem._internal import _torch_private as tp
from tbmem._internal import _torch_private_census as tpc
from tbmem._internal._log import report_once
from tbmem._internal.census import scan

_dtype, _device, _requires_grad, _is_leaf = (scan.tensor_attr[n] for n in ("dtype", "device", "requires_grad",
                                                                            "is_leaf"))
_is_view = torch.Tensor._is_view

__all__ = ["held_parameters", "held_buffers", "ddp_buckets", "autocast_blind_spot", "unattributed", "DDP_BUCKETS",
           "AUTOCAST_CACHE"]

#: Blind spot: bytes of DistributedDataParallel's gradient buckets that no gradient views.
DDP_BUCKETS = "ddp_gradient_buckets"
#: Blind spot: upper bound of CPU autocast's weight-cast cache while a census runs inside its region.
AUTOCAST_CACHE = "cpu_autocast_cache_max"


def _script_roots(modules: list[Any], script_types: set[type]) -> list[Any]:
    """The TorchScript modules among ``modules`` that are no other's submodule (each named from its root)."""
    scripts = [m for m in modules if type(m) in script_types]
    inner = {id(c) for m in scripts for c in m.modules() if c is not m}
    return [m for m in scripts if id(m) not in inner]


def _script_types(modules: list[Any]) -> set[type]:
    import torch.jit

    root = getattr(torch.jit, "RecursiveScriptModule", None)
    return {type(m) for m in modules if root is not None and issubclass(type(m), root)}


def held_parameters(ledger: Any, modules: list[Any]) -> None:
    """Claim the parameters of TorchScript modules and the unpacked weights of quantized modules."""
    scripts = _script_types(modules)
    for m in _script_roots(modules, scripts):
        prefix = f"torchscript {tpc.script_name(m)}."
        for name, p in m.named_parameters():
            ledger.claim(p, "parameters", prefix + name)
    for m in modules:
        if type(m) in scripts:
            continue
        for name, t in tpc.packed_weights(m):
            ledger.claim(t, "parameters", f"{type(m).__name__}.{name}" + (" (packed)" if name == "weight" else ""))


def held_buffers(ledger: Any, modules: list[Any]) -> None:
    """Claim the buffers of TorchScript modules."""
    for m in _script_roots(modules, _script_types(modules)):
        prefix = f"torchscript {tpc.script_name(m)}."
        for name, b in m.named_buffers():
            if b is not None:
                ledger.claim(b, "buffers", prefix + name)


def ddp_buckets(ledger: Any, modules: list[Any]) -> None:
    """Name the bytes of DistributedDataParallel gradient buckets that no gradient views (a blind spot)."""
    total = 0
    for m in modules:
        if hasattr(type(m), "_get_ddp_logging_data"):
            total += tpc.ddp_bucket_bytes(m) or 0
    if total:
        ledger.blind_spot(DDP_BUCKETS, total, (
            f"{total / 2**20:.2f} MB in DistributedDataParallel's gradient buckets, which its C++ reducer holds "
            "and Python cannot reach (with gradient_as_bucket_view=True the gradients are views of them and "
            "count once they exist)"))


def autocast_blind_spot(ledger: Any, tensors: list[Any]) -> None:
    """Inside a CPU autocast region, bound what its weight-cast cache (C++ only) may hold."""
    dtype = tp.autocast_cache_dtype("cpu")
    if dtype is None:
        return
    seen: set[int] = set()
    bound = 0
    for t in tensors:
        try:  # autocast caches a cast of a float32 leaf that requires grad and is not a view
            if (id(t) not in seen and _dtype(t) is torch.float32 and _device(t).type == "cpu" and _requires_grad(t)
                    and _is_leaf(t) and not _is_view(t)):
                seen.add(id(t))
                bound += t.numel() * dtype.itemsize
        except Exception as exc:  # noqa: BLE001 - a hostile subclass must not cost the others
            kind = type(t).__name__
            ledger._note(f"the autocast cache:{kind}", f"a {kind} could not be inspected for the autocast cache", exc)
    if bound:
        name = str(dtype).removeprefix("torch.")
        ledger.blind_spot(AUTOCAST_CACHE, bound, (
            f"at most {bound / 2**20:.2f} MB of {name} weight copies that CPU autocast keeps until its region "
            "ends, which torch does not let Python see (copies also saved for backward are counted as activations)"))


def unattributed(ledger: Any, device: int | None) -> int | None:
    """CUDA memory allocated on ``device`` that the census did not count (None without CUDA)."""
    if not tp.cuda_ready():
        return None
    try:
        index = tp.cuda_current_device() if device is None else device
        stats = tp.cuda_memory_stats(index) if index is not None else None
    except RuntimeError as exc:
        report_once("census:unattributed", "tbmem census: could not read the CUDA allocator", exc=exc)
        return None
    if not stats:
        return None
    return int(stats.get("allocated_bytes.all.current", 0)) - ledger.bytes_on(f"cuda:{index}")
