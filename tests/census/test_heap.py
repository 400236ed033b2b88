"""The heap scan: full and incremental scans find the same instances; doubt means a full scan."""

from __future__ import annotations

import gc
import weakref
from typing import Iterator

import pytest
import torch

from tbmem._internal.census import heap, take_census
from tests._extensions import not_built

pytestmark = pytest.mark.skipif(not heap.INCREMENTAL_SUPPORTED, reason="needs CPython's generational gc")


class Late(torch.Tensor):
    pass


FULL = ("referrers", "objects")  # the two full-scan methods (the second above 12 target types)


def _ids(found: heap.Found) -> set[int]:
    """The instances found, less the Python objects of C++ autograd nodes: those cannot be weakly referenced,
    so an incremental scan finds only the young ones (docs/census.md, "Blind spots"); torch.compile's
    tracing leaves a few behind for good, holding nothing, which other tests of this process made."""
    cpp = heap.cpp_node_types()
    return {id(o) for o in found.objects if type(o) not in cpp}


def test_incremental_scan_finds_exactly_what_a_full_scan_finds(no_automatic_gc) -> None:
    old = [torch.zeros(3), torch.zeros(4), torch.nn.Parameter(torch.zeros(5))]
    heap.find_instances()
    new = [torch.ones(6), torch.nn.Parameter(torch.ones(7)), torch.zeros(8).as_subclass(Late)]
    gone = weakref.ref(old.pop(0))
    assert gone() is None
    incremental = heap.find_instances()
    full = heap.find_instances(incremental=False)
    assert incremental.method == "young" and full.method in FULL
    assert _ids(incremental) == _ids(full)
    assert {id(t) for t in old + new} <= _ids(incremental)


def test_a_collection_that_promotes_young_objects_forces_a_full_scan(no_automatic_gc) -> None:
    heap.find_instances()
    promoted = torch.zeros(9)
    gc.collect(1)  # generation 1 -> 2: the young generations no longer hold every new object
    assert any(o is promoted for o in gc.get_objects(generation=2))
    again = heap.find_instances()
    assert again.method in FULL
    assert any(o is promoted for o in again.objects)


def test_the_index_of_survivors_keeps_nothing_alive(no_automatic_gc) -> None:
    doomed = torch.zeros(10)
    ref = weakref.ref(doomed)
    heap.find_instances()
    del doomed
    assert ref() is None
    assert not any(o is None for o in heap.find_instances().objects)


@pytest.mark.parametrize("incremental", [True, False])
def test_a_subclass_seen_without_instances_is_found_once_it_has_one(no_automatic_gc, incremental) -> None:
    class Later(torch.Tensor):
        pass

    first = heap.find_instances()
    assert not [o for o in first.objects if type(o) is Later]
    del first
    later = torch.zeros(321).as_subclass(Later)
    again = heap.find_instances(incremental=incremental)
    assert again.method == "young" if incremental else again.method in FULL
    assert any(o is later for o in again.objects)


def test_consecutive_censuses_agree_with_a_full_one(no_automatic_gc) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.Adam(model.parameters())
    take_census(models=[model], optimizers=[opt])
    for _ in range(2):
        batch, scratch = torch.randn(64, 16), torch.zeros(777)
        loss = model(batch).square().mean()
        incremental = take_census(models=[model], optimizers=[opt], roots=[loss])
        full = take_census(models=[model], optimizers=[opt], roots=[loss], full_scan=True)
        assert (incremental.heap_scan, full.heap_scan) == ("incremental", "full")
        assert incremental.by_category == full.by_category
        assert [r.category for r in incremental.records if r.bytes == scratch.numel() * 4] == ["other"]
        loss.backward()
        opt.step()
        opt.zero_grad()
    assert "incremental heap scan" in incremental.to_markdown()


@pytest.mark.skipif(not getattr(heap, "FROZEN_READABLE", True), reason="the permanent generation is read on CPython 3.10/3.11 with the "
                                                   "C extension")
