"""MemoryMonitor, MemoryTracker, EpochMemoryMonitor, BatchMemoryProfiler, track_memory / monitor_memory:
console formats on CPU and on a (fake) GPU, values against independent readings, peaks."""

from __future__ import annotations

import io
import mmap
import os
import re

import numpy as np
import psutil
import pytest
import torch

from tbmem._internal.monitor import (BatchMemoryProfiler, EpochMemoryMonitor, MemoryMonitor, MemoryTracker,
                           monitor_memory, track_memory)
from tbmem._internal.probes.host import reset_peak_rss

MiB = 2**20


class _Resident:
    """``nbytes`` of freshly mapped, touched memory; :meth:`close` unmaps it.

    RSS grows and shrinks by exactly this much whatever the process's allocators hold: a
    ``torch.ones`` of the same size can be served from memory malloc or the OS already counts
    (seen in the full suite), which made RSS-delta assertions flaky.
    """

    def __init__(self, nbytes: int) -> None:
        self._region = mmap.mmap(-1, nbytes)
        view = np.frombuffer(self._region, dtype=np.uint8)
        view[:] = 1  # touch every page
        del view  # an exported buffer would keep close() from unmapping

    def close(self) -> None:
        self._region.close()
MB = r"\d+\.\d MB"


def _set_alloc(fake, nbytes: int) -> None:
    fake.allocated = nbytes
    fake.peak_allocated = max(fake.peak_allocated, nbytes)


def _rss_mb() -> float:
    return psutil.Process(os.getpid()).memory_info().rss / MiB


# --- MemoryMonitor -----------------------------------------------------------------------------
def test_usage_line_on_cpu(capsys):
    MemoryMonitor.print_memory_usage("After model creation: ")
    MemoryMonitor.print_memory_usage("")
    out = capsys.readouterr().out.splitlines()
    assert re.fullmatch(rf"After model creation: CPU: {MB} \| GPU Allocated: n/a \| GPU Reserved: n/a", out[0])
    assert re.fullmatch(rf"CPU: {MB} \| GPU Allocated: n/a \| GPU Reserved: n/a", out[1])
    assert not torch.cuda.is_initialized()


def test_usage_line_on_gpu(fake_gpu, capsys):
    MemoryMonitor.print_memory_usage("Loss evaluation 0")
    line = capsys.readouterr().out.strip()
    assert re.fullmatch(rf"Loss evaluation 0: CPU: {MB} \| GPU Allocated: 100\.0 MB \| GPU Reserved: 300\.0 MB", line)


def test_static_readings_match_psutil_and_the_allocator(fake_gpu):
    assert MemoryMonitor.get_cpu_memory_mb() == pytest.approx(_rss_mb(), rel=0.1)
    assert MemoryMonitor.get_gpu_memory_mb() == 100.0
    summary = MemoryMonitor.get_memory_summary()
    assert summary["gpu_reserved_mb"] == 300.0 and summary["gpu_peak_mb"] == 150.0
    assert summary["system_percent"] == pytest.approx(psutil.virtual_memory().percent, abs=5)


def test_gpu_readings_are_none_on_cpu_not_zero():
    assert MemoryMonitor.get_gpu_memory_mb() is None
    summary = MemoryMonitor.get_memory_summary()
    assert summary["gpu_allocated_mb"] is None and summary["cpu_mb"] > 0


def test_print_memory_usage_never_raises(fake_gpu, monkeypatch, capsys, tbmem_log):
    def broken(device=None):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(torch.cuda, "memory_stats", broken)
    MemoryMonitor.print_memory_usage("inside a loss function")
    MemoryMonitor.print_memory_usage("again")
    out = capsys.readouterr().out.splitlines()
    assert all("GPU Allocated: n/a" in line for line in out) and len(out) == 2
    assert len(tbmem_log.records) == 1 and "illegal memory access" in tbmem_log.records[0].getMessage()


# --- MemoryTracker -----------------------------------------------------------------------------
def test_tracker_checkpoints_and_table(fake_gpu):
    out = io.StringIO()
    tracker = MemoryTracker(file=out)
    tracker.record("initialization")
    _set_alloc(fake_gpu, 350 * MiB)
    tracker.record("after_data_loading")
    points = tracker.checkpoints
    assert [p.label for p in points] == ["initialization", "after_data_loading"]
    assert points[1].gpu_allocated_mb - points[0].gpu_allocated_mb == 250.0
    assert points[1].gpu_reserved_mb == 300.0 and points[1].elapsed_s >= points[0].elapsed_s
    tracker.print_summary()
    lines = out.getvalue().splitlines()
    assert lines[1] == "MEMORY CHECKPOINTS"
    assert re.match(r"Checkpoint\s+Time \(s\)\s+CPU \(MB\)\s+CPU change\s+GPU \(MB\)\s+GPU change$", lines[3])
    assert re.fullmatch(r"after_data_loading\s+\d+\.\d{3}\s+\d+\.\d\s+[+-]\d+\.\d\s+350\.0\s+\+250\.0", lines[6])


