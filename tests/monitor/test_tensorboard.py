"""The TensorBoard side of the monitors, read back from the event files: tags from the tag table,
one event per batch / operation, monotonic steps across epochs, values equal to what was measured."""

from __future__ import annotations

import io
import os

import psutil
import pytest
import torch
from torch.utils.tensorboard import SummaryWriter

from tbmem import MemoryWriter
from tbmem._internal.monitor import (BatchMemoryProfiler, EpochMemoryMonitor, EpochPerformanceMonitor, MemoryTracker,
                           PerformanceMonitor, track_memory, track_performance)
from tests._events import read_events, scalars
from tests.monitor.conftest import value_events

MiB = 2**20


def _writer(tmp_path) -> MemoryWriter:
    return MemoryWriter(tmp_path, enabled=False, custom_layout=False)


def test_epoch_memory_monitor_writes_one_event_per_batch_with_global_steps(tmp_path):
    losses = [[0.5, 0.4, 0.3], [0.25, 0.2, 0.15]]
    with _writer(tmp_path) as writer:
        monitor = EpochMemoryMonitor(verbose_batches=1, writer=writer, file=io.StringIO())
        for epoch in losses:
            monitor.on_epoch_start()
            for i, loss in enumerate(epoch):
                monitor.on_batch_end(i, torch.tensor(loss))
            monitor.on_epoch_end()
    rss_mb = psutil.Process(os.getpid()).memory_info().rss / MiB
    loss_points = scalars(tmp_path, "Loss/batch")
    assert [s for s, _ in loss_points] == list(range(6))
    assert [v for _, v in loss_points] == pytest.approx([x for e in losses for x in e])
    cpu = scalars(tmp_path, "Monitor/batch_cpu_rss_MB")
    assert [s for s, _ in cpu] == list(range(6))
    assert all(v == pytest.approx(rss_mb, rel=0.1) for _, v in cpu)
    peaks = scalars(tmp_path, "Monitor/epoch_cpu_peak_rss_MB")  # CPU run: the epoch's peak RSS
    assert "Monitor/epoch_gpu_peak_MB" not in read_events(tmp_path).Tags()["scalars"]  # no CPU reading as gpu
    assert [s for s, _ in peaks] == [0, 1] and all(v >= c for (_, v), (_, c) in zip(peaks, cpu[::3]))
    events = value_events(tmp_path)
    batch_events = [values for _, values in events if "Loss/batch" in values]
    assert len(batch_events) == 6  # one event per batch carrying every batch scalar
    assert all(set(v) == {"Loss/batch", "Monitor/batch_cpu_rss_MB"} for v in batch_events)  # no GPU tag on CPU


def test_epoch_memory_monitor_gpu_tags(fake_gpu, tmp_path):
    with _writer(tmp_path) as writer:
        monitor = EpochMemoryMonitor(verbose_batches=0, writer=writer, file=io.StringIO())
        monitor.on_epoch_start()
        fake_gpu.allocated = 40 * MiB
        fake_gpu.peak_allocated = 700 * MiB
        monitor.on_batch_end(0, 1.0)
        monitor.on_epoch_end()
    assert scalars(tmp_path, "Monitor/batch_gpu_allocated_MB") == [(0, 40.0)]
    assert scalars(tmp_path, "Monitor/epoch_gpu_peak_MB") == [(0, 700.0)]


def test_epoch_performance_monitor_scalars_equal_its_statistics(tmp_path):
    with _writer(tmp_path) as writer:
        monitor = EpochPerformanceMonitor(verbose_batches=0, writer=writer, file=io.StringIO())
        for _ in range(2):
            monitor.on_epoch_start()
            for i in range(3):
                monitor.on_batch_start(i)
                monitor.on_batch_end(i, 0.5)
            monitor.on_epoch_end()
        stats = monitor.get_statistics()
    times = scalars(tmp_path, "Perf/batch_time_s")
    assert [s for s, _ in times] == list(range(6))
    assert sum(v for _, v in times) == pytest.approx(stats["total_batch_time"], rel=1e-4, abs=1e-6)
    assert max(v for _, v in times) == pytest.approx(stats["max_batch_time"], rel=1e-4)
    epochs = scalars(tmp_path, "Perf/epoch_time_s")
    assert [s for s, _ in epochs] == [0, 1]
    assert sum(v for _, v in epochs) == pytest.approx(stats["total_epoch_time"], rel=1e-4)


