"""Real-CUDA checks (deselected by default; run with ``-m gpu`` on a machine with a GPU)."""

from __future__ import annotations

import io
import re

import pytest
import torch

from tbmem._internal.monitor import EpochMemoryMonitor, PerformanceMonitor, track_memory

pytestmark = pytest.mark.gpu
MiB = 2**20


def test_epoch_lines_and_peak_on_a_real_device():
    torch.zeros(1, device="cuda")  # the program initialises CUDA; the monitors never do
    out = io.StringIO()
    monitor = EpochMemoryMonitor(verbose_batches=1, file=out)
    monitor.on_epoch_start()
    block = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
    del block
    monitor.on_batch_end(0, torch.tensor(0.5, device="cuda"))
    monitor.on_epoch_end()
    lines = out.getvalue().splitlines()
    assert re.fullmatch(r"Batch 0: GPU \d+\.\d MB, CPU \d+\.\d MB, loss=0\.500000", lines[0])
    m = re.fullmatch(r"Epoch end: GPU \d+\.\d MB allocated, \d+\.\d MB reserved, peak (\d+\.\d) MB", lines[1])
    assert m and float(m.group(1)) >= 256


def test_gpu_timing_includes_queued_kernels():
    a = torch.randn(4096, 4096, device="cuda")
    torch.cuda.synchronize()
    monitor = PerformanceMonitor(device=0, file=io.StringIO())
    with monitor.track("matmuls"):
        for _ in range(20):
            a = a @ a / 4096
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        a = a @ a / 4096
    end.record()
    torch.cuda.synchronize()
    gpu_seconds = start.elapsed_time(end) / 1000
    assert monitor.get_metrics()[0].duration_seconds >= 0.5 * gpu_seconds


def test_track_memory_gpu_delta():
    torch.zeros(1, device="cuda")
    with track_memory("alloc", file=io.StringIO()) as tracked:
        keep = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
    assert tracked.metric.gpu_delta_mb == pytest.approx(64, abs=2)
    del keep
