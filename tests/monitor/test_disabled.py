"""Disabled monitors print nothing, write nothing and read nothing."""

from __future__ import annotations

import pytest

from tbmem import MemoryWriter
from tbmem._internal import _torch_private as tp
from tbmem._internal.monitor import readings
from tbmem._internal.monitor import (BatchMemoryProfiler, EpochMemoryMonitor, EpochPerformanceMonitor, MemoryTracker,
                           PerformanceMonitor, monitor_memory, track_memory, track_performance)
from tests.monitor.conftest import value_events


@pytest.fixture
def reads(monkeypatch):
    """Counts every memory or CUDA reading the monitors make."""
    calls = {"rss": 0, "cuda": 0}
    real_read_rss = readings.read_rss

    def read_rss():
        calls["rss"] += 1
        return real_read_rss()

    def cuda_ready():
        calls["cuda"] += 1
        return False

    monkeypatch.setattr(readings, "read_rss", read_rss)
    monkeypatch.setattr(tp, "cuda_ready", cuda_ready)
    return calls


def test_disabled_monitors_print_write_and_read_nothing(tmp_path, capsys, reads):
    with MemoryWriter(tmp_path, enabled=False, custom_layout=False) as writer:
        epoch_memory = EpochMemoryMonitor(enabled=False, writer=writer)
        epoch_perf = EpochPerformanceMonitor(enabled=False, writer=writer)
        perf = PerformanceMonitor(enabled=False, writer=writer)
        profiler = BatchMemoryProfiler(enabled=False, writer=writer)
        tracker = MemoryTracker(enabled=False, writer=writer)
        for monitor in (epoch_memory, epoch_perf):
            for _ in range(2):
                monitor.on_epoch_start()
                for i in range(3):
                    if monitor is epoch_perf:
                        monitor.on_batch_start(i)
                    monitor.on_batch_end(i, 0.5)
                monitor.on_epoch_end()
        with perf.track("op"):
            pass
        perf.print_summary()
        profiler.checkpoint("start")
        profiler.checkpoint("end")
        profiler.print_summary()
        profiler.reset()
        tracker.record("a")
        tracker.print_summary()
        with track_memory("x", writer=writer, enabled=False) as tracked:
            pass
        with track_performance("y", writer=writer, enabled=False):
            pass

        @monitor_memory("z", enabled=False)
        def work() -> int:
            return 1

        assert work() == 1
    assert capsys.readouterr().out == ""
    assert value_events(tmp_path) == []
    assert reads == {"rss": 0, "cuda": 0}
    assert tracked.metric is None
    assert perf.get_metrics() == [] and epoch_perf.get_statistics()["num_batches"] == 0


def test_an_enabled_monitor_does_read(capsys, reads):
    """The counter above can fail: an enabled monitor reads memory and CUDA state."""
    monitor = EpochMemoryMonitor(verbose_batches=1)
    monitor.on_epoch_start()
    monitor.on_batch_end(0, 0.5)
    assert reads["rss"] >= 1 and reads["cuda"] >= 1
    assert capsys.readouterr().out.startswith("Batch 0: GPU n/a, CPU ")


def test_verbose_zero_without_writer_reads_nothing_per_batch(capsys, reads):
    monitor = EpochMemoryMonitor(verbose_batches=0)
    monitor.on_epoch_start()
    before = dict(reads)
    for i in range(10):
        monitor.on_batch_end(i, 0.5)
    assert reads == before and capsys.readouterr().out == ""
