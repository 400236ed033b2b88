"""Memory the allocator cannot see, as series: outside PyTorch's allocator, pinned host memory, locked pages."""

from __future__ import annotations

import ctypes
import logging
import mmap
import types

import pytest
import torch

from tbmem import MemoryWriter
from tbmem._log import forget_reports
from tbmem.probes.device import CudaProbe
from tbmem.probes.host import HostProbe
from tbmem.tags import TAGS, GiB, MiB
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
