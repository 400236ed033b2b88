"""PerformanceMonitor, EpochPerformanceMonitor, track_performance / monitor_performance: statistics on
a controlled workload (sleeps of known length), the tables' layout, GPU lines, CUDA synchronisation."""

from __future__ import annotations

import io
import re
import time

import pytest
import torch

from tbmem._internal.monitor import EpochPerformanceMonitor, PerformanceMonitor, monitor_performance, track_performance

MiB = 2**20
SLACK = 0.05  # a loaded 2-core machine can oversleep; the monitor adds microseconds


def _sleep(seconds: float) -> float:
    """Sleep and return how long it really took, measured here independently of the monitor."""
    start = time.perf_counter()
    time.sleep(seconds)
    return time.perf_counter() - start


def _columns(row: str) -> list[str]:
    """The five columns of a PERFORMANCE SUMMARY row at the design document's positions (GPU ones stripped)."""
    assert row[30] == row[41] == row[56] == row[71] == " "
    return [row[:30].rstrip(), row[31:41], row[42:56], row[57:71].strip(), row[72:].strip()]


# --- PerformanceMonitor ------------------------------------------------------------------------
def test_operation_times_metrics_and_total():
    monitor = PerformanceMonitor(file=io.StringIO())
    real = {}
    for name, seconds in [("load_ground_truth", 0.03), ("optimization", 0.06)]:
        with monitor.track(name):
            real[name] = _sleep(seconds)
    metrics = monitor.get_metrics()
    assert [m.operation for m in metrics] == ["load_ground_truth", "optimization"]
    for m in metrics:
        assert real[m.operation] <= m.duration_seconds <= real[m.operation] + SLACK
        assert m.gpu_delta_mb is None and m.gpu_peak_mb is None  # CPU: unavailable, not 0
        assert isinstance(m.cpu_delta_mb, float) and m.cpu_peak_mb > 0
    assert monitor.get_operation_time("optimization") == metrics[1].duration_seconds
    assert monitor.get_operation_time("never") == 0.0
    assert monitor.get_total_time() == pytest.approx(sum(m.duration_seconds for m in metrics))
    monitor.clear()
    assert monitor.get_metrics() == [] and monitor.get_total_time() == 0.0


def test_aggregate_statistics_on_known_sleeps():
    monitor = PerformanceMonitor(file=io.StringIO())
    sleeps = [0.01, 0.04, 0.02, 0.03]
    real = []
    for seconds in sleeps:
        with monitor.track("batch_forward", aggregate=True):
            real.append(_sleep(seconds))
    stats = monitor.get_aggregate_stats()["batch_forward"]
    assert stats.count == 4
    assert min(real) <= stats.min <= min(real) + SLACK
    assert max(real) <= stats.max <= max(real) + SLACK
    assert sum(real) / 4 <= stats.mean <= sum(real) / 4 + SLACK
    assert monitor.get_metrics() == []  # aggregated calls keep statistics, not one metric each
    assert monitor.get_total_time() == pytest.approx(stats.total)


def test_summary_tables_layout():
    out = io.StringIO()
    monitor = PerformanceMonitor(file=out)
    with monitor.track("load_ground_truth"):
        pass
    for _ in range(3):
        with monitor.track("batch_forward", aggregate=True):
            pass
    monitor.print_summary(show_aggregate=True)
    lines = out.getvalue().splitlines()
    assert lines[:5] == ["=" * 90, "PERFORMANCE SUMMARY", "=" * 90,
                         "Operation                      Time (s)     CPU (MB)        GPU (MB)        GPU Peak",
                         "-" * 90]
    assert _columns(lines[5]) == ["load_ground_truth", lines[5][31:41], lines[5][42:56], "n/a", "n/a"]
    assert re.fullmatch(r" +\d+\.\d{3}", lines[5][31:41]) and re.fullmatch(r" +[+-]\d+\.\d", lines[5][42:56])
    assert lines[6] == "-" * 90 and re.fullmatch(r"TOTAL {25} +\d+\.\d{3}s", lines[7]) and lines[8] == "=" * 90
    assert len(lines[7]) == 42  # the design document's width
    assert lines[9:14] == ["=" * 90, "AGGREGATE STATISTICS (for repeated operations)", "=" * 90,
                           "Operation                      Count    Total (s)    Mean (s)     Min (s)      Max (s)",
                           "-" * 90]
    assert re.fullmatch(r"batch_forward {18}3 {8} +\d\.\d{3} +\d\.\d{3} +\d\.\d{3} +\d\.\d{3}", lines[14])
    assert lines[15] == "=" * 90 and len(lines) == 16
    out.truncate(0), out.seek(0)
    monitor.print_summary(show_aggregate=False)
    assert "AGGREGATE" not in out.getvalue() and "PERFORMANCE SUMMARY" in out.getvalue()


