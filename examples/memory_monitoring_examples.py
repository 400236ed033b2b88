"""Runnable examples of every approach of the memory monitoring guide, on a tiny model.

Run all approaches, or some by number, optionally also writing TensorBoard scalars:

    python examples/memory_monitoring_examples.py            # 1..5
    python examples/memory_monitoring_examples.py 2 4        # context manager, batch profiler
    python examples/memory_monitoring_examples.py --logdir runs/memory_examples

Approaches: 1 configuration-based EpochMemoryMonitor, 2 track_memory context manager,
3 monitor_memory decorator, 4 BatchMemoryProfiler, 5 MemoryMonitor / MemoryTracker.
On a CPU-only machine GPU numbers print as ``n/a``; on a GPU the model and data go to CUDA.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable

import torch
from torch import nn

from tbmem import (BatchMemoryProfiler, EpochMemoryMonitor, MemoryMonitor, MemoryTracker, MemoryWriter,
                   monitor_memory, track_memory)

__all__ = ["main", "APPROACHES"]

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64)).to(DEVICE)


def _batches(count: int, size: int = 32) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    return [(torch.randn(size, 64, generator=gen), torch.randn(size, 64, generator=gen)) for _ in range(count)]


def _step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(x.to(DEVICE)), y.to(DEVICE))
    loss.backward()
    optimizer.step()
    return loss.detach()


def configuration_based(writer: Any) -> None:
    """1. What a trainer does when ``enable_memory_monitoring: true``."""
    config = {"enable_memory_monitoring": True, "memory_monitor_batches": 3}
    monitor = EpochMemoryMonitor(enabled=config["enable_memory_monitoring"],
                                 verbose_batches=config["memory_monitor_batches"], writer=writer)
    print(monitor.banner)
    model = _model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(2):
        monitor.on_epoch_start()
        for batch_idx, (x, y) in enumerate(_batches(5)):
            monitor.on_batch_end(batch_idx, _step(model, optimizer, x, y))
        monitor.on_epoch_end()


def context_manager(writer: Any) -> None:
    """2. ``with track_memory(label):`` around one block."""
    with track_memory("loading dataset", writer=writer):
        data = torch.randn(2_000_000, device=DEVICE)  # 8 MB
    del data


@monitor_memory("training epoch")
def _train_epoch() -> None:
    model = _model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for x, y in _batches(3):
        _step(model, optimizer, x, y)


def decorator(writer: Any) -> None:
    """3. ``@monitor_memory(label)`` on a function."""
    _train_epoch()


def batch_profiling(writer: Any) -> None:
    """4. ``BatchMemoryProfiler`` checkpoints inside the first batches."""
    profiler = BatchMemoryProfiler(enabled=True, writer=writer)
    model = _model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for batch_idx, (x, y) in enumerate(_batches(4, size=256)):
        if batch_idx >= 2:
            profiler.disable()  # only profile the first 2 batches
        profiler.checkpoint("start")
        x, y = x.to(DEVICE), y.to(DEVICE)
        profiler.checkpoint("data_to_gpu")
        loss = nn.functional.mse_loss(model(x), y)
        profiler.checkpoint("forward")
        optimizer.zero_grad()
        loss.backward()
        profiler.checkpoint("backward")
        optimizer.step()
        profiler.checkpoint("optimizer")
        profiler.print_summary()
        profiler.reset()


def manual_tracking(writer: Any) -> None:
    """5. ``MemoryMonitor`` readings and ``MemoryTracker`` checkpoints."""
    model = _model()
    MemoryMonitor.print_memory_usage("After model creation: ")
    tracker = MemoryTracker(writer=writer)
    tracker.record("initialization")
    data = _batches(20, size=256)
    tracker.record("after_data_loading")
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for x, y in data[:3]:
        _step(model, optimizer, x, y)
    tracker.record("after_training")
    tracker.print_summary()
    cpu_mb, gpu_mb = MemoryMonitor.get_cpu_memory_mb(), MemoryMonitor.get_gpu_memory_mb()
    print(f"get_cpu_memory_mb() = {cpu_mb:.1f}, get_gpu_memory_mb() = {gpu_mb}")
    print(f"get_memory_summary() keys: {sorted(MemoryMonitor.get_memory_summary())}")


APPROACHES: dict[int, tuple[str, Callable[[Any], None]]] = {
    1: ("Configuration-based monitoring (EpochMemoryMonitor)", configuration_based),
    2: ("Context manager (track_memory)", context_manager),
    3: ("Function decorator (monitor_memory)", decorator),
    4: ("Batch-level profiling (BatchMemoryProfiler)", batch_profiling),
    5: ("Manual tracking (MemoryMonitor, MemoryTracker)", manual_tracking),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("approaches", nargs="*", type=int, help=f"which to run, of {sorted(APPROACHES)}")
    parser.add_argument("--logdir", help="also write TensorBoard scalars here")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.approaches) - set(APPROACHES))
    if unknown:
        parser.error(f"no approach {unknown}; choose from {sorted(APPROACHES)}")
    writer = MemoryWriter(args.logdir, enabled=False) if args.logdir else None
    try:
        for number in args.approaches or sorted(APPROACHES):
            title, run = APPROACHES[number]
            print(f"\n=== {number}. {title} ===")
            run(writer)
    finally:
        if writer is not None:
            writer.close()
            print(f"\nTensorBoard scalars written; view them with: tensorboard --logdir {args.logdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
