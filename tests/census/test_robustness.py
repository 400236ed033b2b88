"""The census never raises: odd objects, freed tensors, subclasses, sparse, quantized and meta tensors."""

from __future__ import annotations

import gc
import warnings
import weakref

import pytest
import torch

from tbmem._internal.census import categorize, core, take_census


class Raising:
    """Every attribute access raises (including __class__, which isinstance reads)."""

    def __getattribute__(self, name: str) -> object:
        raise RuntimeError(f"no {name} for you")


class MyTensor(torch.Tensor):
    pass


class BrokenStorage(torch.Tensor):
    def untyped_storage(self) -> torch.UntypedStorage:  # type: ignore[override]
        raise RuntimeError("broken subclass")


class Victim:
    pass


def _bytes(census, nbytes: int) -> list:
    return [r for r in census.records if r.bytes == nbytes]


def test_raising_objects_and_dead_proxies_do_not_break_it(tbmem_log) -> None:
    gc.collect()
    evil = [Raising(), Raising()]  # noqa: F841 - in this frame's locals and in gc
    victim = Victim()
    dead = weakref.proxy(victim)
    del victim
    keep = torch.zeros(1234)  # noqa: F841
    census = take_census(roots=[dead, Raising()])
    assert len(_bytes(census, 1234 * 4)) == 1
    assert not census.notes


def test_subclasses_are_found_and_their_overrides_bypassed(tbmem_log) -> None:
    gc.collect()
    sub = torch.zeros(777).as_subclass(MyTensor)  # noqa: F841
    bad = [torch.zeros(10).as_subclass(BrokenStorage), torch.zeros(11).as_subclass(BrokenStorage)]  # noqa: F841
    model = torch.nn.Linear(3, 5)
    census = take_census(models=[model])
    assert len(_bytes(census, 777 * 4)) == 1  # the subclass and the tensor it aliases: one storage
    assert any(t is sub for t in core.heap.find_instances().objects)
    # the unbound torch.Tensor.untyped_storage bypasses the override: still counted
    assert len(_bytes(census, 40)) == 1 and len(_bytes(census, 44)) == 1
    assert census.by_category["parameters"] == (3 * 5 + 5) * 4
    assert not census.notes


class _Odd(torch.Tensor):
    pass


def test_a_failing_tensor_is_reported_once_and_the_rest_is_counted(tbmem_log, monkeypatch) -> None:
    gc.collect()
    odd = [torch.Tensor._make_subclass(_Odd, torch.zeros(n)) for n in (13, 17)]  # measured one by one
    real, real_rows = core.scan.tensor_storages, core.scan.storages_from_facts

    def flaky(t, *row):
        if any(t is o for o in odd):
            raise ValueError("simulated failure")
        return real_rows(t, *row) if row else real(t)

    monkeypatch.setattr(core.scan, "tensor_storages", flaky)
    monkeypatch.setattr(core.scan, "storages_from_facts", flaky)  # measured from the facts read at the start
    model = torch.nn.Linear(4, 4)
    census = take_census(models=[model])
    assert census.by_category["parameters"] == (16 + 4) * 4
    assert not _bytes(census, 13 * 4) and not _bytes(census, 17 * 4)
    messages = [r.getMessage() for r in tbmem_log.records if "could not be measured" in r.getMessage()]
    assert len(messages) == 1 and "simulated failure" in messages[0]
    assert census.notes == ["a _Odd could not be measured"]


def test_a_failure_of_the_bulk_measurement_falls_back_to_one_by_one(tbmem_log, monkeypatch) -> None:
    gc.collect()
    plain = [torch.zeros(19), torch.zeros(23)] + [torch.zeros(1) for _ in range(categorize.BULK_AT_LEAST)]

    def broken(*args, **kwargs):
        raise RuntimeError("simulated bulk failure")

    monkeypatch.setattr(categorize, "measure_plain", broken)
    census = take_census()
    assert len(_bytes(census, 19 * 4)) == 1 and len(_bytes(census, 23 * 4)) == 1
    messages = [r.getMessage() for r in tbmem_log.records if "simulated bulk failure" in r.getMessage()]
    assert len(messages) == 1 and "measured one by one" in messages[0]
    del plain


def test_tensors_freed_during_the_scan(monkeypatch) -> None:
    gc.collect()
    model = torch.nn.Linear(8, 8)
    x = torch.randn(4, 8)
    loss = (model(x) ** 2).sum()
    freed = torch.zeros(500)
    real = core.heap.find_instances

    def find_then_free(holders, **kwargs):
        found = real(holders, **kwargs)
        loss.backward()  # another thread finishing backward: saved tensors released mid-census
        freed.untyped_storage().resize_(0)  # FSDP-style freeing of a storage
        return found

    monkeypatch.setattr(core.heap, "find_instances", find_then_free)
    census = take_census(models=[model], roots=[loss])
    # The graph's saved tensors are gone; the addmm output (4x8 float32) had a preserved Python
    # object that the scan found before the backward, so it is still counted: it was alive then.
    assert census.by_category["activations"] == loss.untyped_storage().nbytes() + 4 * 8 * 4
    assert not _bytes(census, 2000)
    assert census.by_category["parameters"] == (64 + 8) * 4


def test_sparse_quantized_meta_and_fake_tensors() -> None:
    gc.collect()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # beta/deprecation notices of these layouts
        dense = torch.zeros(40, 50)
        dense[3, 7] = 1.0
        dense[9, 2] = 2.0
        coo = dense.to_sparse()
        csr = torch.eye(30).to_sparse_csr()
        q = torch.quantize_per_tensor(torch.randn(1001), 0.1, 0, torch.qint8)
    meta = torch.empty(10**9, device="meta")  # noqa: F841 - holds no memory
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        fake = torch.empty(10**8)  # noqa: F841 - holds no memory
    del dense
    census = take_census()
    coo_bytes = coo._indices().untyped_storage().nbytes() + coo._values().untyped_storage().nbytes()
    assert coo_bytes == 2 * 2 * 8 + 2 * 4
    crow = csr.crow_indices().untyped_storage()
    assert crow.nbytes() == 31 * 8
    assert {r.dtype for r in _bytes(census, 1001)} == {"qint8"}
    assert [(r.dtype, r.bytes) for r in census.records if r.bytes == 31 * 8] == [("int64", 248)]
    assert not [r for r in census.records if r.device == "meta" or r.bytes >= 4 * 10**8]
    assert {r.dtype for r in _bytes(census, 2 * 2 * 8)} == {"int64"}


@pytest.mark.parametrize("mode", ["reachable", "off"])
def test_a_broken_phase_is_reported_and_the_others_still_count(tbmem_log, monkeypatch, mode) -> None:
    gc.collect()
    model = torch.nn.Linear(2, 2)

    def boom(*_):
        raise KeyError("simulated")

    monkeypatch.setattr(core.scan, "walk_autograd", boom)
    loss = model(torch.ones(1, 2)).sum()
    census = take_census(models=[model], roots=[loss], numpy_scan=mode)
    assert census.by_category["parameters"] == 6 * 4
    assert "activations could not be scanned" in census.notes
    assert any("activations could not be scanned" in r.getMessage() for r in tbmem_log.records)
