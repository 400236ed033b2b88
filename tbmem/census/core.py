"""``take_census``: find every live tensor and array, categorise it, count each storage once.

Order of claims (= category priority): watched models' parameters (and any other
``nn.Parameter`` found), their gradients (``p.grad``: gc does not see them),
optimizer state, buffers, activations (tensors saved by autograd in the graphs
of ``roots`` and of every live non-leaf tensor, plus those non-leaf tensors),
then everything else the scan found: tensors and numpy arrays.

Example:
    >>> import torch
    >>> from tbmem.census import take_census
    >>> model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8))
    >>> census = take_census(models=[model])
    >>> census.by_category["buffers"]  # running_mean, running_var (float32), num_batches_tracked (int64)
    72
"""

from __future__ import annotations

import gc
import time
import warnings
from typing import Any, Iterable, Literal

import torch

from tbmem import _torch_private as tp
from tbmem._log import report_once
from tbmem.census import heap, scan
from tbmem.census.categorize import Ledger
from tbmem.census.report import Census

__all__ = ["take_census"]

NumpyScan = Literal["reachable", "all", "off"]
_Param = torch.nn.Parameter


def _label(kind: str, i: int) -> str:
    return kind if i == 0 else f"{kind}{i}"


def take_census(
    models: Iterable[torch.nn.Module] = (),
    optimizers: Iterable[torch.optim.Optimizer] = (),
    roots: Iterable[Any] = (),
    large_tensor_bytes: int = 100 * 2**20,
    top_k: int = 10,
    device: int | None = None,
    *,
    numpy_scan: NumpyScan = "reachable",
    full_scan: bool = False,
) -> Census:
    """Count what holds memory right now; never raises for a failure inside the census.

    Args:
        models: Models whose parameters, gradients and buffers are named.
        optimizers: Optimizers whose state is named after the parameters.
        roots: Tensors (a loss before ``backward``) or autograd nodes whose graphs
            hold saved activations.
        large_tensor_bytes: Storages at or above this size are large tensors.
        top_k: Rows of :meth:`Census.to_markdown`.
        device: CUDA device for ``unattributed_bytes``; None is the current device.
        numpy_scan: ``"reachable"``: arrays in thread frames' locals and PhiML tensors;
            ``"all"``: arrays referenced by any gc-tracked object (slower, see docs/census.md);
            ``"off"``: none.
        full_scan: Traverse the whole heap even when scanning only the objects
            created since the last census is known to find the same tensors
            (see :mod:`tbmem.census.heap`).

    Returns:
        The :class:`Census`.
    """
    start = time.perf_counter()
    # No collection while scanning: the census's own lists would trigger one (a full one costs
    # ~100 ms on a large heap), and nothing the census holds could be freed by it anyway.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # deprecation chatter of odd tensors must not become errors
            with tp.disable_torch_function_subclass():
                ledger, method = _run(list(models), list(optimizers), list(roots), numpy_scan, full_scan)
    finally:
        if gc_was_enabled:
            gc.enable()
    unattributed = _unattributed(ledger, device)
    return Census.from_records(ledger.records(), large_tensor_bytes=large_tensor_bytes, top_k=top_k,
                               duration_s=time.perf_counter() - start, unattributed_bytes=unattributed,
                               notes=ledger.notes, heap_scan=method)


def _guarded(ledger: Ledger, what: str, fn: Any, *args: Any) -> None:
    try:
        fn(*args)
    except Exception as exc:  # noqa: BLE001 - one failing phase must not lose the others
        ledger._note(f"phase:{what}", f"{what} could not be scanned", exc)


