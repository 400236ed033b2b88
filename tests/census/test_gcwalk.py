"""The heap pass in C sees exactly what ``gc.get_objects()`` lists, selected by exact type, in its order."""

from __future__ import annotations

import gc

import pytest
import torch

from tbmem.census import heap


class Disguised(torch.Tensor):
    """Claims to be something else: the selection must go by the real type, as ``type()`` does."""

    @property
    def __class__(self):  # type: ignore[override]
        return dict


def _types() -> tuple[type, ...]:
    return tuple(heap.tensor_types() | heap.storage_types() | heap.node_types())


def _walk():
    if not heap.C_HEAP_PASS:
        pytest.fail("tbmem/census/_gcwalk.c was not built: pip install -e . needs a C compiler")
    from tbmem.census._gcwalk import select_tracked

    return select_tracked


def test_the_c_heap_pass_is_built_here() -> None:
    assert heap.C_HEAP_PASS  # CPython 3.11 with gcc here: losing it would cost the full census 10 ms


def test_it_selects_what_get_objects_lists_in_the_same_order() -> None:
    select_tracked = _walk()
    keep = [torch.zeros(3), torch.nn.Parameter(torch.zeros(2)), torch.Tensor._make_subclass(Disguised, torch.ones(4)),
            torch.UntypedStorage(8), (torch.ones(2, requires_grad=True) * 2).grad_fn, {"a": 1}, object()]
    types = _types()
    wanted = set(types)
    expected = [o for o in gc.get_objects() if type(o) in wanted]
    chosen = select_tracked(types)
    assert [id(o) for o in chosen] == [id(o) for o in expected]
    assert [any(o is k for o in chosen) for k in keep] == [True] * 5 + [False] * 2  # a graph's node included
    assert select_tracked(()) == []


def test_frozen_objects_are_unseen_as_by_get_objects() -> None:
    select_tracked = _walk()
    t = torch.zeros(5)
    gc.freeze()
    try:
        assert not any(o is t for o in select_tracked((torch.Tensor,)))
        assert not any(o is t for o in gc.get_objects())
    finally:
        gc.unfreeze()
    assert any(o is t for o in select_tracked((torch.Tensor,)))


def test_bad_arguments_raise() -> None:
    select_tracked = _walk()
    with pytest.raises(TypeError, match="types must hold types, got int"):
        select_tracked((torch.Tensor, 3))
    with pytest.raises(TypeError, match="sequence"):
        select_tracked(7)


def test_full_scans_find_the_same_with_and_without_it(monkeypatch) -> None:
    _walk()
    keep = [torch.zeros(7), torch.nn.Parameter(torch.ones(3)), torch.UntypedStorage(16)]
    with_c = heap.find_instances(incremental=False)
    monkeypatch.setattr(heap, "_select_tracked", None)
    without = heap.find_instances(incremental=False)
    assert [id(o) for o in with_c.objects] == [id(o) for o in without.objects]
    assert all(any(o is k for o in with_c.objects) for k in keep)