def test_summary_row_widths_match_the_design_document(fake_gpu):
    out = io.StringIO()
    monitor = PerformanceMonitor(file=out)
    with monitor.track("model forward"):
        fake_gpu.allocated += int(1250.3 * MiB)
        fake_gpu.peak_allocated = 100 * MiB + int(2880.5 * MiB)
    monitor.print_summary()
    row = out.getvalue().splitlines()[5]
    assert _columns(row) == ["model forward", row[31:41], row[42:56], "+1250.3", "2980.5"]
    seed = "model forward                       0.850          +45.2        +1250.3      2880.5"  # 003, verbatim
    assert _columns(seed) == ["model forward", "     0.850", "         +45.2", "+1250.3", "2880.5"]
    assert len(row) == len(seed)


def test_exception_in_a_tracked_block_is_recorded_and_propagates():
    monitor = PerformanceMonitor(file=io.StringIO())
    with pytest.raises(KeyError):
        with monitor.track("failing"):
            raise KeyError("boom")
    assert [m.operation for m in monitor.get_metrics()] == ["failing"]


# --- track_performance / monitor_performance ---------------------------------------------------
def test_track_performance_cpu_lines():
    out = io.StringIO()
    with track_performance("critical_operation", file=out) as tracked:
        real = _sleep(0.02)
    first, second = out.getvalue().splitlines()
    m = re.fullmatch(r"\[Performance\] critical_operation: (\d+\.\d{3})s, CPU [+-]\d+\.\dMB, GPU n/a", first)
    assert m and real - 0.001 <= float(m.group(1)) <= real + SLACK
    assert re.fullmatch(r" {14}CPU peak: \d+\.\dMB", second)
    assert tracked.metric.duration_seconds >= real
    silent = io.StringIO()
    with track_performance("quiet", print_result=False, file=silent) as tracked:
        pass
    assert silent.getvalue() == "" and tracked.metric.operation == "quiet"


def test_monitor_performance_gpu_lines(fake_gpu):
    out = io.StringIO()

    @monitor_performance("data processing", device=0, file=out)
    def process(x: int) -> int:
        fake_gpu.allocated += 512 * MiB
        fake_gpu.peak_allocated = 100 * MiB + int(1024.3 * MiB)
        return x + 1

    assert process(1) == 2
    first, second = out.getvalue().splitlines()
    assert re.fullmatch(r"\[Performance\] data processing: \d+\.\d{3}s, CPU [+-]\d+\.\dMB, GPU \+512\.0MB", first)
    assert second == "              GPU peak: 1124.3MB"


def test_timings_synchronise_pending_cuda_work(fake_gpu, monkeypatch):
    """Kernels queued inside the block are waited for; kernels queued before it are not counted."""
    pending = [0.0]

    def launch(seconds: float) -> None:  # an asynchronous kernel: returns at once
        pending[0] += seconds

    def synchronize(device=None) -> None:
        time.sleep(pending[0])
        pending[0] = 0.0

    monkeypatch.setattr(torch.cuda, "synchronize", synchronize)
    monitor = PerformanceMonitor(device=0, file=io.StringIO())
    launch(0.1)  # queued before: drained by the start-of-span sync, outside the clock
    with monitor.track("before"):
        pass
    with monitor.track("inside"):
        launch(0.1)
    before, inside = monitor.get_metrics()
    assert before.duration_seconds < 0.05
    assert inside.duration_seconds >= 0.1


