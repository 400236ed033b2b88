"""The exact requested bytes from torch's out-of-memory observer, and the memory of other processes where
NVML attributes it per process: on a fake CUDA device and a fake NVML module (neither exists here)."""

from __future__ import annotations

import logging
import os
import sys
import types

import pytest
import torch

from tbmem import MemoryWriter
from tbmem._internal import _torch_private as tp
from tbmem._internal.oom.runtime import explain_now
from tbmem._internal.oom.text import explanation_text
from tbmem._internal.probes.device import CudaProbe, NvmlProbe
from tbmem._internal.tags import TAGS, GiB
from tests._events import scalars
from tests.oom.test_runtime import MESSAGE, fake_device  # noqa: F401 - the fixture

MiB = 2**20


@pytest.fixture
def observer(monkeypatch):
    """torch's observer hook, faked: the callbacks attached to it (a CPU build of torch has no hook)."""
    hooks: list = []
    monkeypatch.setattr(torch._C, "_cuda_attach_out_of_memory_observer", hooks.append, raising=False)
    monkeypatch.setattr(tp, "_oom_watched", False)
    monkeypatch.setattr(tp, "_oom_requests", {})
    return hooks


def test_the_observer_gives_the_exact_bytes(fake_device, observer):  # noqa: F811
    CudaProbe().read()
    CudaProbe().read()
    assert len(observer) == 1  # attached once per process
    observer[0](0, 10 * MiB + 123, 80 * GiB, MiB - 512)  # what the allocator calls right before it raises
    x = explain_now(torch.OutOfMemoryError(MESSAGE))
    assert (x.requested_bytes, x.device_free_bytes) == (10 * MiB + 123, MiB - 512)
    assert any("torch's own, at the error (its out-of-memory observer)" in n for n in x.notes)
    again = explain_now(torch.OutOfMemoryError(MESSAGE))  # the report was this error's: not used twice
    assert again.requested_bytes == 10 * MiB and any("read from the error message" in n for n in again.notes)


def test_a_report_of_another_request_is_not_taken(fake_device, observer):  # noqa: F811
    assert tp.watch_oom_requests()
    observer[0](0, 2 * GiB, 80 * GiB, MiB)  # an earlier OOM the user caught; this message says 10 MiB
    assert explain_now(torch.OutOfMemoryError(MESSAGE)).requested_bytes == 10 * MiB


def test_without_the_hook_the_message_is_read(fake_device, monkeypatch):  # noqa: F811
    monkeypatch.delattr(torch._C, "_cuda_attach_out_of_memory_observer", raising=False)
    monkeypatch.setattr(tp, "_oom_watched", False)
    assert tp.watch_oom_requests() is False
    x = explain_now(torch.OutOfMemoryError(MESSAGE))
    assert x.requested_bytes == 10 * MiB and any("read from the error message" in n for n in x.notes)


def test_the_block_at_an_oom_in_monitored_step_uses_the_observer(tmp_path, fake_device, observer, caplog):  # noqa: F811
    writer = MemoryWriter(tmp_path, every=1, census_every=0)
    writer.log_memory(0)  # the CUDA probe's first read attaches the observer
    observer[0](0, 10 * MiB + 7, 80 * GiB, MiB)
    error = torch.OutOfMemoryError(MESSAGE)
    with caplog.at_level(logging.ERROR, logger="tbmem"), pytest.raises(torch.OutOfMemoryError) as caught, \
            writer.monitored_step(1):
        raise error
    writer.close()
    assert caught.value is error
    [block] = [r.getMessage() for r in caplog.records if "ran out of memory" in r.getMessage()]
    assert "note: the requested bytes and the driver's free bytes are torch's own" in block