def _run(models: list[torch.nn.Module], optimizers: list[torch.optim.Optimizer], roots: list[Any],
         numpy_scan: NumpyScan, full_scan: bool) -> tuple[Ledger, str]:
    found = heap.find_instances(holders=numpy_scan == "reachable", incremental=not full_scan)
    ttypes, htypes, method = found.tensor_types, found.holder_types, found.method
    tensors = [o for o in found.objects if type(o) in ttypes]
    holders = [o for o in found.objects if type(o) in htypes]
    del found
    ledger = Ledger(ttypes)
    frozen = heap.frozen_objects()
    if frozen:
        ledger._note("frozen", f"{frozen} objects frozen by gc.freeze(), which no scan can see")
    named: dict[int, tuple[torch.Tensor, str, str]] = {}  # id(param) -> (param, name, module)

    def parameters() -> None:
        for i, model in enumerate(models):
            label = _label("model", i)
            for name, p in model.named_parameters():
                qual = name if i == 0 else f"{label}.{name}"
                module = f"{label}.{name.split('.', 1)[0]}" if "." in name else label
                named.setdefault(id(p), (p, qual, module))
        for k, opt in enumerate(optimizers):
            for g, group in enumerate(opt.param_groups):
                for j, p in enumerate(group.get("params", ())):
                    named.setdefault(id(p), (p, f"{_label('optimizer', k)}.param_groups[{g}][{j}]", None))
        for p, name, module in named.values():
            ledger.claim(p, "parameters", name, module)
        for t in tensors:
            if isinstance(t, _Param):
                ledger.claim(t, "parameters", type(t).__name__)

    def gradients() -> None:
        for p, name, module in named.values():
            if p.grad is not None:
                ledger.claim(p.grad, "gradients", name + ".grad", module)
        for t in tensors:  # leaves requiring grad (PhiFlow's physical parameters) and retain_grad()
            if t.requires_grad and (t.is_leaf or t.retains_grad):
                g = t.grad
                if g is not None:
                    ledger.claim(g, "gradients", type(t).__name__ + ".grad")

    def optimizer_state() -> None:
        for k, opt in enumerate(optimizers):
            label = _label("optimizer", k)
            for p, state in list(opt.state.items()):
                _, pname, module = named.get(id(p), (p, f"param@{id(p):x}", None))
                for key, value in list(state.items()):
                    if type(value) in ttypes:
                        ledger.claim(value, "optimizer_state", f"{label}.state[{pname}].{key}", module)

    def buffers() -> None:
        for i, model in enumerate(models):
            label = _label("model", i)
            for name, b in model.named_buffers():
                if b is None:
                    continue
                qual = name if i == 0 else f"{label}.{name}"
                module = f"{label}.{name.split('.', 1)[0]}" if "." in name else label
                ledger.claim(b, "buffers", qual, module)

    def activations() -> None:
        nodes: list[Any] = []
        for r in roots:
            if type(r) in ttypes:
                if r.grad_fn is not None:
                    ledger.claim(r, "activations", "root")
                    nodes.append(r.grad_fn)
            elif hasattr(type(r), "next_functions"):
                nodes.append(r)
        for t in tensors:
            fn = t.grad_fn
            if fn is not None:
                ledger.claim(t, "activations", f"{type(fn).__name__} output")
                nodes.append(fn)
        visited: set[int] = set()
        keep: list[Any] = []
        for saved, name in scan.walk_autograd(nodes, visited, keep):
            ledger.claim(saved, "activations", name)

    def other() -> None:
        for t in tensors:
            if not ledger.seen(t):
                ledger.claim(t, "other", type(t).__name__)

    def arrays() -> None:
        atypes = heap.array_types()
        if numpy_scan == "all":
            sources: Iterable[Any] = scan.all_arrays(atypes)
        else:
            sources = _chain(scan.frame_arrays(atypes), scan.holder_arrays(holders, atypes))
        for arr, name in sources:
            ledger.claim_array(arr, name)

    phases = [("parameters", parameters), ("gradients", gradients), ("optimizer state", optimizer_state),
              ("buffers", buffers), ("activations", activations), ("other tensors", other)]
    if numpy_scan != "off":
        phases.append(("numpy arrays", arrays))
    for what, fn in phases:
        _guarded(ledger, what, fn)
    return ledger, "full" if method != "young" else "incremental"


def _chain(*its: Iterable[Any]) -> Iterable[Any]:
    for it in its:
        yield from it


def _unattributed(ledger: Ledger, device: int | None) -> int | None:
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
