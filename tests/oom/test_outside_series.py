"""Memory the allocator cannot see, as series: outside PyTorch's allocator, pinned host memory, locked pages."""

from __future__ import annotations

import ctypes
import logging
import mmap
import types

import pytest
import torch

from tbmem import MemoryWriter
from tbmem._internal._log import forget_reports
from tbmem._internal.probes.device import CudaProbe
from tbmem._internal.probes.host import HostProbe
from tbmem._internal.tags import TAGS, GiB, MiB
from tests._events import scalars
from tests.fake_cuda import FakeCuda, install_fake_cuda


def test_outside_the_allocator_and_pinned_host_memory_are_recorded(tmp_path, monkeypatch):
    install_fake_cuda(monkeypatch, FakeCuda(total=80 * 2**30, free=70 * 2**30, reserved=4 * 2**30))
    monkeypatch.setattr(torch.cuda, "host_memory_stats", lambda: {"allocated_bytes.current": 3 * 2**20})
    readings = CudaProbe().read()
    # the driver counts 10 GiB in use, the allocator reserved 4: 6 GiB outside it
    assert readings["vram_outside_allocator"] == 6 * 2**30 and readings["ram_pinned_host"] == 3 * 2**20
    with MemoryWriter(tmp_path, every=1, census_every=0) as w:
        w.log_memory(0)
    assert scalars(tmp_path, TAGS["vram_outside_allocator"].tag) == [(0, pytest.approx(6 * 2**30 / GiB))]
    assert scalars(tmp_path, TAGS["ram_pinned_host"].tag) == [(0, pytest.approx(3.0))]


def test_a_torch_without_host_memory_stats_writes_no_pinned_series(monkeypatch):
    install_fake_cuda(monkeypatch)
    monkeypatch.delattr(torch.cuda, "host_memory_stats")
    assert "ram_pinned_host" not in CudaProbe().read()


def test_unified_memory_device_is_said_once(monkeypatch, caplog):
    install_fake_cuda(monkeypatch)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d=None: types.SimpleNamespace(is_integrated=True))
    forget_reports()
    probe = CudaProbe()
    with caplog.at_level(logging.WARNING, logger="tbmem"):
        probe.read()
        probe.read()
    notes = [r.getMessage() for r in caplog.records if "unified memory" in r.getMessage()]
    assert len(notes) == 1 and "nvidia-smi shows no device memory" in notes[0]


def test_locked_pages_are_seen_on_the_host_side(tmp_path):
    libc = ctypes.CDLL(None, use_errno=True)
    buf = mmap.mmap(-1, 4 * 2**20)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    if libc.mlock(ctypes.c_void_p(addr), ctypes.c_size_t(len(buf))) != 0:
        pytest.skip(f"mlock refused (errno {ctypes.get_errno()}: RLIMIT_MEMLOCK)")
    try:
        locked = HostProbe().read()["ram_locked"]
        assert locked >= 4 * 2**20
        with MemoryWriter(tmp_path, every=1, census_every=0) as w:
            w.log_memory(0)
        [(step, mb)] = scalars(tmp_path, TAGS["ram_locked"].tag)
        assert step == 0 and mb * MiB >= 4 * 2**20
    finally:
        libc.munlock(ctypes.c_void_p(addr), ctypes.c_size_t(len(buf)))
        buf.close()
    assert "ram_locked" not in HostProbe().read() or HostProbe().read()["ram_locked"] < locked


def test_private_pools_reserved_series(tmp_path, monkeypatch):
    # two private pools (a CUDA graph's, a MemPool's) as torch >= 2.10 reports them, flat and nested
    fake = install_fake_cuda(monkeypatch)
    fake.extra = {"reserved_bytes_by_private_pools.0_1.all.current": 2 * 2**30,
                  "reserved_bytes_by_private_pools.0_1.all.peak": 3 * 2**30,
                  "reserved_bytes_by_private_pools.0_2.all.current": 2**29}
    assert CudaProbe().read()["vram_private_pools_reserved"] == 2 * 2**30 + 2**29
    with MemoryWriter(tmp_path, every=1, census_every=0) as w:
        w.log_memory(0)
    assert scalars(tmp_path, TAGS["vram_private_pools_reserved"].tag) == [(0, pytest.approx(2.5))]
    fake.extra = {}
    assert "vram_private_pools_reserved" not in CudaProbe().read()  # a torch without the key: no series


def test_a_series_per_private_pool_reserved_and_allocated(tmp_path, monkeypatch):
    # a CUDA graph's pool (1, 0) and a MemPool's (0, 1): reserved from memory_stats, allocated from each
    # pool's own segments (memory_snapshot(mempool_id=..., include_traces=False), the signature torch has)
    fake = install_fake_cuda(monkeypatch)
    fake.extra = {"reserved_bytes_by_private_pools.1_0.all.current": 2 * 2**30,
                  "reserved_bytes_by_private_pools.0_1.all.current": 2**29}
    segs = {(1, 0): [{"device": 0, "segment_pool_id": (1, 0), "total_size": 2**30, "allocated_size": 3 * 2**28},
                     {"device": 0, "segment_pool_id": (1, 0), "total_size": 2**30, "allocated_size": 2**28},
                     {"device": 1, "segment_pool_id": (1, 0), "total_size": 2**30, "allocated_size": 2**30}],
            (0, 1): [{"device": 0, "segment_pool_id": (0, 1), "total_size": 2**29, "allocated_size": 2**27}]}
    asked = []

    def memory_snapshot(mempool_id=None, include_traces=True):
        asked.append((mempool_id, include_traces))
        return segs[tuple(mempool_id)]

    monkeypatch.setattr(torch.cuda, "memory_snapshot", memory_snapshot)
    with MemoryWriter(tmp_path, every=1, census_every=0) as w:
        w.log_memory(0)
    got = {t: scalars(tmp_path, t) for t in ("Memory/GPU/vram_pool_1_0_reserved_GB", "Memory/GPU/vram_pool_0_1_reserved_GB",
                                             "Memory/GPU/vram_pool_1_0_allocated_GB", "Memory/GPU/vram_pool_0_1_allocated_GB")}
    assert got == {"Memory/GPU/vram_pool_1_0_reserved_GB": [(0, pytest.approx(2.0))],
                   "Memory/GPU/vram_pool_0_1_reserved_GB": [(0, pytest.approx(0.5))],
                   "Memory/GPU/vram_pool_1_0_allocated_GB": [(0, pytest.approx(1.0))],
                   "Memory/GPU/vram_pool_0_1_allocated_GB": [(0, pytest.approx(0.125))]}
    assert sorted(asked) == [((0, 1), False), ((1, 0), False)]
    assert scalars(tmp_path, TAGS["vram_private_pools_reserved"].tag) == [(0, pytest.approx(2.5))]
    # a torch whose memory_snapshot reads all pools at once: reserved per pool only, never a full snapshot
    monkeypatch.setattr(torch.cuda, "memory_snapshot", lambda: pytest.fail("a full snapshot was taken"))
    readings = CudaProbe().read()
    assert readings["vram_pool_reserved:1_0"] == 2 * 2**30 and "vram_pool_allocated:1_0" not in readings
