"""Wrapper tensor subclasses, jagged nested tensors and hostile subclasses (issue 12: 5, 13; issue 16: 10)."""

from __future__ import annotations

import gc
from typing import Any

import torch
from torch import nn

from tbmem.census import take_census


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
    assert sorted(rows) == [("Pair", "other", 1_111 * 4), ("Pair", "other", 2_222 * 4)]


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
    assert {r.name for r in census.records if r.bytes == (37 + 51) * 8 * 4} == {"NestedTensor"}


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
