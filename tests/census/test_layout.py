"""The bulk type filter agrees with ``type(obj) in types`` on every object, on a real heap."""

from __future__ import annotations

import gc

import pytest
import torch

from tbmem._internal.census import heap, layout


class Disguised(torch.Tensor):
    """Claims to be something else: the filter must go by the real type, as ``type()`` does."""

    @property
    def __class__(self):  # type: ignore[override]
        return dict


def _types() -> frozenset[type]:
    return frozenset(heap.tensor_types() | heap.storage_types() | heap.node_types())


def test_the_fast_path_is_used_on_this_interpreter() -> None:
    assert layout.fast_path_available()  # CPython 3.11 here: losing it would cost the full scan its speed


@pytest.mark.parametrize("fast", [True, False])
def test_selection_equals_the_plain_filter_on_the_whole_heap(fast, monkeypatch) -> None:
    if not fast:
        monkeypatch.setattr(layout, "_FAST", False)
    keep = [torch.zeros(3), torch.nn.Parameter(torch.zeros(2)), torch.Tensor._make_subclass(Disguised, torch.ones(4)),
            torch.UntypedStorage(8), {"a": 1}, (1, 2), object()]
    objs = gc.get_objects() + keep
    types = _types()
    chosen = layout.select_types(objs, types)
    assert [id(o) for o in chosen] == [id(o) for o in objs if type(o) in types]
    assert len({id(o) for o in chosen if any(o is k for k in keep)}) == 4
    assert layout.select_types(objs, frozenset()) == []


def test_no_view_of_process_memory_outlives_a_selection() -> None:
    """The census's own views of memory must never show up as arrays in a census."""
    import numpy as np

    layout.select_types(gc.get_objects(), _types())
    gc.collect()
    referenced = gc.get_referents(*gc.get_objects())
    assert not [a for a in referenced if type(a) is np.ndarray and a.nbytes > 2**50]


def test_instances_on_both_sides_of_a_chunk_boundary_are_found_in_order() -> None:
    fillers = [[] for _ in range(3 * layout._CHUNK)]
    marks = {layout._CHUNK - 1: torch.zeros(1), layout._CHUNK: torch.ones(1), 2 * layout._CHUNK + 7: torch.zeros(2),
             len(fillers) - 1: torch.ones(3)}
    objs: list[object] = list(fillers)
    for i, t in marks.items():
        objs[i] = t
    chosen = layout.select_types(objs, frozenset({torch.Tensor}))
    assert [id(o) for o in chosen] == [id(marks[i]) for i in sorted(marks)]
