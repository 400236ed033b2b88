"""Autograd graphs the census must walk, whatever holds them (issue 12: 8, 9, 10, 11, 13)."""

from __future__ import annotations

import gc
import warnings
import weakref
from typing import Any, Callable

import pytest
import torch
from torch import nn
from torch.autograd.graph import saved_tensors_hooks
from torch.utils.checkpoint import checkpoint

from tbmem._internal.census import take_census
from tests.census._model import storage_ptrs


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 48), nn.Tanh(), nn.Linear(48, 8))


def _saved_storages(forward: Callable[[], Any]) -> dict[int, int]:
    """data_ptr -> nbytes of every tensor autograd saves while ``forward`` runs (a twin run, discarded)."""
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        saved[s.data_ptr()] = s.nbytes()
        return t.detach()

    with saved_tensors_hooks(pack, lambda t: t):
        out = forward()
    del out
    return saved


class _LiveSaved:
    """Saved-tensor hooks that keep a weak reference to what the graph holds, to tell later what is still alive."""

    def __init__(self, packer: Callable[[torch.Tensor], Any] | None = None) -> None:
        self.refs: list[weakref.ref[torch.Tensor]] = []
        self.packer = packer

    def pack(self, t: torch.Tensor) -> Any:
        held = t.detach().clone() if self.packer is not None else t.detach()
        self.refs.append(weakref.ref(held))
        return self.packer(held) if self.packer is not None else held

    def hooks(self) -> saved_tensors_hooks:
        return saved_tensors_hooks(self.pack, lambda packed: packed[1] if type(packed) is tuple else packed)

    def alive(self) -> dict[int, int]:
        out = {}
        for ref in self.refs:
            t = ref()
            if t is not None:
                out[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return out


def test_a_graph_held_only_by_its_grad_fn_is_walked(no_automatic_gc) -> None:
    """Defect 10: no tensor of the graph is alive, only the node object a variable holds.

    ``exp`` saves its output; an output is saved without its Python object, so nothing but
    the node leads to these two buffers.
    """
    x = torch.randn(5_000, requires_grad=True)
    saved = _saved_storages(lambda: x.exp().exp().sum())
    expected = sum(saved.values())
    assert expected == 2 * x.numel() * x.element_size()
    node = x.exp().exp().sum().grad_fn  # the loss itself is gone
    assert type(node).__name__ == "SumBackward0"
    census = take_census()
    assert census.by_category["activations"] == expected
    del node
    assert take_census().by_category["activations"] == 0


def test_one_tensor_whose_grad_fn_raises_does_not_lose_the_activations(no_automatic_gc, tbmem_log) -> None:
    """Defect 11: one tensor's failure must not end the activations phase (each is guarded on its own)."""

    class BadGradFn(torch.Tensor):
        @property
        def grad_fn(self):  # type: ignore[override]
            raise RuntimeError("grad_fn is broken")

    bad = torch.Tensor._make_subclass(BadGradFn, torch.zeros(321))
    model, x = _mlp(), torch.randn(32, 16)
    params = list(model.parameters())
    saved = _saved_storages(lambda: model(x).square().sum())
    loss = model(x).square().sum()
    expected = sum(n for ptr, n in saved.items() if ptr not in storage_ptrs(params)) + loss.untyped_storage().nbytes()
    census = take_census(models=[model], roots=[loss])
    assert census.by_category["activations"] == expected
    assert [r.category for r in census.records if r.bytes == bad.untyped_storage().nbytes()] == ["other"]
    assert census.notes == []  # torch's own accessor is read: the broken override never runs


def test_graphs_of_gradients_made_with_create_graph_are_walked(no_automatic_gc) -> None:
    """Defect 9: ``backward(create_graph=True)`` hangs a graph off every ``p.grad``."""
    model, x = _mlp(), torch.randn(32, 16)
    live = _LiveSaved()
    with live.hooks(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Using backward\\(\\) with create_graph=True")  # the very case
        loss = model(x).square().sum()
        loss.backward(create_graph=True)
    del loss
    params = list(model.parameters())
    assert all(p.grad is not None and p.grad.grad_fn is not None for p in params)
    owned = storage_ptrs(params + [p.grad for p in params])
    expected = sum(n for ptr, n in live.alive().items() if ptr not in owned)
    assert expected > 0
    census = take_census(models=[model])
    assert census.by_category["activations"] == expected
    assert census.by_category["gradients"] == sum(p.grad.untyped_storage().nbytes() for p in params)
    for p in params:
        p.grad = None  # the parameter <-> gradient cycle torch warns about


def test_activations_packed_in_a_tuple_by_offloading_hooks_are_activations(no_automatic_gc) -> None:
    """Defect 8: ``save_on_cpu``-style hooks pack ``(device, copy)``; the copies are the saved activations."""
    model, x = _mlp(), torch.randn(32, 16)
    live = _LiveSaved(packer=lambda copy: (copy.device, copy))  # what torch.autograd.graph.save_on_cpu packs
    with live.hooks():
        loss = model(x).square().sum()
    expected = sum(live.alive().values()) + loss.untyped_storage().nbytes()
    census = take_census(models=[model], roots=[loss])
    assert census.by_category["activations"] == expected


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_checkpointed_graphs_give_no_spurious_notes(no_automatic_gc, tbmem_log, use_reentrant) -> None:
    """Defect 13: checkpoint's ``_Holder`` placeholders are not tensors that failed to be measured."""
    model, x = _mlp(), torch.randn(32, 16, requires_grad=True)
    loss = checkpoint(model, x, use_reentrant=use_reentrant).square().sum()
    census = take_census(models=[model], roots=[loss])
    assert census.notes == []
    assert not [r for r in tbmem_log.records if "could not be measured" in r.getMessage()]
    assert census.by_category["activations"] >= loss.untyped_storage().nbytes()


@pytest.fixture
def capture() -> Any:
    from tbmem._internal.census import heap

    heap.start_capture()
    try:
        yield
    finally:
        heap.stop_capture()


def test_a_graph_held_only_by_an_old_node_object_is_found_by_later_censuses(no_automatic_gc, capture) -> None:
    """Defect 10 once the node object is in the oldest generation (it cannot be weakly referenced)."""
    x = torch.randn(5_000, requires_grad=True)
    expected = sum(_saved_storages(lambda: x.exp().exp().sum()).values())
    node = x.exp().exp().sum().grad_fn
    assert take_census().by_category["activations"] == expected
    gc.collect(1)  # promotes the node object, as a later collection would
    assert any(o is node for o in gc.get_objects(generation=2))
    again = take_census()
    assert again.heap_scan == "full" and again.by_category["activations"] == expected
    del node


def test_node_objects_of_graphs_tensors_hold_do_not_stop_incremental_scans(no_automatic_gc, capture) -> None:
    """The census's own walk leaves node objects (torch keeps them with their nodes); they must not cost a full
    scan at every census."""
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scans = []
    for step in range(4):
        loss = model(torch.randn(8, 16)).square().sum()
        scans.append(take_census(models=[model], optimizers=[opt], roots=[loss]).heap_scan)
        if step == 1:
            gc.collect(1)  # the graph's node objects (and the parameters' AccumulateGrad) get old
        loss.backward()
        opt.step()
        opt.zero_grad()
    assert scans == ["full", "incremental", "incremental", "incremental"]


def _conv_net_loss(x: torch.Tensor, net: nn.Module) -> torch.Tensor:
    """A graph with single saved tensors (convolution, gelu) and a saved tensor list (indexing by a tensor)."""
    picks = torch.tensor([0, 2, 3])
    y = torch.nn.functional.gelu(net(x))
    return y[:, picks].square().mean()


def test_a_graph_is_counted_whole_before_backward_and_empty_after_without_notes(no_automatic_gc) -> None:
    """The walk reads every node of a released graph cheaply: nothing counted, nothing noted; the
    same graph before backward counts every saved tensor."""
    from tbmem._internal.census import scan

    torch.manual_seed(0)
    net, x = nn.Conv1d(4, 6, 3), torch.randn(2, 4, 32)
    params = list(net.parameters())
    saved = _saved_storages(lambda: _conv_net_loss(x, net))
    loss = _conv_net_loss(x, net)
    expected = sum(n for ptr, n in saved.items() if ptr not in storage_ptrs(params))  # x too: saved by the conv
    before = take_census(models=[net], roots=[loss])
    assert before.by_category["activations"] == expected + loss.untyped_storage().nbytes()
    assert before.notes == []
    loss.backward()
    errors: list[BaseException] = []
    walked = list(scan.walk_autograd([loss.grad_fn], set(), [], errors))
    assert walked == [] and errors == []  # released: neither a saved tensor nor a failed read
    after = take_census(models=[net], roots=[loss])
    assert after.by_category["activations"] == loss.untyped_storage().nbytes()  # the root only
    assert after.notes == []


def test_a_graph_run_backward_in_part_still_counts_the_part_not_run(no_automatic_gc) -> None:
    """``autograd.grad`` to an intermediate tensor releases only the nodes it ran: the walk must not
    conclude from released nodes that the rest of the graph is released too."""
    x = torch.randn(4_000, requires_grad=True)
    hidden = x * 2
    deep = x.exp().exp()  # the inner exp's result: saved by its node, held by nothing else
    loss = hidden.sum() + deep.sum()
    torch.autograd.grad(loss, [hidden])  # runs the nodes above hidden only, releasing them
    census = take_census(roots=[loss])
    inner = [r for r in census.records if r.name == "ExpBackward0.saved_result"]
    assert [(r.category, r.bytes) for r in inner] == [("activations", x.numel() * 4)]
    # hidden's own node (below it, not run) still holds the scalar it multiplied by
    assert {r.name for r in census.records if r.category == "activations"} == {
        "root", "MulBackward0 output", "ExpBackward0 output", "ExpBackward0.saved_result", "MulBackward0.saved_other"}
    assert census.notes == []


class _MaskedRelu(torch.autograd.Function):
    """Keeps its mask on ``ctx`` (not through save_for_backward), as many custom Functions do."""

    @staticmethod
    def forward(ctx, h: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        ctx.mask = h > 0
        ctx.scale = 2.0
        return h.clamp(min=0) * 2.0

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        return grad * ctx.mask * ctx.scale


def test_what_a_custom_function_keeps_on_ctx_is_activations() -> None:
    """Issue 26, item 4: ``ctx.mask = h > 0``, held for backward, was counted as "other"."""
    gc.collect()
    lin = nn.Linear(64, 300)
    h = lin(torch.randn(50, 64))
    loss = _MaskedRelu.apply(h).sum()
    node = loss.grad_fn.next_functions[0][0]
    mask = node.mask
    assert mask.dtype == torch.bool
    census = take_census(models=[lin], roots=[loss])
    rows = [(r.name, r.category, r.bytes) for r in census.records if r.name.endswith("ctx.mask")]
    assert rows == [(f"{type(node).__name__}.ctx.mask", "activations", mask.untyped_storage().nbytes())]
    assert mask.untyped_storage().nbytes() == 50 * 300
    del mask
    loss.backward()  # the mask stays on the node as long as the graph is held
    after = take_census(models=[lin], roots=[loss])
    assert [r.category for r in after.records if r.name.endswith("ctx.mask")] == ["activations"]


def test_nodes_left_over_from_torch_compile_do_not_make_every_census_a_full_scan(no_automatic_gc) -> None:
    """Issue 26, item 10: five C++ nodes from tracing, held by nothing but themselves, forced a full scan
    at every census (22-30 ms instead of 0.6 ms); the results were exact, and stay so."""
    model = _mlp()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = torch.compile(model, backend="aot_eager")
        for _ in range(2):
            compiled(torch.randn(4, 16)).sum().backward()
    gc.collect()
    take_census(models=[model])
    scans = []
    for _ in range(3):
        batch = torch.randn(4, 16)
        incremental = take_census(models=[model], roots=[batch])
        full = take_census(models=[model], roots=[batch], full_scan=True)
        scans.append(incremental.heap_scan)
        assert incremental.by_category == full.by_category
        take_census(models=[model])  # after the full scan: the next one may be incremental again
    assert scans == ["incremental"] * 3