class FakeNvml(types.ModuleType):
    """pynvml's calls tbmem makes, answering for one device with the processes given (pid, bytes or None)."""

    class NVMLError(Exception):
        pass

    def __init__(self, procs, *, used: int = 30 * GiB, processes_fail: bool = False) -> None:
        super().__init__("pynvml")
        self.procs, self.used, self.processes_fail = procs, used, processes_fail
        self.inits = self.shutdowns = 0

    def nvmlInit(self) -> None:
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetHandleByIndex(self, index: int):
        return ("handle", index)

    def nvmlDeviceGetMemoryInfo(self, handle):
        return types.SimpleNamespace(used=self.used, total=80 * GiB, free=80 * GiB - self.used)

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        if self.processes_fail:
            raise self.NVMLError("Not Supported")
        return [types.SimpleNamespace(pid=pid, usedGpuMemory=nbytes) for pid, nbytes in self.procs]


def _install(monkeypatch, nvml):
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    return nvml


def test_nvml_series_split_this_process_from_the_others(tmp_path, monkeypatch):
    me = os.getpid()
    _install(monkeypatch, FakeNvml([(me, 22 * GiB), (me + 1, 6 * GiB), (me + 2, 2 * GiB), (me + 3, None)]))
    r = NvmlProbe().read()
    assert (r["vram_nvml_used"], r["vram_nvml_process"], r["vram_nvml_other_processes"]) == (30 * GiB, 22 * GiB, 8 * GiB)
    with MemoryWriter(tmp_path, every=1, census_every=0, nvml=True) as w:
        w.log_memory(0)
    assert scalars(tmp_path, TAGS["vram_nvml_process"].tag) == [(0, pytest.approx(22.0))]
    assert scalars(tmp_path, TAGS["vram_nvml_other_processes"].tag) == [(0, pytest.approx(8.0))]


def test_nvml_without_this_pid_or_per_process_bytes_records_used_only(monkeypatch, caplog):
    _install(monkeypatch, FakeNvml([(os.getpid() + 1, 6 * GiB)]))  # another pid namespace: not told apart
    assert NvmlProbe().read() == {"vram_nvml_used": 30 * GiB}
    _install(monkeypatch, FakeNvml([], processes_fail=True))
    probe = NvmlProbe()
    with caplog.at_level(logging.WARNING, logger="tbmem"):
        assert probe.read() == {"vram_nvml_used": 30 * GiB} and probe.read() == {"vram_nvml_used": 30 * GiB}
    assert len([r for r in caplog.records if "attribute this device's memory to processes" in r.getMessage()]) <= 1


def test_the_oom_block_names_other_processes_memory(fake_device, monkeypatch):  # noqa: F811
    me = os.getpid()
    nvml = _install(monkeypatch, FakeNvml([(me, 40 * GiB), (me + 1, 30 * GiB)]))
    fake_device.free, fake_device.total = MiB, 80 * GiB
    x = explain_now(torch.OutOfMemoryError(MESSAGE))
    outside = 80 * GiB - MiB - 20 * MiB
    assert x.outside_allocator_bytes == outside and x.other_processes_bytes == 30 * GiB
    assert x.process_device_bytes == 40 * GiB and nvml.inits == nvml.shutdowns == 1
    text = explanation_text(x)
    assert "outside PyTorch's allocator 80.0 GiB = other processes 30.0 GiB (NVML) + this process outside the " \
           "allocator 50.0 GiB" in text
    [adv] = [a for a in x.advice if a["kind"] == "outside_allocator"]
    assert adv["text"].endswith("30.0 GiB of it belong to 1 other process(es) on the device (NVML): stop them or "
                                "use another device")


def test_without_nvml_the_block_says_what_to_install(fake_device, monkeypatch):  # noqa: F811
    monkeypatch.setitem(sys.modules, "pynvml", None)
    x = explain_now(torch.OutOfMemoryError(MESSAGE))
    assert x.other_processes_bytes is None
    assert "other processes' memory on the device is not known: NVML is not installed (pip install 'tbmem[nvml]')" \
        in x.notes
