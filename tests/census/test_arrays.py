"""Arrays CPython does not track, and arrays in function locals, in both array-search modes (issue 12: 4)."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest

from tbmem.census import take_census


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
