"""Issue 38 on a real CUDA device (deselected by default; ``pytest -m gpu``; scripts/gpu_check.sh runs it): the
census at an OOM allocates nothing on the device and counts what the test counts; torch's observer gives the
exact bytes; NVML's per-process bytes; a MemPool's ``pool_id`` on the trace read alike by every reader tier."""

from __future__ import annotations

import io
import pickle

import pytest
import torch

from tbmem import MemoryWriter
from tbmem._internal import _torch_private as tp
from tbmem._internal.oom.census import on_device, take_at_oom
from tbmem._internal.oom.runtime import explain_now
from tbmem._internal.snapshot import readers
from tbmem._internal.tags import TAGS
from tests._events import texts

pytestmark = pytest.mark.gpu
MiB = 2**20


def _nbytes(tensors) -> int:
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())


@pytest.fixture
def trained():
    dev = torch.device("cuda", torch.cuda.current_device())
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)).to(dev)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(64, 512, device=dev)).sum().backward()
    opt.step()
    return dev, model, opt


def test_the_census_at_an_oom_allocates_nothing_on_the_device_and_counts_exactly(trained):
    dev, model, opt = trained
    torch.cuda.synchronize(dev)
    before = torch.cuda.memory_stats(dev)["allocation.all.allocated"]  # every allocation ever made
    doc = take_at_oom([model], [opt], dev.index)
    assert torch.cuda.memory_stats(dev)["allocation.all.allocated"] == before
    cats = on_device(doc, f"cuda:{dev.index}")
    params = list(model.parameters())
    state = [t for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor) and t.is_cuda]
    assert cats["parameters"] == _nbytes(params) and cats["gradients"] == _nbytes([p.grad for p in params])
    assert cats["optimizer_state"] == _nbytes(state) and cats["unattributed"] >= 0


def test_a_real_oom_gets_the_observers_exact_bytes_and_the_census(tmp_path, trained):
    dev, model, opt = trained
    total = torch.cuda.mem_get_info(dev)[1]
    nbytes = total + 12_345  # more than the device: the caching allocator's own OOM
    writer = MemoryWriter(tmp_path, every=1, census_every=1000)
    writer.watch(model, opt)
    writer.log_memory(0)  # the CUDA probe attaches the observer
    assert tp.watch_oom_requests()
    with pytest.raises(torch.OutOfMemoryError), writer.monitored_step(1):
        torch.empty(nbytes, dtype=torch.uint8, device=dev)
    writer.close()
    [(_step, text)] = texts(tmp_path, TAGS["oom_text"].tag)
    assert "its out-of-memory observer" in text and "by category (census at the error)" in text
    try:
        torch.empty(nbytes, dtype=torch.uint8, device=dev)
    except torch.OutOfMemoryError as exc:
        x = explain_now(exc)
    assert x.requested_bytes == -(-nbytes // (2 * MiB)) * 2 * MiB  # torch's rounding of a large request, exact
    assert x.verdict == "larger_than_device"
    if x.process_device_bytes is None:  # NVML missing, or it lists no pid of this namespace: said so
        assert any("other processes" in n or "NVML" in n for n in x.notes)
    else:
        assert x.process_device_bytes >= torch.cuda.memory_reserved(dev)


def test_a_mempools_pool_id_on_the_trace(monkeypatch):
    dev = torch.device("cuda", torch.cuda.current_device())
    if not hasattr(torch.cuda, "MemPool"):
        pytest.skip("this torch has no torch.cuda.MemPool")
    torch.cuda.memory._record_memory_history(max_entries=10_000)
    try:
        pool = torch.cuda.MemPool()
        with torch.cuda.use_mem_pool(pool):
            kept = torch.empty(48 * MiB, dtype=torch.uint8, device=dev)
            gone = torch.empty(24 * MiB, dtype=torch.uint8, device=dev)
        del gone
        raw = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    events = [e for t in raw["device_traces"] for e in t]
    if not any("pool_id" in e for e in events):
        pytest.skip(f"torch {torch.__version__} writes no pool_id on trace events")
    data = pickle.dumps(raw, protocol=4)
    by_c = readers.read_snapshot(io.BytesIO(data), "s.pickle")
    monkeypatch.setattr(readers, "C_READER", False)
    by_unpickler = readers.read_snapshot(io.BytesIO(data), "s.pickle")
    for a, b in zip(by_c.devices, by_unpickler.devices):
        assert a.segs["pool"].tolist() == b.segs["pool"].tolist() and a.pools == b.pools
    [d] = [d for d in by_c.devices if d.name == f"cuda:{dev.index}"]
    assert list(pool.id) in [list(p) for p in d.pools]
    assert (d.segs["pool"] >= 0).all()  # every segment's pool known, released ones too
    del kept


def test_outside_allocator_pinned_host_and_pool_series_on_a_real_device():
    """The series of issue 38 against torch's own numbers on the device: outside the allocator is the driver's
    used bytes minus reserved (the CUDA context at least), a pinned staging buffer is in the pinned-host series,
    a MemPool's reserved and allocated bytes are its own series."""
    from tbmem._internal.probes.device import CudaProbe
    from tbmem._internal.tags import named_reading, pool_name

    dev = torch.device("cuda", torch.cuda.current_device())
    torch.empty(MiB, device=dev)  # the context exists
    staging = torch.empty(64 * MiB, dtype=torch.uint8).pin_memory()
    pool = torch.cuda.MemPool() if hasattr(torch.cuda, "MemPool") else None
    if pool is not None:
        with torch.cuda.use_mem_pool(pool):
            in_pool = torch.empty(40 * MiB, dtype=torch.uint8, device=dev)
    torch.cuda.synchronize(dev)
    r = CudaProbe(peak_mode="run").read()
    free, total = torch.cuda.mem_get_info(dev)
    outside = r["vram_outside_allocator"]
    assert outside == pytest.approx(total - free - torch.cuda.memory_reserved(dev), abs=64 * MiB)
    assert outside > 100 * MiB  # a CUDA context is hundreds of MB, none of it the allocator's
    if "ram_pinned_host" in r:  # torch >= 2.6
        assert r["ram_pinned_host"] >= staging.untyped_storage().nbytes()
    if pool is not None and "vram_private_pools_reserved" in r:
        name = pool_name(pool.id)
        reserved = sum(s["total_size"] for s in torch.cuda.memory_snapshot()
                       if tuple(s["segment_pool_id"]) == tuple(pool.id))
        assert r[named_reading("vram_pool_reserved", name)] == reserved >= 40 * MiB
        if named_reading("vram_pool_allocated", name) in r:
            assert r[named_reading("vram_pool_allocated", name)] >= in_pool.untyped_storage().nbytes()
        del in_pool
    del staging
