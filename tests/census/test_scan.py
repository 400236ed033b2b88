"""The frame walk reads local variables without keeping them alive."""

from __future__ import annotations

import sys
import weakref

import numpy as np
import torch

from tbmem._internal.census import take_census, walk


def test_a_census_keeps_no_local_variable_of_its_caller_alive() -> None:
    batch = torch.zeros(100_000)
    array = np.ones(30_000)
    refs = [weakref.ref(batch), weakref.ref(array)]
    census = take_census()
    assert [r.name for r in census.records if r.bytes == 240_000] == [
        "numpy test_a_census_keeps_no_local_variable_of_its_caller_alive:array"]
    batch = array = None  # the next step rebinds its locals: the old values must be freed now
    assert [ref() is None for ref in refs] == [True, True]


def test_a_locals_dict_the_caller_holds_is_left_intact() -> None:
    kept = torch.zeros(7)
    namespace = locals()
    take_census()
    assert namespace["kept"] is kept


def test_the_copy_of_the_locals_is_kept_while_a_python_tracer_is_installed() -> None:
    # A tracer writes that copy back into the frame when it returns: emptying it then would
    # delete the traced function's variables.
    def tracer(frame, event, arg):  # noqa: ANN001 - sys.settrace's signature
        return None

    assert not walk._tracing()
    old = sys.gettrace()
    sys.settrace(tracer)
    try:
        tracing = walk._tracing()
    finally:
        sys.settrace(old)
    assert tracing


def test_the_walk_below_a_huge_local_takes_only_its_budget_of_items() -> None:
    huge = [np.zeros(1) for _ in range(50)] + [[] for _ in range(100_000)]
    small = {"a": np.ones(2)}
    refs = walk._bounded_referents([small, huge, {i: i for i in range(30_000)}], 60)
    assert len(refs) == 60
    assert any(r is small["a"] for r in refs)  # a small container is listed whole
    assert sum(type(r) is np.ndarray for r in refs) == 51  # the first items of the huge list, in order
