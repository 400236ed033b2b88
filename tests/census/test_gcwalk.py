"""The heap pass in C sees exactly what ``gc.get_objects()`` lists, selected by exact type, in its order."""

from __future__ import annotations

import gc
import sys
import warnings
import weakref

import numpy as np
import pytest
import torch
from torch import nn

from tbmem._internal.census import heap
from tests._extensions import not_built


class Disguised(torch.Tensor):
    """Claims to be something else: the selection must go by the real type, as ``type()`` does."""

    @property
    def __class__(self):  # type: ignore[override]
        return dict


@pytest.fixture(autouse=True)
def _one_thread_at_a_time():
    """Each test compares the walk with ``gc.get_objects()`` as the heap is at that moment. Another Python
    thread (one an earlier test in this process left running: a writer's, a server's) that ran in between
    would add or free objects between the two. With a long switch interval this thread keeps the interpreter
    until it blocks; the other threads wait."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(30.0)
    yield
    sys.setswitchinterval(before)


def _types() -> tuple[type, ...]:
    return tuple(heap.tensor_types() | heap.storage_types() | heap.node_types())


def _walk():
    """The C walk; skipped where the install had no C compiler, except under
    ``TBMEM_REQUIRE_C_EXTENSION=1`` (set by .ci/run), where that is a failure."""
    if not heap.C_HEAP_PASS:
        not_built("tbmem/_internal/census/_gcwalk.c was not built: the install found no C compiler")
    from tbmem._internal.census._gcwalk import select_tracked

    return select_tracked


def test_the_c_heap_pass_is_built_and_used() -> None:
    _walk()  # losing it would cost every full census about 10 ms at 350k objects
    assert heap._select_from is not None


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
    monkeypatch.setattr(heap, "_select_from", None)  # the one Python fallback: gc.get_objects()
    without = heap.find_instances(incremental=False)
    assert [id(o) for o in with_c.objects] == [id(o) for o in without.objects]
    assert all(any(o is k for o in with_c.objects) for k in keep)


def test_objects_of_garbage_cycles_survive_the_collection_the_result_list_can_start() -> None:
    """Creating the result list may collect: the chosen objects must be referenced before it is (a
    subprocess, because getting this wrong is a use-after-free)."""
    _walk()
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import gc, torch
        from tbmem._internal.census._gcwalk import select_tracked
        gc.disable()
        for i in range(50):  # garbage: each tensor only in a reference cycle
            box = {"t": torch.full((4,), float(i))}
            box["self"] = box
            del box
        collections = []
        gc.callbacks.append(lambda phase, info: collections.append(phase))
        drain = [[] for _ in range(200)]  # empties the list free list: the result list is a new gc object
        gc.set_threshold(1)  # and creating it collects generation 0, the cycles included
        gc.enable()
        found = select_tracked((torch.Tensor,))
        gc.disable()
        assert collections == ["start", "stop"], collections
        values = sorted(float(t[0]) for t in found if t.shape == (4,))
        assert values == [float(i) for i in range(50)], values
        print("ok")
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def _module():
    _walk()
    from tbmem._internal.census import _gcwalk

    missing = {"select_listed", "subclasses", "instances_below", "walk_graph", "select_tracked_from", "own_anchors",
               "select_frozen", "weak_refs", "tensor_facts", "storage_facts"} - set(dir(_gcwalk))
    if missing:  # a build of an older _gcwalk.c: `make install` (or build_ext --inplace) rebuilds it
        not_built(f"tbmem/_internal/census/_gcwalk.c was built before {sorted(missing)} existed: rebuild it")
    return _gcwalk


class _Slots:
    __slots__ = ("a", "b")


class _Plain:
    pass


def _graphs() -> list[object]:
    """Objects of every shape the frame walk meets: instances with dicts and slots, containers nested
    and huge (beyond the budget), arrays and tensor views of arrays, modules and functions it must not
    enter, and a cycle."""
    import numpy as np

    arrays = [np.zeros(n) for n in range(1, 9)]
    plain = _Plain()
    plain.arrays, plain.me, plain.fn, plain.module = arrays[:2], plain, len, np
    slots = _Slots()
    slots.a, slots.b = {"x": arrays[2], "y": (arrays[3], [arrays[4]])}, np.ndarray
    huge_list = [0] * 50 + [arrays[5]] + [1] * 50
    huge_dict = {i: (arrays[6] if i == 30 else i) for i in range(100)}
    return [arrays[7], plain, slots, huge_list, huge_dict, {arrays[0].tobytes()}, frozenset({1, 2}),
            (huge_list, huge_dict), torch.zeros(2), [[[[arrays[1]]]]], 7, "text", _Plain]


@pytest.mark.parametrize("depth", [0, 1, 2, 3])
@pytest.mark.parametrize("budget", [0, 1, 5, 40, 60, 150, 10_000])
def test_instances_below_in_c_finds_what_python_finds_and_spends_the_same_budget(depth, budget) -> None:
    import numpy as np

    from tbmem._internal.census import walk

    instances_below = _module().instances_below
    atypes = {np.ndarray}
    for obj in _graphs():
        python_budget, c_budget = [budget], [budget]
        expected = list(walk._instances_below(obj, atypes, depth, python_budget))
        got = instances_below(obj, atypes, depth, c_budget)
        assert [id(o) for o in got] == [id(o) for o in expected], type(obj)
        assert c_budget == python_budget


def test_instances_below_shares_one_budget_between_calls() -> None:
    import numpy as np

    from tbmem._internal.census import walk

    instances_below = _module().instances_below
    objs, budget, python_budget = _graphs(), [60], [60]
    found = [[id(a) for a in instances_below(o, {np.ndarray}, 2, budget)] for o in objs]
    expected = [[id(a) for a in walk._instances_below(o, {np.ndarray}, 2, python_budget)] for o in objs]
    assert found == expected and budget == python_budget
    assert budget[0] <= 0 and not any(found[4:])  # the walk stopped where the budget ran out
    with pytest.raises(TypeError):
        instances_below(objs[0], {np.ndarray}, 2, 5)
    with pytest.raises(ValueError):
        instances_below(objs[0], {np.ndarray}, 2, [])


def test_select_listed_picks_by_exact_type_in_order_and_sees_the_marker() -> None:
    select_listed = _module().select_listed
    marker = object()
    objs = [torch.zeros(1), 3, torch.nn.Parameter(torch.zeros(1)), marker,
            torch.Tensor._make_subclass(Disguised, torch.ones(1)), "s"]
    types = frozenset({torch.Tensor, Disguised})
    chosen, marked = select_listed(objs, types, marker)
    assert [id(o) for o in chosen] == [id(objs[0]), id(objs[4])] and marked
    assert select_listed(objs, set(types), object()) == (chosen, False)
    with pytest.raises(TypeError):
        select_listed(objs, tuple(types), None)


def test_subclasses_in_c_lists_what_python_lists(monkeypatch) -> None:
    from tbmem._internal.census import kinds

    subclasses = _module().subclasses

    class Base:
        pass

    class Child(Base):
        pass

    class Grandchild(Child, torch.nn.Module):
        pass

    monkeypatch.setattr(kinds, "_subclasses_c", None)  # kinds.subclasses: its Python twin from here on
    for root in (Base, torch.Tensor, torch._C._FunctionBase, torch.UntypedStorage, type, object):
        assert subclasses(root) == kinds.subclasses(root)
    assert subclasses(Base) == {Base, Child, Grandchild}
    assert kinds.subclasses(Base) == {Base, Child, Grandchild}
    with pytest.raises(TypeError):
        subclasses(3)


class _Saved:
    def __init__(self, data: object) -> None:
        self.data = data


class _Node:
    """A stand-in autograd node: what the walk reads of one, and every way reading it can fail."""

    def __init__(self, nexts: object, saved: object = None) -> None:
        self._nexts, self._saved = nexts, saved

    @property
    def next_functions(self) -> object:
        if isinstance(self._nexts, Exception):
            raise self._nexts
        return self._nexts


class _One(_Node):
    @property
    def _raw_saved_self(self) -> object:
        if self._saved is None:
            raise RuntimeError("released")  # what a released tensor list raises
        return self._saved


class _Two(_One):
    @property
    def _raw_saved_other(self) -> object:
        # no .data: skipped like None
        return self.__dict__.setdefault("_other", [_Saved(torch.ones(2)), _Saved(None), object()])


class _Hostile(_Node):
    @property
    def _raw_saved_self(self) -> object:
        raise KeyError("not a RuntimeError: the node is reported")


def _fake_graph() -> list[_Node]:
    leaf = _One(())
    shared = _Two(((leaf, 0), (None, 0)), _Saved(torch.zeros(3)))
    return [
        _One(((shared, 0), (leaf, 1)), (_Saved(torch.zeros(1)), _Saved(None))),
        _Two(((shared, 0),), None),
        _Hostile(((leaf, 0),)),
        _One(ValueError("no edges"), _Saved(torch.zeros(4))),
        _One([(leaf, 0, 1)], _Saved(torch.zeros(5))),  # cannot be unpacked as (node, index)
        _One([[shared, 2]], _Saved(torch.zeros(6))),  # a list pair unpacks fine
        None,
    ]


def test_the_graph_walk_in_c_reads_what_python_reads(monkeypatch) -> None:
    from tbmem._internal.census import scan

    _module()
    nodes = _fake_graph()

    def walk() -> tuple[list, list, list, list]:
        visited: set[int] = set()
        keep: list = []
        errors: list[BaseException] = []
        saved = [(id(t), name) for t, name in scan.walk_autograd(nodes, visited, keep, errors)]
        return saved, sorted(visited), [id(n) for n in keep], [(type(e), str(e)) for e in errors]

    in_c = walk()
    monkeypatch.setattr(scan, "_walk_graph_c", None)
    in_python = walk()
    assert in_c == in_python
    saved, _, keep, errors = in_c
    assert len(keep) == 8 and len(saved) == 5  # every node once; the failed ones' tensors are not counted
    assert {name for _, name in saved} == {"_One.saved_self", "_Two.saved_self", "_Two.saved_other"}
    assert sorted(t.__name__ for t, _ in errors) == ["KeyError", "ValueError", "ValueError"]


def test_the_graph_walk_in_c_lets_interrupts_through() -> None:
    from tbmem._internal import _torch_private as tp

    walk_graph = _module().walk_graph

    class Interrupting(_Node):
        @property
        def _raw_saved_self(self) -> object:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        walk_graph([Interrupting(())], set(), [], [], tp.saved_tensor_fields, tp.SAVED_TENSOR_VALUE, tp.NODE_EDGES)


# ---- issue 26: the frozen generation, the untracked index, the facts read in C (the walks in
# stretches: test_gcwalk_stretches.py)


def test_select_frozen_lists_what_gc_freeze_moved_in_its_order() -> None:
    module = _module()
    if not heap.FROZEN_READABLE:
        pytest.skip("the permanent generation is read on CPython 3.10 and 3.11 only")
    keep = [torch.ones(7), torch.nn.Parameter(torch.zeros(3))]
    types = _types()
    before = module.select_tracked(types)
    gc.freeze()
    try:
        frozen = module.select_frozen(types)
        assert module.select_tracked(types) == [] or all(not any(o is k for o in module.select_tracked(types))
                                                           for k in keep)
    finally:
        gc.unfreeze()
    assert [id(o) for o in frozen] == [id(o) for o in before if any(o is f for f in frozen)]
    assert all(any(o is k for o in frozen) for k in keep)


def test_weak_refs_in_c_refer_to_what_python_would_and_are_untracked() -> None:
    module = _module()
    objs = [torch.zeros(2), torch.nn.Parameter(torch.ones(1)), (torch.ones(1, requires_grad=True) * 2).grad_fn]
    skip = heap.cpp_node_types()
    refs = module.weak_refs(objs, skip)
    expected = [weakref.ref(o) for o in objs if type(o) not in skip]
    assert [r() for r in refs] == [r() for r in expected] and len(refs) == 2
    assert not any(gc.is_tracked(r) for r in refs)
    with pytest.raises(TypeError):
        module.weak_refs([1], skip)


def _odd_tensors() -> list[torch.Tensor]:
    base = torch.arange(24.0).reshape(4, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # strided nested tensors are a prototype
        nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
    return [torch.zeros(3), base, base.t(), base[1:, 2:], torch.zeros(()), torch.zeros(2, 3, 4, 5, 6, 7, 8),
            torch.ones(5, dtype=torch.float16, requires_grad=True), torch.ones(3, requires_grad=True) * 2,
            torch.empty(4, device="meta"),
            torch.from_numpy(np.arange(6.0)), nested,
            torch.zeros(4).to_sparse(), nn.Parameter(torch.zeros(2, 2))]


def test_tensor_facts_in_c_are_what_python_reads() -> None:
    module = _module()
    from tbmem._internal import _torch_private_census as tpc
    from tbmem._internal.census import facts

    layout = tpc.storage_layout()
    if layout is None:
        pytest.skip(f"torch's layout could not be checked here: {tpc.layout_problem}")
    tensors = _odd_tensors()
    raw, dtypes, shapes = module.tensor_facts(tensors, facts._DESCRIPTORS, tuple(layout))
    python = facts._tensor_facts_py(tensors, layout)
    assert np.frombuffer(raw, dtype=np.int64).reshape(-1, 7).tolist() == python.rows.tolist()
    assert dtypes == python.dtypes and shapes == python.shapes
    rows = python.rows
    assert rows[0, 2] == 12 and rows[1, 1] == rows[2, 1] == rows[3, 1]  # a view: its base's storage
    assert shapes[rows[2, 5]] == (6, 4) and shapes[rows[4, 5]] == () and shapes[rows[5, 5]] == (2, 3, 4, 5, 6, 7, 8)
    assert rows[6, 3] & facts.REQUIRES_GRAD and rows[7, 3] & facts.HAS_GRAD_FN and rows[10, 3] & facts.NESTED
    assert not rows[9, 3] & (facts.RESIZABLE | facts.ALLOCATED)  # from_numpy: memory torch did not allocate
    assert rows[:, 6].tolist() == [id(t) for t in tensors]
    assert [bool(r & facts.PLAIN) for r in rows[:, 3]] == [type(t) is torch.Tensor for t in tensors]
    addresses = [t.untyped_storage()._cdata for t in tensors[:3]]
    in_c = np.frombuffer(module.storage_facts(addresses, tuple(layout)), dtype=np.int64).reshape(-1, 4)
    assert in_c.tolist() == [list(facts._row(a, layout)) for a in addresses]
    assert in_c[:, :3].tolist() == rows[:3, :3].tolist() and (in_c[:, 3] == rows[:3, 3] & 0x3FFFF).all()


def test_instances_below_with_stop_types_and_object_arrays_finds_what_python_finds() -> None:
    module = _module()
    from tbmem._internal.census import walk

    inner = np.zeros(11)
    holder = np.empty(3, dtype=object)
    holder[:] = [inner, {"deep": np.ones(5)}, 7]

    class Own:
        def __init__(self) -> None:
            self.hidden = np.ones(3)

    objs = [{"h": holder}, [Own(), np.zeros(2)], holder]
    for depth, budget in ((1, 100), (2, 100), (3, 100), (3, 4)):
        for obj in objs:
            c_budget, py_budget = [budget], [budget]
            got = module.instances_below(obj, {np.ndarray}, depth, c_budget, frozenset({Own}), walk.object_items)
            expected = list(walk._instances_below(obj, {np.ndarray}, depth, py_budget, frozenset({Own}),
                                                  walk.object_items))
            assert [id(a) for a in got] == [id(a) for a in expected] and c_budget == py_budget
    found = module.instances_below(objs[0], {np.ndarray}, 3, [100], frozenset(), walk.object_items)
    assert any(a is inner for a in found)  # inside an array of objects


def test_the_collection_hook_holds_a_ctrl_c_until_the_collection_is_over(monkeypatch) -> None:
    import functools

    module = _module()
    calls: list[tuple[str, int]] = []

    def noting(phase: str, info: dict) -> None:
        calls.append((phase, info["generation"]))
        if phase == "start" and info["generation"] == 2:
            raise KeyboardInterrupt  # as Ctrl-C's handler does, when the signal arrived during the collection

    hook = functools.partial(module.collection_hook, noting)
    gc.callbacks.append(hook)
    try:
        gc.collect(0)
        assert calls == []  # generation 0 never enters Python
        gc.collect(1)
        assert calls == [("start", 1), ("stop", 1)]
        with pytest.raises(KeyboardInterrupt):
            gc.collect(2)
            for _ in range(1000):  # where the interrupted code checks for pending work
                pass
        assert calls[2:] == [("start", 2), ("stop", 2)]  # the collection ran to its end first
    finally:
        gc.callbacks.remove(hook)
    failed = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: failed.append(u.exc_type))
    broken = functools.partial(module.collection_hook, lambda phase, info: 1 / 0)
    gc.callbacks.append(broken)
    try:
        gc.collect(1)  # any other exception is the collector's to report, as without the hook
    finally:
        gc.callbacks.remove(broken)
    assert failed == [ZeroDivisionError, ZeroDivisionError]