def test_tensors_frozen_by_gc_freeze_are_counted() -> None:
    """Issue 26, item 7: frozen tensors (gc.freeze() before forking DataLoader workers) counted 0."""
    hidden = {"cache": [torch.zeros(4321), torch.ones(1234, dtype=torch.float64)]}
    expected = sorted(t.untyped_storage().nbytes() for t in hidden["cache"])
    gc.freeze()
    try:
        census = take_census()
        again = take_census()  # incremental or not, the same
    finally:
        gc.unfreeze()
    for c in (census, again):
        assert sorted(r.bytes for r in c.records if r.bytes in expected) == expected
        assert not any("gc.freeze()" in note for note in c.notes)


def test_where_frozen_objects_cannot_be_read_the_roots_handed_over_find_their_tensors(monkeypatch) -> None:
    """Without the permanent generation (Python 3.12+, no C extension), what the census is handed still counts,
    and the census says that the rest of the frozen objects is unseen."""
    monkeypatch.setattr(heap, "FROZEN_READABLE", False)
    model = torch.nn.Linear(40, 30)
    batch = {"x": torch.zeros(2345), "y": [torch.ones(321)]}
    stray = torch.zeros(5555)
    gc.freeze()
    try:
        census = take_census(models=[model], roots=[batch])
    finally:
        gc.unfreeze()
    assert census.by_category["parameters"] == (40 * 30 + 30) * 4
    rows = sorted((r.name, r.bytes) for r in census.records if r.name.startswith("root"))
    assert rows == [("root['x']", 2345 * 4), ("root['y'][0]", 321 * 4)]
    assert not [r for r in census.records if r.bytes == stray.numel() * 4]
    assert any("gc.freeze()" in note and "not counted" in note for note in census.notes)


def _needs_hook() -> None:
    if not heap.CAPTURE_SUPPORTED:
        not_built("tbmem/_internal/census/_gcwalk.c was not built: no gc hook notes promoted instances")


def _hooks() -> list:
    """tbmem's census hooks in ``gc.callbacks``."""
    return [cb for cb in gc.callbacks if getattr(cb, "args", ())[:1] == (heap._on_collection,)]


@pytest.fixture
def capture() -> Iterator[None]:
    _needs_hook()
    heap.start_capture()
    try:
        yield
    finally:
        heap.stop_capture()


@pytest.mark.parametrize("generation", [1, 2])
def test_with_capture_promoted_instances_are_still_found_incrementally(no_automatic_gc, capture, generation) -> None:
    heap.find_instances()
    promoted = [torch.zeros(9), torch.nn.Parameter(torch.zeros(2))]
    gc.collect(generation)
    assert all(any(o is t for o in gc.get_objects(generation=2)) for t in promoted)
    again = heap.find_instances()
    full = heap.find_instances(incremental=False)
    assert again.method == "young" and full.method in FULL
    assert _ids(again) == _ids(full)
    assert {id(t) for t in promoted} <= _ids(again)


def test_a_tensor_type_defined_after_the_scan_forces_a_full_scan_after_a_promotion(no_automatic_gc,
                                                                                    capture) -> None:
    heap.find_instances()

    class Newer(torch.Tensor):
        pass

    newer = torch.zeros(5).as_subclass(Newer)
    gc.collect(1)  # the callback looked only for the types the last scan knew
    again = heap.find_instances()
    assert again.method in FULL
    assert any(o is newer for o in again.objects)


def test_a_collection_the_callback_did_not_see_forces_a_full_scan(no_automatic_gc) -> None:
    heap.start_capture()
    heap.find_instances()
    heap.stop_capture()
    gc.collect(1)
    heap.start_capture()
    try:
        assert heap.find_instances().method in FULL
    finally:
        heap.stop_capture()


def test_capture_is_counted_and_removed_with_its_last_user(tmp_path) -> None:
    from tbmem import MemoryWriter

    _needs_hook()
    assert not _hooks()
    with MemoryWriter(tmp_path / "a", census_every=5), MemoryWriter(tmp_path / "b", census_every=5):
        assert _hooks() == [heap._hook]
    assert not _hooks() and heap._hook is None
    MemoryWriter(tmp_path / "c", census_every=0).close()
    assert not _hooks()


def test_a_ctrl_c_handled_inside_the_hook_leaves_no_promotion_unnoted(no_automatic_gc, capture, monkeypatch) -> None:
    """The handler of a signal that arrived during the collection may raise anywhere in the hook's Python part:
    whatever it had noted is dropped, so the next scan is a full one, not one that misses the promoted."""
    heap.find_instances()
    promoted = torch.zeros(4242)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(heap, "_split_marker", interrupted)
    with pytest.raises(KeyboardInterrupt):  # raised again after the collection, in this code
        gc.collect(1)
    monkeypatch.undo()
    again = heap.find_instances()
    assert again.method in FULL
    assert any(o is promoted for o in again.objects)


