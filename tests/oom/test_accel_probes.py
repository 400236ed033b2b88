"""XPU and MPS memory behind the same tags as CUDA's, on fake devices (as tests/fake_cuda.py fakes CUDA)."""

from __future__ import annotations

import pytest
import torch

from tbmem import MemoryWriter
from tbmem._internal import _torch_private as tp
from tbmem._internal.probes.accel import MpsProbe, XpuProbe
from tbmem._internal.tags import TAGS, GiB
from tests._events import scalars

MiB = 2**20


@pytest.fixture
def fake_xpu(monkeypatch):
    state = {"resets": 0, "allocated": 3 * 2**30}

    def stats(device: object = None) -> dict[str, int]:  # the fake torch.xpu.memory_stats
        return {"allocated_bytes.all.current": state["allocated"],
                "allocated_bytes.all.peak": 5 * 2**30, "reserved_bytes.all.current": 4 * 2**30,
                "reserved_bytes.all.peak": 6 * 2**30, "active_bytes.all.current": 3 * 2**30,
                "num_alloc_retries": 1, "num_ooms": 0}

    monkeypatch.setattr(torch.xpu, "is_available", lambda: True)
    monkeypatch.setattr(torch.xpu, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.xpu, "memory_stats", stats)
    monkeypatch.setattr(torch.xpu, "mem_get_info", lambda device=None: (40 * 2**30, 48 * 2**30))
    monkeypatch.setattr(torch.xpu, "reset_peak_memory_stats", lambda device=None: state.update(resets=state["resets"] + 1))
    return state


@pytest.fixture
def fake_mps(monkeypatch):
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    monkeypatch.setattr(torch.mps, "current_allocated_memory", lambda: 700 * MiB)
    monkeypatch.setattr(torch.mps, "driver_allocated_memory", lambda: 1024 * MiB)
    monkeypatch.setattr(torch.mps, "recommended_max_memory", lambda: 16 * 2**30)


def test_xpu_readings_and_peaks(fake_xpu):
    r = XpuProbe().read()
    assert (r["vram_allocated"], r["vram_reserved"], r["vram_peak_allocated"]) == (3 * 2**30, 4 * 2**30, 5 * 2**30)
    assert r["vram_outside_allocator"] == 4 * 2**30 and r["vram_total"] == 48 * 2**30 and r["vram_alloc_retries"] == 1
    assert fake_xpu["resets"] == 1
    XpuProbe(peak_mode="run").read()
    assert fake_xpu["resets"] == 1


def test_mps_readings(fake_mps):
    assert MpsProbe().read() == {"vram_allocated": 700 * MiB, "vram_reserved": 1024 * MiB, "vram_total": 16 * 2**30,
                                 "vram_percent": 1024 * MiB / (16 * 2**30) * 100.0}


@pytest.mark.parametrize("device", ["xpu", "mps"])
def test_a_writer_without_cuda_records_the_accelerator_under_the_gpu_tags(tmp_path, request, device):
    request.getfixturevalue(f"fake_{device}")
    with MemoryWriter(tmp_path, every=1, census_every=0) as w:
        w.log_memory(0)
    want = {"xpu": 3.0, "mps": 700 / 1024}[device]
    assert scalars(tmp_path, TAGS["vram_allocated"].tag) == [(0, pytest.approx(want))]
    reserved = scalars(tmp_path, TAGS["vram_reserved"].tag)[0][1] * GiB
    assert reserved == pytest.approx({"xpu": 4 * 2**30, "mps": 1024 * MiB}[device])


def test_nothing_without_a_device():
    assert XpuProbe().read() == {} and MpsProbe().read() == {}
    assert isinstance(tp.xpu_has_memory_history(), bool)


def test_a_cpu_run_on_a_mac_writes_no_vram_curves(monkeypatch):
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    monkeypatch.setattr(torch.mps, "current_allocated_memory", lambda: 0)
    monkeypatch.setattr(torch.mps, "driver_allocated_memory", lambda: 0)
    assert MpsProbe().read() == {}


def _xpu_trace() -> dict:
    """What ``torch.xpu.memory._snapshot()`` returns (CUDA's format): one 20 MiB segment, a 6 MiB block in it."""
    base, t = 1 << 36, 1_800_000_000_000_000
    frames = [{"filename": "/home/u/train.py", "line": 7, "name": "forward"}]
    return {"segments": [{"device": 0, "address": base, "total_size": 20 * MiB, "allocated_size": 6 * MiB,
                          "active_size": 6 * MiB, "requested_size": 6 * MiB, "stream": 0, "segment_type": "large",
                          "segment_pool_id": (0, 0), "is_expandable": False, "frames": [],
                          "blocks": [{"address": base, "size": 6 * MiB, "requested_size": 6 * MiB,
                                      "state": "active_allocated", "frames": frames},
                                     {"address": base + 6 * MiB, "size": 14 * MiB, "requested_size": 0,
                                      "state": "inactive", "frames": []}]}],
            "device_traces": [[{"action": "segment_alloc", "addr": base, "size": 20 * MiB, "stream": 0,
                                "time_us": t, "frames": frames},
                               {"action": "alloc", "addr": base, "size": 6 * MiB, "stream": 0, "time_us": t + 1,
                                "frames": frames}]]}


def test_xpu_memory_history_where_torch_records_it(tmp_path, fake_xpu, monkeypatch):
    calls = []
    monkeypatch.setattr(torch.xpu, "current_device", lambda: 0)
    monkeypatch.setattr(torch.xpu.memory, "_record_memory_history", lambda *a, **k: calls.append(k.get("enabled")))
    monkeypatch.setattr(torch.xpu.memory, "_snapshot", _xpu_trace)
    from tbmem._internal.snapshot.config import SnapshotConfig
    from tbmem._internal.snapshot.readers import load_snapshot

    with MemoryWriter(tmp_path, every=1, census_every=0, snapshot=SnapshotConfig(every=2, html=False)) as w:
        for step in range(3):
            w.log_memory(step)
    assert calls[0] == "all" and calls[-1] is None  # started, then stopped at close
    gzs = sorted(tmp_path.rglob("*.json.gz"))  # steps 0 and 2
    assert len(gzs) == 2
    snap = load_snapshot(gzs[0])
    [dev] = snap.devices
    assert dev.name == "xpu:0" and dev.allocs["size"].tolist() == [6 * MiB] and dev.reserved_bytes == 20 * MiB
    assert snap.meta["recorder"] == "xpu._record_memory_history"


def test_an_xpu_without_memory_history_says_so(tmp_path, fake_xpu, monkeypatch, caplog):
    import logging

    monkeypatch.delattr(torch.xpu.memory, "_record_memory_history")
    assert tp.xpu_has_memory_history() is False and tp.xpu_snapshot() is None
    from tbmem._internal.snapshot.config import SnapshotConfig

    with caplog.at_level(logging.WARNING, logger="tbmem"), \
            MemoryWriter(tmp_path, every=1, census_every=0, snapshot=SnapshotConfig(every=2, html=False)) as w:
        for step in range(3):
            w.log_memory(step)
    notes = [r.getMessage() for r in caplog.records if "records no XPU memory history" in r.getMessage()]
    assert len(notes) == 1 and "not the XPU allocator's segments" in notes[0]
