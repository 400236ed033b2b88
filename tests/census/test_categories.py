"""Exact bytes per category on a model with known sizes."""

from __future__ import annotations

import gc

import torch
import torch.nn.functional as F

from tbmem._internal.census import CATEGORIES, take_census
from tests.census._model import VOCAB, TiedNet, storage_bytes, storage_ptrs

F32 = torch.tensor(0.0).element_size()


def _setup() -> tuple[TiedNet, torch.optim.Adam, torch.Tensor, torch.Tensor]:
    gc.collect()
    torch.manual_seed(0)
    model = TiedNet()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randint(0, VOCAB, (8,))
    y = torch.randint(0, VOCAB, (8,))
    F.cross_entropy(model(x), y).backward()
    opt.step()  # Adam state: exp_avg, exp_avg_sq per parameter, and a float32 step scalar
    return model, opt, x, y


def _saved_storages(model: TiedNet, x: torch.Tensor, y: torch.Tensor) -> dict[int, int]:
    """What autograd saves for one forward, seen through saved-tensor hooks (not the census's graph walk)."""
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        saved[s.data_ptr()] = s.nbytes()
        return t.detach()  # returning t itself would make a graph <-> tensor cycle gc cannot free

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = F.cross_entropy(model(x), y)
    del loss
    return saved


def test_every_category_is_exact_between_forward_and_backward() -> None:
    model, opt, x, y = _setup()
    params = list({id(p): p for p in model.parameters()}.values())
    buffers = list(model.buffers())
    # independent expectations: distinct storages of the known tensors
    n_param_bytes = sum(p.numel() * p.element_size() for p in params)
    assert storage_bytes(params) == n_param_bytes  # the tied weight is one Parameter
    expected_buffers = 2 * 32 * F32 + torch.tensor(0).element_size()  # BN running stats + int64 counter
    assert sum(b.numel() * b.element_size() for b in buffers) == expected_buffers
    expected_state = 2 * n_param_bytes + len(params) * F32

    data = torch.randn(1000, 16)
    view = data[10:20]  # a view keeps its whole 64000-byte storage alive, counted once
    del data
    param_view = model.head.weight[:, :4]  # a view of a parameter: counted as the parameter

    saved = _saved_storages(model, x, y)
    owned = storage_ptrs(params + buffers + [p.grad for p in params])
    loss = F.cross_entropy(model(x), y)
    expected_act = sum(n for ptr, n in saved.items() if ptr not in owned) + loss.untyped_storage().nbytes()

    census = take_census(models=[model], optimizers=[opt], roots=[loss], large_tensor_bytes=60_000)
    assert list(census.by_category) == list(CATEGORIES)
    assert census.by_category["parameters"] == n_param_bytes
    assert census.by_category["gradients"] == n_param_bytes
    assert census.by_category["optimizer_state"] == expected_state
    assert census.by_category["buffers"] == expected_buffers
    assert census.by_category["activations"] == expected_act
    assert census.total_bytes == sum(census.by_category.values())
    # the view's storage is counted once, whole (named by the view or by its preserved base)
    views = [r for r in census.records if r.shape in ((10, 16), (1000, 16))]
    assert len(views) == 1 and views[0].bytes == 64000 and views[0].category == "other"
    assert census.large_count == 1 and census.large_tensors[0].bytes == 64000
    assert census.by_category["other"] >= 64000
    assert census.unattributed_bytes is None  # CPU only
    names = {r.name for r in census.records}
    assert {"model.emb.weight", "model.emb.weight.grad", "optimizer.state[model.emb.weight].exp_avg",
            "model.body.1.running_mean"} <= names
    assert "model.out.weight" not in names  # the tied output weight is the embedding's storage
    body_params = list(model.body.parameters())  # value, grad, exp_avg, exp_avg_sq, and a step scalar each
    assert census.by_module["model.body"] == sum(4 * t.numel() * t.element_size() + F32 for t in body_params) + sum(
        t.numel() * t.element_size() for t in model.body.buffers())
    del param_view, view

    loss.backward()  # saved tensors are released: only the loss itself remains an activation
    after = take_census(models=[model], optimizers=[opt])
    assert after.by_category["activations"] == loss.untyped_storage().nbytes()
    assert after.by_category["gradients"] == n_param_bytes


def test_duplicate_roots_and_shared_graphs_count_once() -> None:
    model, opt, x, y = _setup()
    logits = model(x)
    a = logits.sum()
    b = logits.mean()
    one = take_census(models=[model], roots=[a])
    both = take_census(models=[model], roots=[a, b, a, a.grad_fn])
    # b adds only its own output and the (tiny) saved state of MeanBackward, all storages distinct
    assert both.by_category["activations"] >= one.by_category["activations"]
    assert both.by_category["activations"] - one.by_category["activations"] <= 2 * F32


def test_numpy_arrays_are_host_memory_deduplicated_by_base() -> None:
    import numpy as np

    gc.collect()
    base = np.zeros((250, 100))  # 200000 bytes
    views = [base[1:], base.T, base[::2]]  # noqa: F841 - held by this frame
    from_torch = torch.zeros(3000).numpy()  # noqa: F841 - the tensor's storage, counted once
    census = take_census()
    hits = [r for r in census.records if r.bytes == 200000]
    assert len(hits) == 1 and hits[0].device == "cpu" and hits[0].dtype == "float64"
    assert hits[0].category == "other" and hits[0].name.startswith("numpy")
    assert len([r for r in census.records if r.bytes == 12000]) == 1
    off = take_census(numpy_scan="off")
    assert not [r for r in off.records if r.bytes == 200000]
    full = take_census(numpy_scan="all")
    assert len([r for r in full.records if r.bytes == 200000]) == 1


def test_a_tensor_sharing_part_of_a_numpy_buffer_is_counted_once() -> None:
    import numpy as np

    gc.collect()
    base = np.arange(12345, dtype=np.float64)  # 98760 bytes, a size no other test object has
    tail = torch.from_numpy(base[345:])  # shares the last 12000 elements (96000 bytes)
    census = take_census()
    torch_part = [r for r in census.records if r.bytes == 96000]
    numpy_rest = [r for r in census.records if r.bytes == 98760 - 96000]
    assert len(torch_part) == 1 and torch_part[0].name != "" and len(numpy_rest) == 1
    assert not [r for r in census.records if r.bytes == 98760]  # the shared bytes are not counted twice
    assert tail.untyped_storage().nbytes() == 96000