def test_a_ctrl_c_during_a_collection_stops_the_program() -> None:
    """A SIGINT that arrives while the collector runs is handled at the first Python instruction after it:
    in a Python gc callback, the collector would print the KeyboardInterrupt and drop it, and the program
    would go on (it did: a trainer ran its 500 epochs after Ctrl-C). A subprocess: a signal, a long
    collection, nothing else installed."""
    _needs_hook()
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import gc, signal, sys, time
        from tbmem._internal.census import heap
        dropped = []
        sys.unraisablehook = lambda u: dropped.append(u.exc_type.__name__)
        heap.start_capture()
        heap.find_instances()
        junk = [[] for _ in range(1_000_000)]  # a collection of the oldest generation that takes 100 ms
        start = time.perf_counter()
        gc.collect()
        took = time.perf_counter() - start
        signal.signal(signal.SIGALRM, signal.default_int_handler)  # Ctrl-C's handler, on a timer
        collections = gc.get_stats()[2]["collections"]
        try:
            signal.setitimer(signal.ITIMER_REAL, took / 20)  # during the next collection
            gc.collect()
            for _ in range(100_000):
                pass
            print("ran on", dropped)
        except KeyboardInterrupt:
            print("interrupted after", gc.get_stats()[2]["collections"] - collections, "collection", dropped)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "interrupted after 1 collection []", proc.stdout


# --- audit of issue 12 -------------------------------------------------------------------------
def _records_of(census, nbytes: int) -> list:
    return [r for r in census.records if r.bytes == nbytes]


def test_tensors_moved_to_the_oldest_generation_by_freeze_and_unfreeze_are_found(no_automatic_gc) -> None:
    """Defect 1: gc.unfreeze() moves young objects to generation 2 without a collection."""
    take_census()
    made = torch.zeros(54_321)
    expected = made.untyped_storage().nbytes()
    gc.freeze()
    gc.unfreeze()  # the freeze count is back to its old value and no collection ran
    assert any(o is made for o in gc.get_objects(generation=2))
    found = heap.find_instances()
    assert any(o is made for o in found.objects)
    census = take_census()
    assert [(r.category, r.bytes) for r in _records_of(census, expected)] == [("other", expected)]


def test_freeze_and_unfreeze_between_promotions_the_callback_saw_are_noticed(no_automatic_gc, capture) -> None:
    """Defect 1, with the gc callback installed: a later observed collection must not hide the unfreeze."""
    heap.find_instances()
    made = torch.zeros(54_322)
    gc.freeze()
    gc.unfreeze()
    gc.collect(1)  # seen by the callback, which must notice that the young objects were moved before it
    assert any(o is made for o in heap.find_instances().objects)


class Rare(torch.Tensor):
    pass


class Scarce(torch.Tensor):
    pass


def test_subclass_instances_hidden_by_a_freeze_during_a_census_are_found_after_unfreeze(no_automatic_gc) -> None:
    """Defect 2: a census that could not see the instances must not conclude that there are none."""
    rare = torch.Tensor._make_subclass(Rare, torch.zeros(4_567))  # the only owner of its storage
    expected = rare.untyped_storage().nbytes()
    gc.freeze()
    try:
        frozen = take_census(full_scan=True)
    finally:
        gc.unfreeze()
    assert bool(_records_of(frozen, expected)) == heap.FROZEN_READABLE  # read in the permanent generation
    for full_scan in (True, False):
        census = take_census(full_scan=full_scan)
        assert [(r.name, r.bytes) for r in _records_of(census, expected)] == [("rare", expected)]  # named after the local holding it


def test_subclass_instances_are_found_after_another_reference_to_the_class_was_dropped(no_automatic_gc) -> None:
    """Defect 2: the class's reference count is no proof that it has no instances."""
    extra = [Scarce]  # some other reference to the class, dropped later
    take_census(full_scan=True)
    del extra
    scarce = torch.Tensor._make_subclass(Scarce, torch.zeros(4_569))
    expected = scarce.untyped_storage().nbytes()
    census = take_census(full_scan=True)
    assert [(r.name, r.bytes) for r in _records_of(census, expected)] == [("scarce", expected)]