def test_performance_monitor_one_event_per_operation(tmp_path):
    with _writer(tmp_path) as writer:
        monitor = PerformanceMonitor(writer=writer, file=io.StringIO())
        for _ in range(2):
            with monitor.track("load ground truth"):
                block = torch.ones(4 * MiB)
        for _ in range(3):
            with monitor.track("batch_forward", aggregate=True):
                pass
        metrics = monitor.get_metrics()
    op = scalars(tmp_path, "Perf/Operation/load_ground_truth_s")
    assert op == [(i, pytest.approx(m.duration_seconds, rel=1e-5)) for i, m in enumerate(metrics)]
    cpu = scalars(tmp_path, "Monitor/Operation/load_ground_truth_cpu_delta_MB")
    assert [v for _, v in cpu] == pytest.approx([m.cpu_delta_mb for m in metrics], abs=1e-3)
    assert [s for s, _ in scalars(tmp_path, "Perf/Operation/batch_forward_s")] == [0, 1, 2]
    tags = set().union(*(values for _, values in value_events(tmp_path)))
    assert "Monitor/Operation/batch_forward_cpu_delta_MB" not in tags  # aggregated: timing only
    assert not any("gpu_delta" in tag for tag in tags)  # CPU run: no fake GPU curves
    assert len(value_events(tmp_path)) == 5
    del block


def test_track_helpers_profiler_and_tracker_write(fake_gpu, tmp_path):
    sw = SummaryWriter(str(tmp_path))  # a plain SummaryWriter is accepted too
    with track_memory("load", writer=sw, step=7, file=io.StringIO()):
        fake_gpu.allocated += 64 * MiB
    with track_performance("solve", writer=sw, file=io.StringIO()):
        pass
    profiler = BatchMemoryProfiler(writer=sw, file=io.StringIO())
    profiler.checkpoint("start")
    fake_gpu.allocated += 19 * MiB
    profiler.checkpoint("data to gpu")
    profiler.print_summary()
    profiler.reset()  # already written: no second event
    tracker = MemoryTracker(writer=sw, file=io.StringIO())
    tracker.record("init")
    fake_gpu.allocated += 5 * MiB
    tracker.record("after")
    sw.close()
    assert scalars(tmp_path, "Monitor/Operation/load_gpu_delta_MB") == [(7, 64.0)]
    assert [s for s, _ in scalars(tmp_path, "Perf/Operation/solve_s")] == [0]
    assert scalars(tmp_path, "Monitor/Operation/start_to_data_to_gpu_gpu_delta_MB") == [(0, 19.0)]
    assert scalars(tmp_path, "Monitor/Operation/after_gpu_delta_MB") == [(1, 5.0)]


class _FullDisk:
    """A writer whose writes fail the way a full disk makes them fail."""

    def write_scalars(self, values, step, walltime=None):
        raise OSError(28, "No space left on device")


def test_a_failing_writer_is_reported_once_not_raised(tbmem_log):
    monitor = EpochMemoryMonitor(verbose_batches=0, writer=_FullDisk(), file=io.StringIO())
    monitor.on_epoch_start()
    monitor.on_batch_end(0, 1.0)
    monitor.on_batch_end(1, 1.0)
    monitor.on_epoch_end()
    assert monitor.global_step == 2 and monitor.epoch == 1
    assert len(tbmem_log.records) == 1 and "No space left" in tbmem_log.records[0].getMessage()


def test_log_every_decimates_batch_events_keeping_global_steps(tmp_path):
    with _writer(tmp_path) as writer:
        monitor = EpochPerformanceMonitor(verbose_batches=0, writer=writer, log_every=3, file=io.StringIO())
        for _ in range(2):
            monitor.on_epoch_start()
            for i in range(4):
                monitor.on_batch_end(i, float(i))
            monitor.on_epoch_end()
    assert [s for s, _ in scalars(tmp_path, "Perf/batch_time_s")] == [0, 3, 6]  # batch 0 runs from epoch start
    assert scalars(tmp_path, "Loss/batch") == [(0, 0.0), (3, 3.0), (6, 2.0)]
    assert [s for s, _ in scalars(tmp_path, "Perf/epoch_time_s")] == [0, 1]
    with pytest.raises(ValueError, match="log_every"):
        EpochMemoryMonitor(log_every=0)
