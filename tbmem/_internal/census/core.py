"""``take_census``: find every live tensor and array, categorise it, count each byte once.

Order of claims (= category priority): watched models' parameters (and any other
``nn.Parameter`` found), their gradients (``p.grad``: gc does not see them),
optimizer state (every tensor reachable from ``optimizer.state``), buffers,
activations (tensors saved by autograd in the graphs of ``roots``, of every live
non-leaf tensor, of every gradient made with ``create_graph=True`` and of every live
autograd node, plus those non-leaf tensors), then everything else the scan found:
tensors, bare storages and numpy arrays.

Example:
    >>> import torch
    >>> from tbmem._internal.census import take_census
    >>> model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8))
    >>> census = take_census(models=[model])
    >>> census.by_category["buffers"]  # running_mean, running_var (float32), num_batches_tracked (int64)
    72
"""

from __future__ import annotations

import functools
import gc
import operator
import time
from itertools import compress
import warnings
from typing import Any, Callable, Iterable, Literal

import torch

from tbmem._internal import _torch_private as tp
from tbmem._internal.census import facts, heap, held, names, scan, table, walk
from tbmem._internal.census.categorize import Ledger
from tbmem._internal.census.held import AUTOCAST_CACHE
from tbmem._internal.census.report import Census

__all__ = ["take_census", "AUTOCAST_CACHE"]

NumpyScan = Literal["reachable", "all", "off"]
_Param = torch.nn.Parameter
# torch's own accessors: a subclass's property of the same name (user code) cannot intercept them.
_grad, _grad_fn, _requires_grad, _is_leaf, _retains_grad, _dtype, _device = (
    scan.tensor_attr[n] for n in ("grad", "grad_fn", "requires_grad", "is_leaf", "retains_grad", "dtype", "device"))
_is_view = torch.Tensor._is_view
_IS_TENSOR = functools.partial(operator.is_, torch.Tensor)


def _flagged(tensors: list[Any], got: facts.TensorFacts | None, flag: int, test: Callable[[Any], Any]) -> list[Any]:
    """The tensors whose facts carry ``flag`` (without facts: for which torch's getter ``test`` gives something
    true; a C function, no Python call per tensor)."""
    if got is not None:
        return list(compress(tensors, (got.rows[:, 3] & flag != 0).tolist()))
    return list(compress(tensors, map(test, tensors)))