# --- the types are listed once and kept while no class is defined (tbmem._internal.census.kinds) -----------
@pytest.fixture
def listings(monkeypatch) -> list[bool]:
    """Each listing of the types the scan looks for."""
    from tbmem._internal.census import kinds

    made: list[bool] = []
    real = kinds.list_kinds

    def counting(holders: bool) -> kinds.Kinds:
        made.append(holders)
        return real(holders)

    monkeypatch.setattr(heap, "list_kinds", counting)
    return made


def test_the_types_are_listed_again_only_when_a_class_that_may_be_one_was_defined(no_automatic_gc, listings,
                                                                                   monkeypatch) -> None:
    heap.find_instances()
    assert len(listings) == 1
    kept = [torch.zeros(3) for _ in range(3)]
    for _ in range(3):
        assert heap.find_instances().method == "young"
    assert len(listings) == 1  # no class defined since: the listing is kept

    class Unrelated(dict):  # derives from no type looked for (as torch.save's pickler class per call)
        pass

    assert heap.find_instances().method == "young"
    assert len(listings) == 1

    class Meta(type):  # a metaclass: the classes it makes must be recognised as classes
        pass

    heap.find_instances()
    assert len(listings) == 2

    class Mixin:
        pass

    class Derived(Mixin, torch.nn.Parameter):  # a tensor type, reached through its second base
        pass

    found = heap.find_instances()
    assert len(listings) == 3 and Derived in found.tensor_types
    heap.find_instances()
    assert len(listings) == 3 and kept

    class Holder:  # PhiML imported since: its holder class is a root of its own, no subclass of any
        pass

    from tbmem._internal.census import kinds

    for module in (heap, kinds):
        monkeypatch.setattr(module, "holder_types", lambda: {Holder})
    found = heap.find_instances(holders=True)
    assert len(listings) == 4 and Holder in found.holder_types


def test_a_tensor_type_defined_since_the_last_scan_is_found_incrementally(no_automatic_gc, listings) -> None:
    heap.find_instances()
    heap.find_instances()

    class Brand(torch.Tensor):
        pass

    brand = torch.zeros(6).as_subclass(Brand)
    found = heap.find_instances()
    assert found.method == "young" and Brand in found.tensor_types
    assert any(o is brand for o in found.objects)
    assert _ids(found) == _ids(heap.find_instances(incremental=False))


def test_an_autograd_function_defined_since_the_last_scan_has_its_nodes_found(no_automatic_gc) -> None:
    heap.find_instances()

    class Twice(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):  # type: ignore[override]
            ctx.save_for_backward(x)
            return 2 * x

        @staticmethod
        def backward(ctx, grad):  # type: ignore[override]
            return 2 * grad

    node = Twice.apply(torch.ones(3, requires_grad=True)).grad_fn  # the graph's only holder
    found = heap.find_instances()
    assert found.method == "young" and type(node) in found.node_types
    assert any(o is node for o in found.objects)


def test_a_class_promoted_before_the_next_scan_is_noticed_by_the_callback(no_automatic_gc, capture,
                                                                        listings) -> None:
    heap.find_instances()
    heap.find_instances()
    assert len(listings) == 1

    class Promoted(torch.Tensor):
        pass

    promoted = torch.zeros(7).as_subclass(Promoted)
    gc.collect(1)  # the class and its instance leave the young generations
    assert not any(o is Promoted for o in gc.get_objects(generation=0) + gc.get_objects(generation=1))
    found = heap.find_instances()
    assert len(listings) >= 2 and Promoted in found.tensor_types
    assert any(o is promoted for o in found.objects)

    heap.find_instances()
    count = len(listings)

    class Harmless:  # a class that derives from no type looked for, promoted: nothing to list again
        pass

    gc.collect(1)
    assert heap.find_instances().method == "young" and len(listings) == count

    class Later(torch.nn.Parameter):  # a tensor type, promoted: seen by the callback, listed again
        pass

    gc.collect(1)
    found = heap.find_instances()
    assert found.method in FULL and len(listings) > count and Later in found.tensor_types
    assert Harmless