# --- EpochPerformanceMonitor -------------------------------------------------------------------
def test_epoch_statistics_on_known_sleeps():
    out = io.StringIO()
    monitor = EpochPerformanceMonitor(enabled=True, verbose_batches=2, file=out)
    plan = [[0.03, 0.01, 0.02], [0.015, 0.025]]
    real, epoch_real = [], []
    for epoch in plan:
        start = time.perf_counter()
        monitor.on_epoch_start()
        for i, seconds in enumerate(epoch):
            monitor.on_batch_start(i)
            real.append(_sleep(seconds))
            monitor.on_batch_end(i, loss=0.009458)
        monitor.on_epoch_end()
        epoch_real.append(time.perf_counter() - start)
    stats = monitor.get_statistics()
    assert set(stats) == {"total_epoch_time", "avg_epoch_time", "total_batch_time", "avg_batch_time",
                          "min_batch_time", "max_batch_time", "num_batches", "num_epochs"}
    assert stats["num_batches"] == 5 and stats["num_epochs"] == 2
    assert min(real) <= stats["min_batch_time"] <= min(real) + SLACK
    assert max(real) <= stats["max_batch_time"] <= max(real) + SLACK
    assert sum(real) <= stats["total_batch_time"] <= sum(real) + SLACK
    assert stats["avg_batch_time"] == pytest.approx(stats["total_batch_time"] / 5)
    assert sum(real) <= stats["total_epoch_time"] <= sum(epoch_real)
    assert stats["avg_epoch_time"] == pytest.approx(stats["total_epoch_time"] / 2)

    lines = out.getvalue().splitlines()
    assert len(lines) == 2 * (2 + 2)
    batch = re.compile(r"Batch (\d): (\d+\.\d{3})s, GPU n/a, CPU \d+\.\dMB, loss=0\.009458")
    epoch_end = re.compile(r"Epoch end: (\d+\.\d{3})s total, GPU n/a, CPU \d+\.\dMB, peak CPU \d+MB")
    timing = re.compile(r"Batch timing: avg=(\d+\.\d{3})s, min=(\d+\.\d{3})s, max=(\d+\.\d{3})s")
    for block, sleeps in zip((lines[:4], lines[4:]), plan):
        assert [int(batch.fullmatch(line).group(1)) for line in block[:2]] == [0, 1]
        assert epoch_end.fullmatch(block[2])
        avg, lo, hi = (float(x) for x in timing.fullmatch(block[3]).groups())
        assert min(sleeps) - 0.001 <= lo <= hi and hi >= max(sleeps) - 0.001 and lo <= avg <= hi


def test_batches_without_on_batch_start_run_from_the_previous_end():
    monitor = EpochPerformanceMonitor(verbose_batches=0, file=io.StringIO())
    monitor.on_epoch_start()
    for i in range(3):
        _sleep(0.02)
        monitor.on_batch_end(i)
    monitor.on_epoch_end()
    stats = monitor.get_statistics()
    assert stats["num_batches"] == 3 and stats["min_batch_time"] >= 0.02


def test_epoch_performance_gpu_lines(fake_gpu):
    out = io.StringIO()
    monitor = EpochPerformanceMonitor(verbose_batches=1, device=0, file=out)
    monitor.on_epoch_start()
    fake_gpu.allocated = int(23.1 * MiB) + 1
    fake_gpu.peak_allocated = 2880 * MiB
    monitor.on_batch_start(0)
    monitor.on_batch_end(0, torch.tensor(0.009458))
    monitor.on_epoch_end()
    lines = out.getvalue().splitlines()
    assert re.fullmatch(r"Batch 0: \d+\.\d{3}s, GPU 23\.1MB, CPU \d+\.\dMB, loss=0\.009458", lines[0])
    assert re.fullmatch(r"Epoch end: \d+\.\d{3}s total, GPU 23\.1MB, 300MB reserved, peak 2880MB", lines[1])
    assert re.fullmatch(r"Batch timing: avg=\d+\.\d{3}s, min=\d+\.\d{3}s, max=\d+\.\d{3}s", lines[2])
    assert fake_gpu.synchronized >= 4  # epoch start, batch start, batch end, epoch end


def test_epoch_performance_rejects_bad_values():
    with pytest.raises(ValueError, match="verbose_batches"):
        EpochPerformanceMonitor(verbose_batches=-2)
    with pytest.raises(ValueError, match="device"):
        PerformanceMonitor(device="tpu:x")
    assert PerformanceMonitor(device=torch.device("cuda", 1)).device == 1
    assert PerformanceMonitor(device="cuda").device is None and PerformanceMonitor(device="cpu").device is None
    with pytest.raises(ValueError, match="label"):
        track_performance("")