def test_tracker_on_cpu_shows_na_and_disabled_records_nothing():
    out = io.StringIO()
    tracker = MemoryTracker(file=out)
    tracker.record("a")
    tracker.print_summary()
    assert re.search(r"^a\s+\d+\.\d{3}\s+\d+\.\d\s+\+0\.0\s+n/a\s+n/a$", out.getvalue(), re.M)
    off = MemoryTracker(enabled=False, file=out)
    assert off.record("x") is None and off.checkpoints == ()


# --- EpochMemoryMonitor ------------------------------------------------------------------------
def test_epoch_monitor_cpu_lines_and_verbose_count():
    out = io.StringIO()
    monitor = EpochMemoryMonitor(enabled=True, verbose_batches=3, file=out)
    losses = [0.005310, 0.016940, 0.009066, 0.014149, 0.011887]
    for _ in range(2):
        monitor.on_epoch_start()
        for i, loss in enumerate(losses):
            monitor.on_batch_end(i, torch.tensor(loss))
        monitor.on_epoch_end()
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 * (3 + 1)
    for epoch in range(2):
        block = lines[epoch * 4:(epoch + 1) * 4]
        for i in range(3):
            m = re.fullmatch(rf"Batch {i}: GPU n/a, CPU ({MB[:-3]}) MB, loss=(\d\.\d{{6}})", block[i])
            assert m and float(m.group(2)) == pytest.approx(losses[i], abs=1e-6)
            assert float(m.group(1)) == pytest.approx(_rss_mb(), rel=0.1)
        assert re.fullmatch(rf"Epoch end: GPU n/a, CPU {MB}, peak CPU {MB}", block[3])
    assert monitor.global_step == 10 and monitor.epoch == 2


def test_epoch_monitor_gpu_lines_and_peak(fake_gpu):
    out = io.StringIO()
    monitor = EpochMemoryMonitor(verbose_batches=5, file=out)
    monitor.on_epoch_start()
    assert fake_gpu.peak_allocated == 100 * MiB  # the epoch's window reset the allocator's peak
    _set_alloc(fake_gpu, int(2880.3 * MiB))
    _set_alloc(fake_gpu, int(23.1 * MiB) + 1)
    monitor.on_batch_end(0, 0.005310)
    monitor.on_epoch_end()
    lines = out.getvalue().splitlines()
    assert lines == ["Batch 0: GPU 23.1 MB, CPU " + lines[0].split("CPU ")[1].split(",")[0] + ", loss=0.005310",
                     "Epoch end: GPU 23.1 MB allocated, 300.0 MB reserved, peak 2880.3 MB"]
    assert monitor.last_peak_mb == pytest.approx(2880.3, abs=0.01)


def test_epoch_monitor_cpu_peak_sees_a_freed_allocation():
    out = io.StringIO()
    monitor = EpochMemoryMonitor(verbose_batches=0, file=out)
    before = _rss_mb()
    monitor.on_epoch_start()
    _Resident(64 * MiB).close()
    monitor.on_epoch_end()
    peak = float(re.search(r"peak CPU (\d+\.\d) MB", out.getvalue()).group(1))
    assert peak >= before + 60
    assert monitor.last_peak_mb == pytest.approx(peak, abs=0.05)


@pytest.mark.skipif(not reset_peak_rss(), reason="the kernel does not allow resetting VmHWM here")
def test_cpu_peak_is_windowed():
    out = io.StringIO()
    monitor = EpochMemoryMonitor(verbose_batches=0, file=out)
    monitor.on_epoch_start()
    _Resident(64 * MiB).close()
    monitor.on_epoch_end()
    monitor.on_epoch_start()
    monitor.on_epoch_end()
    first, second = (float(x) for x in re.findall(r"peak CPU (\d+\.\d) MB", out.getvalue()))
    assert second < first - 40  # the second epoch did not allocate the 64 MB


