"""Memory shared or overlapping between tensors, arrays and bare storages is counted once (issue 12: 3, 6, 12)."""

from __future__ import annotations

import gc
import warnings

import numpy as np
import torch

from tbmem._internal.census import take_census


def _union(spans: list[tuple[int, int]]) -> int:
    """Bytes covered by the (start, length) spans, each byte once."""
    total, end = 0, -1
    for start, length in sorted(spans):
        stop = start + length
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def _cpu_bytes_in(census, lo: int, hi: int, spans_of_records: dict[str, tuple[int, int]]) -> int:
    return sum(r.bytes for r in census.records if r.name in spans_of_records)


def _total(census) -> int:
    return sum(r.bytes for r in census.records)


def test_a_tensor_over_a_prefix_of_an_array_leaves_the_rest_of_the_array_counted() -> None:
    """Defect 3: ``from_numpy(a[:k])`` starts where the array starts; the array must not vanish."""
    gc.collect()
    base = np.arange(13_579, dtype=np.float64)
    head = torch.from_numpy(base[:1_000])
    before = _total(take_census(numpy_scan="off"))  # everything but the array: the head's 8000 bytes included
    census = take_census()
    assert head.untyped_storage().data_ptr() == base.ctypes.data
    assert _total(census) - before == base.nbytes - head.untyped_storage().nbytes()
    rest = [r for r in census.records if r.name.startswith("numpy") and r.dtype == "float64"]
    assert [r.bytes for r in rest] == [base.nbytes - 8_000]


def test_overlapping_torch_storages_over_one_buffer_count_each_byte_once() -> None:
    """Defect 3: two ``from_numpy`` tensors over overlapping parts of one array are two storages."""
    gc.collect()
    base = np.arange(20_000, dtype=np.float32)
    left = torch.from_numpy(base[:12_000])
    right = torch.from_numpy(base[8_000:])
    spans = [(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()) for t in (left, right)]
    expected = _union(spans)
    assert expected == base.nbytes < sum(n for _, n in spans)
    without = _total(take_census(numpy_scan="off"))
    del left, right
    gc.collect()
    baseline = _total(take_census(numpy_scan="off"))
    assert without - baseline == expected


def test_overlapping_frombuffer_tensors_and_a_bare_storage_count_each_byte_once() -> None:
    """Defects 3 and 12: ``torch.frombuffer`` views and a storage held without a tensor."""
    gc.collect()
    raw = bytearray(64_000)
    a = torch.frombuffer(raw, dtype=torch.uint8, count=40_000)
    b = torch.frombuffer(raw, dtype=torch.uint8, offset=24_000)
    spans = [(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()) for t in (a, b)]
    assert _union(spans) == 64_000
    baseline_objects = [a, b]
    with_views = _total(take_census(numpy_scan="off"))
    del a, b, baseline_objects
    gc.collect()
    without = _total(take_census(numpy_scan="off"))
    assert with_views - without == 64_000


def test_bare_storages_are_counted_once_each() -> None:
    """Defect 12: an UntypedStorage or TypedStorage held without any tensor is memory too."""
    gc.collect()
    untyped = torch.UntypedStorage(123_457)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TypedStorage is deprecated; users still hold them
        typed = torch.TypedStorage(7_777, dtype=torch.float64)
    shared = torch.zeros(3_333)
    again = shared.untyped_storage()  # the storage of a live tensor: the tensor's bytes, once
    census = take_census()
    assert [(r.category, r.name) for r in census.records if r.bytes == untyped.nbytes()] == [
        ("other", "UntypedStorage")]
    assert [(r.category, r.dtype) for r in census.records if r.bytes == 7_777 * 8] == [("other", "float64")]
    assert len([r for r in census.records if r.bytes == again.nbytes()]) == 1
    assert typed.nbytes() == 7_777 * 8


