"""Arrays CPython does not track, and arrays in function locals, in both array-search modes (issue 12: 4)."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest
import torch

from tbmem._internal.census import take_census


class Holder:
    pass


HELD = Holder()


@pytest.mark.parametrize("mode", ["reachable", "all"])
def test_arrays_in_untracked_dicts_and_tuples_are_found(mode) -> None:
    """Defect 4: a dict or tuple holding only arrays is not gc-tracked, so a walk over tracked objects misses it."""
    in_dict = {"weights": np.zeros(11_111)}
    in_tuple = (np.zeros(11_113), np.zeros(11_117))
    nested = ((np.zeros(11_119),),)
    gc.collect()  # untracks the tuples whose items are all untracked: the inner one first,
    gc.collect()  # then the outer one
    assert not any(map(gc.is_tracked, (in_dict, in_tuple, nested, nested[0])))
    HELD.cache = {"state": np.zeros(11_131)}  # reachable from a tracked object through an untracked dict
    HELD.pair = (np.zeros(11_133),)
    local_refs = [in_dict, in_tuple, nested] if mode == "reachable" else []  # noqa: F841
    if mode == "all":
        gc.collect()
    expected = {n * 8 for n in (11_111, 11_113, 11_117, 11_119)} | (
        {11_131 * 8, 11_133 * 8} if mode == "all" else set())
    census = take_census(numpy_scan=mode)
    found = {r.bytes for r in census.records if r.name.startswith("numpy") and r.bytes in expected}
    assert found == expected
    del HELD.cache, HELD.pair


def test_all_mode_finds_arrays_held_only_by_function_locals() -> None:
    """Defect 4: running frames' locals are not gc objects; ``numpy_scan="all"`` must walk them too.

    (A frame's locals become visible to gc only once something creates its frame object, as a
    walk up the calling thread's stack does; another thread's waiting frame has none.)
    """
    ready, done = threading.Event(), threading.Event()

    def worker() -> None:
        only_there = np.zeros(12_347)  # noqa: F841 - held by this frame only
        ready.set()
        done.wait(30)

    thread = threading.Thread(target=worker)
    thread.start()
    try:
        assert ready.wait(30)
        census = take_census(numpy_scan="all")
    finally:
        done.set()
        thread.join()
    assert [(r.name, r.bytes) for r in census.records if r.bytes == 12_347 * 8] == [
        ("numpy worker:only_there", 12_347 * 8)]


# ---- issue 26, item 9: tbmem's own arrays are not the user's; arrays inside arrays of objects are found


def test_the_all_search_leaves_out_tbmem_s_own_arrays() -> None:
    """``numpy_scan="all"`` counted tbmem's lookup tables (16 B always, 65,600 B after the first census)
    and a census's own columns as the user's arrays."""
    from tbmem._internal.census import heap, layout, walk

    kept = take_census(numpy_scan="all")  # after a census: its lookup tables are cached
    tables = [layout._SHIFT, layout._MASK, *layout._lookup(frozenset(heap.tensor_types()))]
    found = {id(a) for a, _ in walk.all_arrays(heap.array_types())}
    assert [a.nbytes for a in tables if id(a) in found] == []
    big = [torch.zeros(1) for _ in range(25_000)]  # storages enough for the census to keep columns
    held = take_census(numpy_scan="off")  # a census result the user holds: its columns are tbmem's too
    del big
    columns = [getattr(b, column) for b in held.records.blocks for column in ("nbytes", "shape")]
    assert columns and all(isinstance(a, np.ndarray) for a in columns)
    found = {id(a) for a, _ in walk.all_arrays(heap.array_types())}
    assert not [a for a in columns if id(a) in found]
    user = np.zeros(3_333)
    census = take_census(numpy_scan="all")
    assert [r.bytes for r in census.records if r.bytes == user.nbytes] == [user.nbytes]
    del kept


@pytest.mark.parametrize("mode", ["reachable", "all"])
def test_arrays_inside_an_array_of_objects_are_found(mode) -> None:
    """A numpy array of Python objects refers to its items without the collector knowing."""
    gc.collect()
    inner = [np.zeros(7_001), np.zeros(7_003)]
    ragged = np.empty(3, dtype=object)
    ragged[0], ragged[1], ragged[2] = inner[0], {"deep": inner[1]}, "label"
    HELD.ragged = ragged
    del inner
    try:
        census = take_census(numpy_scan=mode)
    finally:
        del HELD.ragged
    found = sorted(r.bytes for r in census.records if r.bytes in (7_001 * 8, 7_003 * 8))
    assert found == [7_001 * 8, 7_003 * 8]
