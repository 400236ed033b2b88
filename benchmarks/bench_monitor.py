"""Console monitors: cost of the hooks per batch, disabled and enabled, against a bare loop and a tiny step.

Run: ``python benchmarks/bench_monitor.py`` (or ``make bench``). The machine's noise matters more
than these costs, so each comparison is timed in interleaved rounds (see _common.interleaved).
"""

from __future__ import annotations

import io
import sys
import tempfile
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import interleaved, result_line  # noqa: E402

import torch  # noqa: E402

from tbmem import MemoryWriter  # noqa: E402
from tbmem._internal.monitor import EpochMemoryMonitor, EpochPerformanceMonitor, PerformanceMonitor  # noqa: E402


def _per_call_us(base: Callable[[], None], cand: Callable[[], None], repeat: int) -> tuple[float, float, float]:
    t_base, t_cand = interleaved(base, cand, repeat=repeat)
    return t_base * 1e6, t_cand * 1e6, (t_cand - t_base) * 1e6


def main() -> int:
    torch.set_num_threads(1)
    layer = torch.nn.Linear(64, 64)
    x = torch.randn(8, 64)

    def bare() -> None:
        pass

    def step() -> None:
        with torch.no_grad():
            layer(x)

    off_mem = EpochMemoryMonitor(enabled=False)
    off_perf = EpochPerformanceMonitor(enabled=False)
    off_ops = PerformanceMonitor(enabled=False)

    def disabled_hooks() -> None:
        off_perf.on_batch_start(7)
        off_perf.on_batch_end(7, 0.5)
        off_mem.on_batch_end(7, 0.5)

    def disabled_track() -> None:
        with off_ops.track("op"):
            pass

    print(f"{'what':<58} {'us/call':>9} {'above bare':>11}")
    for name, fn, repeat in [("disabled: perf start+end + memory end (3 hook calls)", disabled_hooks, 20000),
                             ("disabled: PerformanceMonitor.track (context manager)", disabled_track, 20000)]:
        _, t, extra = _per_call_us(bare, fn, repeat)
        print(f"{name:<58} {t:9.3f} {extra:11.3f}")

    def step_with_disabled() -> None:
        step()
        disabled_hooks()

    t_step, t_both = interleaved(step, step_with_disabled, repeat=5000)
    print(f"{'tiny step (Linear 64x64, batch 8)':<58} {t_step * 1e6:9.3f}")
    print(result_line("monitor.disabled_hooks_on_tiny_step", t_both / t_step, 1.5))

    quiet_mem = EpochMemoryMonitor(verbose_batches=0)  # enabled, batch not printed, no writer
    quiet_perf = EpochPerformanceMonitor(verbose_batches=0)
    quiet_mem.on_epoch_start()
    quiet_perf.on_epoch_start()
    sink = io.StringIO()
    loud_mem = EpochMemoryMonitor(verbose_batches=10**9, file=sink)
    loud_perf = EpochPerformanceMonitor(verbose_batches=10**9, file=sink)
    loud_perf.on_epoch_start()

    def quiet() -> None:
        quiet_perf.on_batch_start(7)
        quiet_perf.on_batch_end(7, 0.5)
        quiet_mem.on_batch_end(7, 0.5)

    def loud() -> None:
        sink.seek(0)
        loud_perf.on_batch_start(1)
        loud_perf.on_batch_end(1, 0.5)
        loud_mem.on_batch_end(1, 0.5)

    with MemoryWriter(tempfile.mkdtemp(), enabled=False, custom_layout=False) as writer:
        logged = EpochPerformanceMonitor(verbose_batches=0, writer=writer)
        logged.on_epoch_start()

        def with_writer() -> None:
            logged.on_batch_start(7)
            logged.on_batch_end(7, 0.5)

        for name, fn, repeat in [("enabled, batch not printed, no writer", quiet, 5000),
                                 ("enabled, batch printed (readings + 2 lines)", loud, 1000),
                                 ("enabled perf monitor, not printed, with writer", with_writer, 1000)]:
            _, t, extra = _per_call_us(bare, fn, repeat)
            print(f"{name:<58} {t:9.3f} {extra:11.3f}")
        t_step, t_quiet = interleaved(step, lambda: (step(), quiet()), repeat=5000)
        print(result_line("monitor.enabled_quiet_hooks_on_tiny_step", t_quiet / t_step))
    return 0


if __name__ == "__main__":
    sys.exit(main())