def test_an_array_kept_alive_only_by_a_tensor_is_reported_as_a_limitation(tbmem_log) -> None:
    """Defect 3, limitation: the owner of a ``from_numpy`` tensor's memory may be invisible.

    ``torch.from_numpy(np.zeros(n)[k:])`` keeps the whole array alive through a C++ deleter no
    Python object refers to: only the bytes the tensor spans can be measured. The census counts
    those and says how many tensors over foreign memory had no owner it could find.
    """
    gc.collect()
    orphan = torch.from_numpy(np.zeros(25_000)[5_000:])
    spanned = orphan.untyped_storage().nbytes()
    census = take_census()
    assert spanned == 20_000 * 8
    assert [r.bytes for r in census.records if r.bytes == spanned] == [spanned]
    assert census.blind_spots["foreign_memory_owner_not_found"] == spanned
    assert any("torch did not allocate" in note for note in census.notes)
    assert not tbmem_log.records  # a limitation, shown in the census, not a failure to log
    kept = np.zeros(25_000)
    owned = torch.from_numpy(kept[5_000:])  # the owner is a local variable: found, nothing to report
    del orphan
    census = take_census()
    assert "foreign_memory_owner_not_found" not in census.blind_spots
    assert [r.bytes for r in census.records if r.bytes in (kept.nbytes, owned.untyped_storage().nbytes(),
                                                           5_000 * 8)] == [20_000 * 8, 5_000 * 8]


def test_strided_nested_tensors_count_their_buffer_and_metadata() -> None:
    """Defect 6: ``tuple(t.shape)`` raises for a strided nested tensor; its buffer must still count."""
    gc.collect()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "prototype stage": users hold them all the same
        nested = torch.nested.nested_tensor([torch.randn(37, 8), torch.randn(51, 8)])
    parts = [nested, nested._nested_tensor_size(), nested._nested_tensor_strides(),
             nested._nested_tensor_storage_offsets()]
    spans = {(p.untyped_storage().data_ptr(), p.untyped_storage().nbytes()) for p in parts}
    expected = _union(list(spans))
    assert nested.untyped_storage().nbytes() == (37 + 51) * 8 * 4
    with_it = take_census()
    assert not with_it.notes
    del nested, parts
    gc.collect()
    assert _total(with_it) - _total(take_census()) == expected


# ---- issue 26, item 8: foreign_memory_owner_not_found only where no owner was found, each byte once


def test_overlapping_foreign_tensors_without_their_owner_name_each_byte_once() -> None:
    """Two ``from_numpy`` tensors over overlapping parts of an array no one holds: the blind spot summed them."""
    gc.collect()
    base = np.zeros(18_000, dtype=np.float32)
    left, right = torch.from_numpy(base[:12_000]), torch.from_numpy(base[6_000:])
    spans = [(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()) for t in (left, right)]
    del base  # the array lives on, held only by the tensors' C++ deleters
    census = take_census(numpy_scan="off")
    assert census.blind_spots["foreign_memory_owner_not_found"] == _union(spans) == 72_000 < 96_000
    note = census.blind_spot_notes["foreign_memory_owner_not_found"]
    assert "0.07 MB in 2 tensors" in note and "foreign_memory" not in note  # a plain sentence
    assert note in census.notes and note in census.to_markdown()


def test_jit_loaded_weights_are_no_foreign_memory() -> None:
    """torch.jit.load makes non-resizable storages with memory its allocator made: they own it."""
    import io

    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit is deprecated, and in use
        torch.jit.save(torch.jit.script(torch.nn.Linear(100, 200)), buffer)
        buffer.seek(0)
        loaded = torch.jit.load(buffer)
    weight = loaded.weight
    assert not weight.untyped_storage().resizable()
    census = take_census(models=[loaded], numpy_scan="off")
    assert "foreign_memory_owner_not_found" not in census.blind_spots
    assert census.by_category["parameters"] == (100 * 200 + 200) * 4


def test_tensors_of_a_memory_mapped_checkpoint_are_inside_the_mapping_storage(tmp_path) -> None:
    """torch.load(mmap=True): each tensor's storage is a slice of one storage over the mapped file, which
    the census finds: no tensor lacks its owner."""
    path = tmp_path / "weights.pt"
    torch.save({"a": torch.randn(1_000), "b": torch.randn(2_000)}, path)
    loaded = torch.load(path, mmap=True, weights_only=True)
    assert not loaded["a"].untyped_storage().resizable()
    census = take_census(roots=[loaded], numpy_scan="off")
    assert "foreign_memory_owner_not_found" not in census.blind_spots
    names = {r.name: r.bytes for r in census.records if r.name.startswith("root[")}
    assert names == {"root['a']": 4_000, "root['b']": 8_000}
