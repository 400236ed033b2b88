"""Runnable examples of every approach of the performance monitoring guide, on a tiny model.

    python examples/performance_monitoring_examples.py            # 1..6
    python examples/performance_monitoring_examples.py 5          # training-loop monitoring only
    python examples/performance_monitoring_examples.py --logdir runs/performance_examples

Approaches: 1 PerformanceMonitor, 2 aggregated operations, 3 track_performance context
manager, 4 monitor_performance decorator, 5 EpochPerformanceMonitor in a training loop,
6 bottleneck identification from get_metrics() / get_statistics().
Workloads include short sleeps of known length, so the printed timings can be checked.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Callable

import torch
from torch import nn

from tbmem import (EpochPerformanceMonitor, MemoryWriter, PerformanceMonitor, monitor_performance,
                   track_performance)

__all__ = ["main", "APPROACHES"]

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64)).to(DEVICE)


def _data(size: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return torch.randn(size, 64, generator=gen), torch.randn(size, 64, generator=gen)


def basic(writer: Any) -> None:
    """1. PerformanceMonitor.track around named operations, then the summary table."""
    monitor = PerformanceMonitor(writer=writer)
    with monitor.track("data loading"):
        time.sleep(0.03)  # stands in for reading files
        x, y = _data()
    with monitor.track("preprocessing"):
        x = (x - x.mean()) / x.std()
    model = _model()
    with monitor.track("model forward"):
        output = model(x.to(DEVICE))
    monitor.print_summary()
    del output, y


def aggregated(writer: Any) -> None:
    """2. Repeated operations with aggregate=True: count/total/mean/min/max."""
    monitor = PerformanceMonitor(writer=writer)
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    x, y = _data()
    for _ in range(2):  # epochs
        for _ in range(5):  # batches
            with monitor.track("batch_forward", aggregate=True):
                loss = nn.functional.mse_loss(model(x.to(DEVICE)), y.to(DEVICE))
            with monitor.track("batch_backward", aggregate=True):
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
    monitor.print_summary(show_aggregate=True)


def context_manager(writer: Any) -> None:
    """3. One-off profiling with track_performance."""
    with track_performance("critical_operation", writer=writer):
        time.sleep(0.02)
        _ = torch.randn(1_000_000, device=DEVICE).sum()


@monitor_performance("data processing")
def _process_batch(batch: torch.Tensor) -> torch.Tensor:
    time.sleep(0.01)
    return batch * 2


def decorator(writer: Any) -> None:
    """4. monitor_performance prints on every call of the decorated function."""
    x, _ = _data()
    _process_batch(x)


def training_loop(writer: Any) -> None:
    """5. EpochPerformanceMonitor hooks in a training loop (the SyntheticTrainer's pattern)."""
    monitor = EpochPerformanceMonitor(enabled=True, verbose_batches=2, writer=writer)
    model = _model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = _data()
    for _ in range(2):
        monitor.on_epoch_start()
        for batch_idx in range(4):
            monitor.on_batch_start(batch_idx)
            time.sleep(0.02 if batch_idx == 0 else 0.005)  # a slow first batch, as in the guide
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x.to(DEVICE)), y.to(DEVICE))
            loss.backward()
            optimizer.step()
            monitor.on_batch_end(batch_idx, loss.detach())
        monitor.on_epoch_end()
    stats = monitor.get_statistics()
    print(f"Average batch time: {stats['avg_batch_time']:.3f}s")
    print(f"Min batch time: {stats['min_batch_time']:.3f}s")
    print(f"Max batch time: {stats['max_batch_time']:.3f}s")
    ratio = stats["max_batch_time"] / stats["min_batch_time"]
    if ratio > 2.0:
        print(f"High variance ({ratio:.1f}x) - investigate outliers!")


def bottlenecks(writer: Any) -> None:
    """6. Which operation dominates: shares of get_total_time()."""
    monitor = PerformanceMonitor(writer=writer)
    for name, seconds in [("data_loading", 0.01), ("preprocessing", 0.005), ("model_forward", 0.04),
                          ("post_processing", 0.005)]:
        with monitor.track(name):
            time.sleep(seconds)
    monitor.print_summary()
    total = monitor.get_total_time()
    for metric in monitor.get_metrics():
        share = metric.duration_seconds / total * 100
        if share > 50:
            print(f"BOTTLENECK: {metric.operation} ({share:.1f}%)")
        elif share > 20:
            print(f"Consider optimizing: {metric.operation} ({share:.1f}%)")


APPROACHES: dict[int, tuple[str, Callable[[Any], None]]] = {
    1: ("Basic PerformanceMonitor usage", basic),
    2: ("Aggregated operation tracking", aggregated),
    3: ("Context manager (track_performance)", context_manager),
    4: ("Function decorator (monitor_performance)", decorator),
    5: ("Training loop monitoring (EpochPerformanceMonitor)", training_loop),
    6: ("Bottleneck identification", bottlenecks),
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
