"""The oldest generation walked in stretches side by side (``select_tracked_from`` in _gcwalk.c), and its anchors."""

from __future__ import annotations

import gc

import pytest
import torch

from tbmem._internal.census import heap
from tests.census.test_gcwalk import _module, _one_thread_at_a_time, _types  # noqa: F401 (the fixture: autouse)


def test_the_walk_in_stretches_gives_select_tracked_object_for_object() -> None:
    module = _module()
    keep = [torch.zeros(n) for n in range(1, 300)]
    gc.collect()  # most of the heap in the oldest generation, where the stretches are
    types = _types()
    plain = module.select_tracked(types)
    _, candidates, length = module.select_tracked_from(types, [], 64)
    assert length > 1000 and candidates
    anchors = candidates[1::max(1, len(candidates) // 15)][:15]
    objects, _, walked = module.select_tracked_from(types, anchors, 64)
    assert [id(o) for o in objects] == [id(o) for o in plain] and walked == length
    del anchors[0]  # one anchor gone, another moved out of the oldest list: still the same result
    young = anchors[1]
    gc.freeze()
    gc.unfreeze()
    assert [id(o) for o in module.select_tracked_from(types, anchors, 0)[0]] == [
        id(o) for o in module.select_tracked(types)]
    del keep, young


def test_a_stretch_that_ends_in_another_list_means_one_plain_walk() -> None:
    module = _module()
    gc.collect()
    types = _types()
    _, candidates, _ = module.select_tracked_from(types, [], 32)
    anchors = candidates[2::max(1, len(candidates) // 8)][:8]
    gc.freeze()  # every anchor is now in the permanent generation: the stretches end at its head
    try:
        objects, _, _ = module.select_tracked_from(types, anchors, 0)
        assert [id(o) for o in objects] == [id(o) for o in module.select_tracked(types)]
    finally:
        gc.unfreeze()


def _anchor_gaps(anchors: list) -> tuple[int, list[int]]:
    """The oldest list's length and the gaps between the anchors' places in it (objects between)."""
    ids = {id(a) for a in anchors}
    oldest = gc.get_objects(generation=2)
    places = [i for i, o in enumerate(oldest) if id(o) in ids]
    assert len(places) == len(anchors), "an anchor is not in the oldest generation"
    return len(oldest), [b - a for a, b in zip([0, *places], [*places, len(oldest)])]


@pytest.mark.skipif(not heap.FROZEN_READABLE, reason="the lists are walked in stretches on CPython 3.10 and 3.11 only")
def test_own_anchors_are_placed_evenly_and_stay_there_through_full_collections() -> None:
    module = _module()
    # a heap region without weakly referenceable objects: anchors picked among the heap's objects
    # could not go there, so the walk of it was one long stretch
    bulk = [[i] for i in range(60_000)]
    keep = [torch.zeros(n) for n in range(1, 200)]
    gc.collect()
    types = _types()
    anchors = module.own_anchors()
    assert module.own_anchors() == anchors and all(a == [] for a in anchors)  # the same lists every time
    length = len(gc.get_objects(generation=2))
    for call in range(3):
        objects, candidates, walked = module.select_tracked_from(types, anchors, max(1, length // 128), True)
        assert [id(o) for o in objects] == [id(o) for o in module.select_tracked(types)], call
        assert candidates == []
    length, gaps = _anchor_gaps(anchors)
    even = length / (len(anchors) + 1)
    assert max(gaps) < 2 * even, (even, gaps)  # before: one stretch held the 60k lists
    for _ in range(2):  # a full collection moves what it first takes for unreachable, never a root
        gc.collect()
        length, after = _anchor_gaps(anchors)
        assert max(after) < 2 * even, (even, after)
    gc.freeze()  # anchors moved to the permanent generation: one plain walk, and they come back
    try:
        objects, _, _ = module.select_tracked_from(types, anchors, max(1, length // 128), True)
        assert [id(o) for o in objects] == [id(o) for o in module.select_tracked(types)]
    finally:
        gc.unfreeze()
    module.select_tracked_from(types, anchors, max(1, length // 128), True)
    assert max(_anchor_gaps(anchors)[1]) < 2 * even
    del bulk, keep


@pytest.mark.skipif(not heap.FROZEN_READABLE, reason="the lists are walked in stretches on CPython 3.10 and 3.11 only")
def test_a_plain_walk_that_passes_its_own_anchors_never_moves_one_after_another() -> None:
    """A young anchor sends the walk back to one plain walk, in which the other anchors are objects
    like any; with a position at every object they are among the places an anchor may go."""
    module = _module()
    types = _types()
    anchors = module.own_anchors()
    gc.collect()
    module.select_tracked_from(types, anchors, 64, True)  # the anchors in the oldest list
    for spacing in (1, 2, 3):
        young = []  # a young, empty list: an anchor in another list
        objects, _, walked = module.select_tracked_from(types, [young, *anchors], spacing, True)
        assert [id(o) for o in objects] == [id(o) for o in module.select_tracked(types)]
        assert walked == len(gc.get_objects(generation=2)) - 1  # the young anchor was moved there after
        gc.collect()  # a list the move had broken would crash or lose objects here
        oldest = gc.get_objects(generation=2)
        assert len({id(o) for o in oldest}) == len(oldest)  # each object once: no anchor linked twice
        _anchor_gaps(anchors)  # every anchor still in the oldest list
