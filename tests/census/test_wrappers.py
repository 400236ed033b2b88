"""Wrapper tensor subclasses, jagged nested tensors and hostile subclasses (issue 12: 5, 13; issue 16: 10)."""

from __future__ import annotations

import gc
from typing import Any

import torch
from torch import nn

from tbmem._internal.census import take_census


def _storage_span(t: torch.Tensor) -> tuple[int, int]:
    s = t.untyped_storage()
    return s.data_ptr(), s.nbytes()


class Pair(torch.Tensor):
    """A minimal wrapper subclass (no storage of its own) over two inner tensors, like DTensor or TwoTensor."""

    @staticmethod
    def __new__(cls, a: torch.Tensor, b: torch.Tensor) -> "Pair":
        return torch.Tensor._make_wrapper_subclass(cls, a.shape, dtype=a.dtype, device=a.device)

    def __init__(self, a: torch.Tensor, b: torch.Tensor) -> None:
        self.a, self.b = a, b

    def __tensor_flatten__(self) -> tuple[list[str], Any]:
        return ["a", "b"], None

    @staticmethod
    def __tensor_unflatten__(inner: dict[str, torch.Tensor], meta: Any, size: Any, stride: Any) -> "Pair":
        return Pair(inner["a"], inner["b"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN206
        raise NotImplementedError(f"Pair does not support {func}")


def test_wrapper_subclasses_count_their_inner_tensors_without_notes(tbmem_log) -> None:
    """Defect 5: the wrapper's storage has no data pointer; its inner tensors hold the memory."""
    gc.collect()
    pair = Pair(torch.zeros(1_111), torch.ones(2_222))
    expected = {_storage_span(pair.a), _storage_span(pair.b)}
    census = take_census()
    assert census.notes == []
    rows = [(r.name, r.category, r.bytes) for r in census.records if r.bytes in {n for _, n in expected}]
    assert sorted(rows) == [("pair", "other", 1_111 * 4), ("pair", "other", 2_222 * 4)]  # what holds it


def test_jagged_nested_tensors_count_their_values_and_offsets_without_notes(tbmem_log) -> None:
    """Defects 5 and 13: a jagged nested tensor is a wrapper over values, offsets and cached lengths."""
    gc.collect()
    before = take_census()
    jagged = torch.nested.nested_tensor([torch.randn(37, 8), torch.randn(51, 8)], layout=torch.jagged)
    names, _ = type(jagged).__tensor_flatten__(jagged)
    inner = [getattr(jagged, n) for n in names]
    expected = sum(dict(_storage_span(t) for t in inner if t is not None).values())
    assert expected >= (37 + 51) * 8 * 4 + 3 * 8  # values, offsets (3 x int64), and the seqlen caches
    del inner
    census = take_census()
    assert census.notes == [] and not [r for r in tbmem_log.records if "could not be measured" in r.getMessage()]
    assert census.total_bytes - before.total_bytes == expected
    assert {r.name for r in census.records if r.bytes == (37 + 51) * 8 * 4} == {"jagged"}


class Hostile(torch.Tensor):
    """Every attribute the class does not define, and ``__class__``, raise."""

    @property
    def __class__(self):  # type: ignore[override]
        raise RuntimeError("no __class__ for you")

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"no {name} for you")


def test_a_hostile_subclass_does_not_empty_the_parameters_category(tbmem_log) -> None:
    """Issue 16, item 10: ``isinstance(t, nn.Parameter)`` reads ``__class__`` and ``_is_param``."""
    gc.collect()
    hostile = torch.Tensor._make_subclass(Hostile, torch.zeros(4_321))
    free = nn.Parameter(torch.zeros(2_345))  # found by the scan, in no watched model
    model = nn.Linear(3, 5)
    census = take_census(models=[model])
    assert census.by_category["parameters"] == (3 * 5 + 5) * 4 + free.numel() * 4
    assert [r.category for r in census.records if r.bytes == hostile.untyped_storage().nbytes()] == ["other"]


class _Elem(torch.Tensor):
    """The older wrapper style: ``self.elem`` and ``__torch_dispatch__``, no ``__tensor_flatten__``."""

    @staticmethod
    def __new__(cls, elem: torch.Tensor) -> "_Elem":
        return torch.Tensor._make_wrapper_subclass(cls, elem.shape, dtype=elem.dtype, device=elem.device,
                                                   requires_grad=elem.requires_grad)

    def __init__(self, elem: torch.Tensor) -> None:
        self.elem = elem

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN206
        unwrap = lambda x: x.elem if isinstance(x, _Elem) else x  # noqa: E731
        out = func(*[unwrap(a) for a in args], **{k: unwrap(v) for k, v in (kwargs or {}).items()})
        return _Elem(out) if isinstance(out, torch.Tensor) else out


def test_a_wrapper_without_tensor_flatten_used_as_a_parameter_counts_as_parameters(tbmem_log) -> None:
    """Issue 26, item 5: ``nn.Parameter(wrapper)`` counted as "other" (and noted as without storage)."""
    gc.collect()
    layer = nn.Module()
    layer.weight = nn.Parameter(_Elem(torch.ones(123, 45)))
    assert type(layer.weight) is _Elem
    census = take_census(models=[layer])
    assert census.by_category["parameters"] == _storage_span(layer.weight.elem)[1] == 123 * 45 * 4
    assert census.notes == [] and not tbmem_log.records
    unwatched = take_census()  # found by the scan: still parameters
    assert [r.category for r in unwatched.records if r.bytes == 123 * 45 * 4] == ["parameters"]


def test_adam_state_of_a_torch_testing_subclass_is_optimizer_state() -> None:
    """Issue 26, item 5: subclasses defined under torch.testing (TwoTensor) were skipped by the type listing."""
    from torch.testing._internal.two_tensor import TwoTensor

    gc.collect()
    param = nn.Parameter(TwoTensor(torch.randn(30, 20), torch.randn(30, 20)))
    opt = torch.optim.Adam([param], foreach=False)
    param.grad = TwoTensor(torch.ones(30, 20), torch.ones(30, 20))
    opt.step()
    state = opt.state[param]
    assert type(state["exp_avg"]) is TwoTensor
    inner = [t for key in ("exp_avg", "exp_avg_sq") for t in (state[key].a, state[key].b)]
    step = state["step"]
    expected = sum(_storage_span(t)[1] for t in inner) + sum(_storage_span(t)[1] for t in (
        [step.a, step.b] if type(step) is TwoTensor else [step]))
    census = take_census(optimizers=[opt])
    assert census.by_category["optimizer_state"] == expected
    assert census.by_category["parameters"] == 2 * 30 * 20 * 4