def test_bad_configuration_raises_value_error_naming_the_field():
    with pytest.raises(ValueError, match="verbose_batches"):
        EpochMemoryMonitor(verbose_batches=-1)
    with pytest.raises(ValueError, match="verbose_batches"):
        EpochMemoryMonitor(verbose_batches=True)
    with pytest.raises(ValueError, match="file"):
        EpochMemoryMonitor(file="out.txt")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="device"):
        BatchMemoryProfiler(device=-1)
    with pytest.raises(ValueError, match="writer"):
        EpochMemoryMonitor(writer=object())


# --- BatchMemoryProfiler -----------------------------------------------------------------------
def test_profiler_gpu_transitions(fake_gpu):
    out = io.StringIO()
    profiler = BatchMemoryProfiler(enabled=True, file=out)
    fake_gpu.allocated = int(10.1 * MiB)
    for name, mb in [("start", 10.1), ("data_to_gpu", 29.1), ("forward", 2749.9), ("backward", 23.1),
                     ("optimizer", 23.1)]:
        fake_gpu.allocated = round(mb * MiB)
        profiler.checkpoint(name)
    profiler.print_summary()
    assert out.getvalue().splitlines() == [
        "Memory profile:",
        "  start → data_to_gpu: GPU 29.1 MB (+19.0 MB)",
        "  data_to_gpu → forward: GPU 2749.9 MB (+2720.8 MB)",
        "  forward → backward: GPU 23.1 MB (-2726.8 MB)",
        "  backward → optimizer: GPU 23.1 MB (+0.0 MB)",
    ]


def test_profiler_cpu_transitions_reset_and_disable():
    out = io.StringIO()
    profiler = BatchMemoryProfiler(file=out)
    profiler.checkpoint("start")
    block = _Resident(64 * MiB)
    profiler.checkpoint("allocate")
    profiler.print_summary()
    lines = out.getvalue().splitlines()
    m = re.fullmatch(rf"  start → allocate: GPU n/a, CPU {MB} \(\+(\d+\.\d) MB\)", lines[1])
    assert m and float(m.group(1)) == pytest.approx(64, abs=4)
    profiler.reset()
    assert profiler.checkpoints == ()
    profiler.disable()
    profiler.checkpoint("ignored")
    profiler.print_summary()
    assert profiler.checkpoints == () and len(out.getvalue().splitlines()) == 2
    profiler.enable()
    profiler.checkpoint("again")
    assert [name for name, _ in profiler.checkpoints] == ["again"]
    block.close()


# --- track_memory / monitor_memory -------------------------------------------------------------
def test_track_memory_gpu_lines(fake_gpu):
    out = io.StringIO()
    with track_memory("loading dataset", file=out) as tracked:
        _set_alloc(fake_gpu, 100 * MiB + int(1500.2 * MiB))
        _set_alloc(fake_gpu, 100 * MiB + int(1250.5 * MiB))
    first, second = out.getvalue().splitlines()
    assert re.fullmatch(r"\[Memory\] loading dataset: CPU [+-]\d+\.\d MB, GPU \+1250\.5 MB", first)
    assert second == "         Peak GPU: 1600.2 MB"
    assert tracked.metric.gpu_delta_mb == pytest.approx(1250.5, abs=0.01)


def test_monitor_memory_cpu_lines_bare_and_labelled():
    out = io.StringIO()

    @monitor_memory("training epoch", file=out)
    def allocate() -> int:
        block = _Resident(64 * MiB)
        block.close()
        return 16 * MiB

    @monitor_memory
    def bare() -> str:
        return "ok"

    assert allocate() == 16 * MiB
    first, second = out.getvalue().splitlines()
    assert re.fullmatch(r"\[Memory\] training epoch: CPU [+-]\d+\.\d MB, GPU n/a", first)
    m = re.fullmatch(r" {9}Peak CPU: (\d+\.\d) MB", second)
    assert m and float(m.group(1)) >= _rss_mb() + 60  # the 64 MB block was freed before the end
    assert bare() == "ok"


def test_nested_windows_keep_their_own_gpu_peaks(fake_gpu):
    out = io.StringIO()
    monitor = EpochMemoryMonitor(verbose_batches=0, file=out)
    monitor.on_epoch_start()
    _set_alloc(fake_gpu, 500 * MiB)
    _set_alloc(fake_gpu, 100 * MiB)
    with track_memory("inner", file=out) as inner:
        _set_alloc(fake_gpu, 300 * MiB)
        _set_alloc(fake_gpu, 100 * MiB)
    monitor.on_epoch_end()
    assert inner.metric.gpu_peak_mb == 300.0
    assert monitor.last_peak_mb == 500.0