def _facts(ledger: Ledger, tensors: list[Any]) -> facts.TensorFacts | None:
    try:
        return facts.tensor_facts(tensors)
    except Exception as exc:  # noqa: BLE001 - then each phase asks each tensor itself
        ledger._note("facts", "the tensors could not be read together (read one by one)", exc)
        return None


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
    module_depth: int = 1,
) -> Census:
    """Count what holds memory right now; never raises for a failure inside the census.

    Args:
        models: Models whose parameters, gradients and buffers are named.
        optimizers: Optimizers whose state is named after the parameters.
        roots: Tensors (a loss before ``backward``) or autograd nodes whose graphs
            hold saved activations, or objects holding tensors (a batch dict, a cache): the
            tensors below them are found even where the heap pass cannot see them (objects
            frozen by ``gc.freeze()`` on Python 3.12+) and named after the path (``root['x']``).
        large_tensor_bytes: Storages at or above this size are large tensors.
        top_k: Rows of :meth:`Census.to_markdown`.
        device: CUDA device for ``unattributed_bytes``; None is the current device.
        numpy_scan: ``"reachable"``: arrays in thread frames' locals and PhiML tensors;
            ``"all"``: arrays referenced by any gc-tracked object (slower, see docs/census.md);
            ``"off"``: none.
        full_scan: Traverse the whole heap even when scanning only the objects
            created since the last census is known to find the same tensors
            (see :mod:`tbmem._internal.census.heap`).
        module_depth: Levels of a watched model the by-module breakdown names (``model.encoder`` at 1);
            ``TBMEM_MODULE_DEPTH`` overrides it (:func:`tbmem._internal.census.names.module_depth`).

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
                ledger, method = _run(list(models), list(optimizers), list(roots), numpy_scan, full_scan, top_k,
                                      names.module_depth(module_depth))
                records = ledger.table()
                ledger.release()
    finally:
        if gc_was_enabled:
            gc.enable()
    unattributed = held.unattributed(ledger, device)
    notes, blind_spots, blind_spot_notes = ledger.notes, ledger.blind_spots, ledger.blind_spot_notes
    del ledger
    if len(records) >= table.TRIM_AFTER:
        table.give_back_heap()
    return Census.from_table(records, large_tensor_bytes=large_tensor_bytes, top_k=top_k,
                             duration_s=time.perf_counter() - start, unattributed_bytes=unattributed,
                             notes=notes, heap_scan=method, blind_spots=blind_spots, blind_spot_notes=blind_spot_notes)


def _guarded(ledger: Ledger, what: str, fn: Any, *args: Any) -> None:
    try:
        fn(*args)
    except Exception as exc:  # noqa: BLE001 - one failing phase must not lose the others
        ledger._note(f"phase:{what}", f"{what} could not be scanned", exc)


def _each(ledger: Ledger, what: str, items: Iterable[Any], fn: Callable[[Any], None]) -> None:
    """``fn(item)`` for each item; one that raises is noted (once per type) and skipped."""
    for item in items:
        try:
            fn(item)
        except Exception as exc:  # noqa: BLE001 - a hostile subclass must not cost the other tensors
            kind = type(item).__name__
            ledger._note(f"{what}:{kind}", f"a {kind} could not be inspected for {what}", exc)


def _is_flagged_parameter(t: Any) -> bool:
    """``nn.Parameter(x)`` of a tensor subclass (FSDP2's DTensor) keeps the subclass and sets ``_is_param``."""
    try:
        return object.__getattribute__(t, "_is_param") is True  # no __getattr__/__class__ of the subclass
    except AttributeError:
        return False


def _run(models: list[torch.nn.Module], optimizers: list[torch.optim.Optimizer], roots: list[Any],
         numpy_scan: NumpyScan, full_scan: bool, top_k: int = 10, depth: int = 1) -> tuple[Ledger, str]:
    found = heap.find_instances(holders=numpy_scan == "reachable", incremental=not full_scan)
    census = _Pass(models, optimizers, roots, numpy_scan, top_k, found, depth)
    del found
    for what, fn in census.phases():
        _guarded(census.ledger, what, fn)
    return census.ledger, census.method


class _Pass:
    """One census pass: what the heap pass found, sorted by kind, then claimed phase by phase in the
    order of the categories' priority (the module docstring); the phases share what earlier ones found
    (the named parameters, the gradients, the tensors handed over as roots)."""

    def __init__(self, models: list[torch.nn.Module], optimizers: list[torch.optim.Optimizer], roots: list[Any],
                 numpy_scan: NumpyScan, top_k: int, found: heap.Found, depth: int = 1) -> None:
        self.models, self.optimizers, self.roots, self.numpy_scan, self.top_k = (
            models, optimizers, roots, numpy_scan, top_k)
        self.depth = depth  # levels of the by-module breakdown
        self.method = "full" if found.method != "young" else "incremental"
        ttypes, htypes = found.tensor_types, found.holder_types
        objs, kinds = found.objects, list(map(type, found.objects))
        is_tensor = list(map(ttypes.__contains__, kinds))  # most are tensors: the rest are sorted apart
        tensors = list(compress(objs, is_tensor))
        objs = list(compress(objs, map(operator.not_, is_tensor)))
        kinds = list(map(type, objs))
        self.storages, self.nodes, self.holders, self.modules = (
            list(compress(objs, map(types.__contains__, kinds)))
            for types in (found.storage_types, found.node_types, htypes, found.module_types))
        del is_tensor, kinds, objs
        self.ttypes, self.tensors = ttypes, tensors
        self.ledger = ledger = Ledger(ttypes)
        walk.own_types(refresh=True)
        self.got = got = _facts(ledger, tensors)  # what every phase asks of every tensor, read once (None: one by one)
        self.got_plain: facts.TensorFacts | None = None
        if got is not None:
            ledger.use_facts(tensors, got)
            plain_mask = got.rows[:, 3] & facts.PLAIN != 0
            self.got_plain = got._replace(rows=got.rows[plain_mask])
            plain_kind = plain_mask.tolist()
        else:
            plain_kind = list(map(_IS_TENSOR, map(type, tensors)))
        self.subclassed = list(compress(tensors, map(operator.not_, plain_kind)))
        self.plain = list(compress(tensors, plain_kind))
        del plain_kind
        frozen = heap.frozen_objects()
        if frozen and not heap.FROZEN_READABLE:
            ledger._note("frozen", f"{frozen} objects frozen by gc.freeze() are out of the heap pass's sight here (it "
                                   "reads them on CPython 3.10 and 3.11 with the C extension): their tensors count "
                                   "where the models, optimizers and roots handed to the census reach them, and the "
                                   "others are not counted", warn=False)
        self.param_types = {t for t in ttypes if issubclass(t, _Param)}
        self.cpp_nodes = heap.cpp_node_types()
        self.py_nodes = found.node_types - self.cpp_nodes  # the nodes of custom autograd.Functions: their ctx
        self.named: dict[int, tuple[torch.Tensor, str, str | None]] = {}  # id(param) -> (param, name, module)
        self.root_tensors: list[tuple[Any, str]] = []  # tensors handed over as roots, or below them, without a graph
        self.grads: list[torch.Tensor] = []

    def phases(self) -> list[tuple[str, Callable[[], None]]]:
        """``(what, phase)`` in the order they claim."""
        out = [("parameters", self.parameters), ("gradients", self.gradients),
               ("optimizer state", self.optimizer_state), ("buffers", self.buffers),
               ("activations", self.activations), ("other tensors", self.other),
               ("DDP's gradient buckets", self.ddp_buckets)]
        if self.numpy_scan != "off":
            out.append(("numpy arrays", self.arrays))
        out.append(("what holds unnamed tensors", self.holder_names))
        out.append(("the autocast cache", self.autocast_cache))
        return out

    def parameters(self) -> None:
        ledger, named, param_types, depth = self.ledger, self.named, self.param_types, self.depth
        for i, model in enumerate(self.models):
            label, prefix = _label("model", i), names.wrapper_prefix(model)
            for name, p in model.named_parameters():
                name = names.unwrapped(name, prefix)  # the user's names, not torch.compile's, DDP's or peft's
                # named from the model's label on, as its module is (``model.fc.weight`` under ``model.fc``)
                named.setdefault(id(p), (p, f"{label}.{name}", names.module_of(name, label, depth)))
        for k, opt in enumerate(self.optimizers):
            for g, group in enumerate(opt.param_groups):
                for j, p in enumerate(group.get("params", ())):
                    named.setdefault(id(p), (p, f"{_label('optimizer', k)}.param_groups[{g}][{j}]", None))
        for param, qualname, owner in named.values():
            ledger.claim(param, "parameters", qualname, owner)

        unnamed: list[Any] = []

        def found_parameter(t: Any) -> None:
            if type(t) in param_types or _is_flagged_parameter(t):
                unnamed.append(t)

        held.held_parameters(ledger, self.modules)  # TorchScript modules' and quantized modules' packed weights
        _each(ledger, "parameters", self.subclassed, found_parameter)
        # a model nobody watched (a frozen teacher): named after the module found holding it (names.py)
        held_by: dict[int, tuple[str, str]] = {}
        if unnamed:
            try:
                held_by = names.parameter_holders([t for t in unnamed if not ledger.seen(t)], self.depth)
            except Exception as exc:  # noqa: BLE001 - then they are named after their type
                ledger._note("holders", "the modules holding unwatched parameters could not be read", exc)
        for t in unnamed:
            name, module = held_by.get(id(t), (type(t).__name__, None))
            ledger.claim(t, "parameters", name, module)

    def gradients(self) -> None:
        ledger, grads = self.ledger, self.grads

        def named_grad(entry: tuple[torch.Tensor, str, str | None]) -> None:
            p, name, module = entry
            g = _grad(p)
            if g is not None:
                ledger.claim(g, "gradients", name + ".grad", module)
                grads.append(g)

        def leaf_grad(t: Any) -> None:  # leaves requiring grad (PhiFlow's physical parameters), retain_grad()
            if _requires_grad(t) and (_is_leaf(t) or _retains_grad(t)):
                g = _grad(t)
                if g is not None:
                    ledger.claim(g, "gradients", type(t).__name__ + ".grad")
                    grads.append(g)

        _each(ledger, "gradients", list(self.named.values()), named_grad)
        _each(ledger, "gradients", _flagged(self.tensors, self.got, facts.REQUIRES_GRAD, _requires_grad), leaf_grad)

    def optimizer_state(self) -> None:
        for k, outer in enumerate(self.optimizers):
            for path, opt in walk.optimizers_in(outer):  # ZeroRedundancyOptimizer keeps its state in .optim
                _each(self.ledger, "optimizer state", list(opt.state.items()),
                      self._state_claimer(_label("optimizer", k) + path))

    def _state_claimer(self, label: str) -> Callable[[tuple[Any, Any]], None]:
        ledger, named, ttypes = self.ledger, self.named, self.ttypes

        def state_of(item: tuple[Any, Any]) -> None:
            p, state = item
            entry = named.get(id(p))
            _, pname, module = entry if entry is not None else (p, f"param@{id(p):x}", None)
            prefix = f"{label}.state[{pname}]."
            if type(state) is not dict and not issubclass(type(state), dict):
                state = {"": state}
            for key, value in list(state.items()):
                if type(value) in ttypes:  # the usual entry (exp_avg, step)
                    ledger.claim(value, "optimizer_state", f"{prefix}{key}", module)
                    continue
                # lists (LBFGS's history), dicts, objects (a dataclass of preconditioners): whatever it holds
                for t, suffix in walk.named_below(value, ttypes, depth=4):
                    ledger.claim(t, "optimizer_state", f"{prefix}{key}{suffix}", module)

        return state_of

    def buffers(self) -> None:
        depth = self.depth
        for i, model in enumerate(self.models):
            label, prefix = _label("model", i), names.wrapper_prefix(model)
            for name, b in model.named_buffers():
                if b is None:
                    continue
                name = names.unwrapped(name, prefix)
                self.ledger.claim(b, "buffers", f"{label}.{name}", names.module_of(name, label, depth))
        held.held_buffers(self.ledger, self.modules)

    def activations(self) -> None:
        ledger = self.ledger
        starts = self._graph_starts()
        graphs = _Graphs(ledger, self.ttypes, self.py_nodes)
        graphs.walk_from(starts)
        # Graphs held by nothing but a node object (``fn = loss.grad_fn``): an old one of a C++ node can be
        # found again only by a full scan (see heap.forget), which is needed where such a graph holds
        # something this census counted: not for the nodes torch.compile's tracing leaves behind, whose
        # saved tensors were released (or never held memory), which would make every census a full one.
        orphans = [n for n in self.nodes if id(n) not in graphs.visited]
        counted = ledger.count()
        graphs.walk_from([n for n in orphans if type(n) in self.cpp_nodes])
        if ledger.count() != counted:
            heap.forget()
        graphs.walk_from([n for n in orphans if type(n) not in self.cpp_nodes])
        if graphs.errors:
            ledger._note("graph", "an autograd node could not be read", graphs.errors[0])

    def _graph_starts(self) -> list[Any]:
        """The autograd nodes the graph walk starts from (the roots', the live non-leaf tensors', the
        gradients'), claiming the tensors they belong to as activations."""
        ledger, ttypes, root_tensors = self.ledger, self.ttypes, self.root_tensors
        starts: list[Any] = []

        def root(r: Any) -> None:
            if type(r) in ttypes:
                fn = _grad_fn(r)
                if fn is not None:
                    ledger.claim(r, "activations", "root")
                    starts.append(fn)
                else:
                    root_tensors.append((r, "root"))
            elif hasattr(type(r), "next_functions"):
                starts.append(r)
            else:  # an object holding tensors (a batch dict, a cache): found even where the heap pass cannot see
                for t, path in walk.named_below(r, ttypes, depth=3):
                    fn = _grad_fn(t)
                    if fn is not None:
                        ledger.claim(t, "activations", f"root{path}")
                        starts.append(fn)
                    else:
                        root_tensors.append((t, f"root{path}"))

        def output(t: Any) -> None:
            fn = _grad_fn(t)
            if fn is not None:
                ledger.claim(t, "activations", f"{type(fn).__name__} output")
                starts.append(fn)

        def grad_graph(g: Any) -> None:  # backward(create_graph=True): a graph hangs off each gradient
            fn = _grad_fn(g)
            if fn is not None:
                starts.append(fn)

        _each(ledger, "activations", self.roots, root)
        _each(ledger, "activations", _flagged(self.tensors, self.got, facts.HAS_GRAD_FN, _grad_fn), output)
        _each(ledger, "activations", self.grads, grad_graph)
        return starts

    def other(self) -> None:
        ledger = self.ledger
        for t, name in self.root_tensors:  # handed over by the caller: named after what holds them
            ledger.claim(t, "other", name)
        # Subclass instances first: a wrapper (DTensor, a nested tensor) names the memory of its inner tensors.
        for t in self.subclassed:
            if not ledger.seen(t):
                ledger.claim(t, "other", type(t).__name__)
        for position, t in ledger.claim_plain(self.plain, "other", self.got_plain):  # in bulk; odd ones one by one
            ledger.claim(t, "other", type(t).__name__, position=position)
        ledger.claim_storages(self.storages)  # storages held without a tensor

    def ddp_buckets(self) -> None:
        held.ddp_buckets(self.ledger, self.modules + [m for m in self.models if m not in self.modules])

    def arrays(self) -> None:
        atypes = heap.array_types()
        if self.numpy_scan == "all":
            sources: Iterable[Any] = _chain(walk.all_arrays(atypes), walk.frame_arrays(atypes))
        else:
            sources = _chain(walk.frame_arrays(atypes), walk.holder_arrays(self.holders, atypes))
        for arr, name in sources:
            self.ledger.claim_array(arr, name)

    def holder_names(self) -> None:  # the largest tensors named only by their type: named after what holds them
        rows = self.ledger.unnamed(self.top_k)
        found = names.holder_names([t for _, t, _ in rows]) if rows else {}
        for _, t, handle in rows:
            if id(t) in found:
                self.ledger.rename(handle, found[id(t)])

    def autocast_cache(self) -> None:
        held.autocast_blind_spot(self.ledger, [p for p, _, _ in self.named.values()] + self.tensors)


class _Graphs:
    """The walk of autograd graphs: what each node saved, claimed as activations, each node once."""

    def __init__(self, ledger: Ledger, ttypes: frozenset[type], py_nodes: frozenset[type] | set[type]) -> None:
        self.ledger, self.ttypes, self.py_nodes = ledger, ttypes, py_nodes
        self.visited: set[int] = set()
        self.keep: list[Any] = []
        self.errors: list[BaseException] = []

    def walk_from(self, from_nodes: list[Any]) -> None:
        ledger, ttypes, keep = self.ledger, self.ttypes, self.keep
        walked = len(keep)
        for saved, name in scan.walk_autograd(from_nodes, self.visited, keep, self.errors):
            if type(saved) in ttypes:
                ledger.claim(saved, "activations", name)
            elif saved is not None:  # what a pack hook returned: (device, tensor), a checkpoint placeholder
                for t in walk.tensors_below(saved, ttypes):
                    ledger.claim(t, "activations", f"{name} (packed)")
        # A custom autograd.Function's ctx is its node: what forward kept there (ctx.mask = h > 0) is
        # held for backward like what it saved (and after backward, as long as the graph is held).
        for node in compress(keep[walked:], map(self.py_nodes.__contains__, map(type, keep[walked:]))):
            for t, path in walk.named_below(walk.instance_dict(node), ttypes, depth=2):
                ledger.claim(t, "activations", f"{type(node).__name__}.ctx{walk.attribute_path(path)}")


def _chain(*its: Iterable[Any]) -> Iterable[Any]:
    for it in its:
        yield from it
