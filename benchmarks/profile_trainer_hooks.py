"""Where a monitored SyntheticTrainer step spends its monitoring time: each hook timed in place.

One trainer process with tbmem's defaults (as ``bench_trainer_overhead.py``'s ``defaults``
variant), every call tbmem's adapter makes per batch wrapped with ``perf_counter``: the hooks
run inside real training, with the caches a training step leaves them (they cost several times
what they cost in a loop without training). Not a ``bench_*`` script: it prints times, not a
ratio against a baseline, and ``make bench`` does not run it. The wrappers themselves add about
0.2 us per timed call.

    .venv/bin/python benchmarks/profile_trainer_hooks.py --epochs 4
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_trainer_overhead import VARIANTS, _NoBar, _trainer  # noqa: E402

__all__ = ["main"]


def _timed(times: dict[str, list[float]], name: str | Callable[..., str], fn: Callable[..., Any]) -> Callable[..., Any]:
    clock = time.perf_counter

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        key = name(*args, **kwargs) if callable(name) else name
        start = clock()
        try:
            return fn(*args, **kwargs)
        finally:
            times[key].append(clock() - start)

    return wrapper


def main(argv: list[str] | None = None) -> int:
    """Train, print a table of per-hook times; return 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4, help="epochs of 72 steps; the first is not counted")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--variant", default="defaults", choices=sorted(VARIANTS))
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    shm = Path("/dev/shm")
    with tempfile.TemporaryDirectory(dir=shm if shm.is_dir() and os.access(shm, os.W_OK) else None) as d:
        here = Path(__file__).resolve().parent / "bench_trainer_overhead.py"
        subprocess.run([sys.executable, str(here), "--prepare", d, "--batch-size", str(args.batch_size)],
                       check=True, stdout=subprocess.DEVNULL)
        trainer, mon = _trainer(VARIANTS[args.variant], Path(d), "run", args.batch_size, args.epochs,
                                args.device)
        steps = len(trainer._loader(trainer.train_set, shuffle=False))
        writer = mon.writer
        every = writer.config.every
        times: dict[str, list[float]] = defaultdict(list)
        step_of = [0]
        counted = [False]

        def nothing(i: int) -> None:
            """An empty hook, timed like the others: what the timing itself adds to each row."""

        empty = _timed(times, "(an empty hook, timed alike)", nothing)

        def batch_start(i: int) -> None:
            counted[0] = step_of[0] >= steps  # the first epoch warms up
            step_of[0] += 1
            empty(i)

        hook = _timed(times, "on_batch_start (+ the step's start)", mon.on_batch_start)
        mon.on_batch_start = lambda i, s=None: (batch_start(i), hook(i, s))[1]
        mon.before_backward = _timed(times, "before_backward (when mid_step_hooks)", mon.before_backward)
        mon.before_optimizer = _timed(times, "before_optimizer (when mid_step_hooks)", mon.before_optimizer)
        inside = [False]
        zero_grad = _timed(times, lambda s, loss: "log_memory, due" if s % every == 0 else "log_memory, not due",
                           mon.before_zero_grad)

        def before_zero_grad(s: int, loss: Any) -> None:
            inside[0] = True
            try:
                zero_grad(s, loss)
            finally:
                inside[0] = False

        mon.before_zero_grad = before_zero_grad
        mon.on_batch_end = _timed(times, "on_batch_end (all monitors)", mon.on_batch_end)
        from tbmem._internal._writer_components import ProbesComponent  # slotted: timed on its class, in this process

        ProbesComponent.read = _timed(times, "  due: probes read", ProbesComponent.read)  # type: ignore[method-assign]
        writer._write_record = _timed(times, "  due: the record written", writer._write_record)
        writer.flush = _timed(times, lambda: "  due: flush" if inside[0] else "flush, elsewhere", writer.flush)
        perf = mon.epoch_perf
        if perf is not None:
            perf.on_batch_end = _timed(
                times, lambda i, loss=None: ("  perf monitor, writes" if perf.global_step % perf.log_every == 0
                                             else "  perf monitor"), perf.on_batch_end)
        # only the timed epochs count: drop what the warm-up epoch added, per name, at its end
        marks: dict[str, int] = {}

        mon.on_epoch_start = _timed(times, "on_epoch_start", mon.on_epoch_start)
        timed_epoch_end = _timed(times, "on_epoch_end", mon.on_epoch_end)

        def epoch_end(real: Callable[[], None] = timed_epoch_end) -> None:
            real()
            if not marks:
                marks.update({k: len(v) for k, v in times.items()})

        mon.on_epoch_end = epoch_end
        from trainers.synthetic import SyntheticResult

        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            trainer._train_epochs(_NoBar(args.epochs), trainer._loader(trainer.train_set, shuffle=True),
                                  SyntheticResult())
        wall = time.perf_counter() - start
        mon.close()
    timed_steps = (args.epochs - 1) * steps
    print(f"{args.variant}: {args.epochs - 1} timed epochs of {steps} steps after one warm-up; "
          f"{wall / (args.epochs * steps) * 1e3:.2f} ms per step; load average {os.getloadavg()[0]:.2f}")
    print(f"{'hook':<34}{'calls':>7}{'median us':>11}{'us per step':>13}")
    total = 0.0
    for name, values in sorted(times.items(), key=lambda kv: kv[0].replace("  due", "log_memory, due ")
                                                    .replace("  perf", "on_batch_end (all monitors) ")):
        values = values[marks.get(name, 0):]
        if not values or name == "flush, elsewhere":
            continue
        per_step = sum(values) / timed_steps
        if not name.startswith(("  ", "(")):
            total += per_step
        print(f"{name:<34}{len(values):>7}{statistics.median(values) * 1e6:>11.1f}{per_step * 1e6:>13.1f}")
    print(f"{'all hooks':<34}{'':>7}{'':>11}{total * 1e6:>13.1f}")
    empty = statistics.median(times["(an empty hook, timed alike)"]) * 1e6
    rows = sum(len(v[marks.get(k, 0):]) for k, v in times.items() if not k.startswith(("  ", "("))) / timed_steps
    print(f"{'all hooks, less the timing':<34}{'':>7}{'':>11}{total * 1e6 - rows * empty:>13.1f}"
          f"  ({rows:.0f} timed calls per step x {empty:.1f} us)")
    if args.device == "cuda":
        _cuda_reads()
    return 0


def _cuda_reads() -> None:
    """What the CUDA reads a monitored step makes cost by themselves, in a loop (cheaper than in a step)."""
    import timeit

    import torch

    from tbmem._internal import _torch_private as tp

    dev = torch.cuda.current_device()
    for name, fn in (("torch.cuda.memory_stats (flattened in Python)", lambda: torch.cuda.memory_stats(dev)),
                     ("tp.cuda_memory_stats (FlatStats) + 3 keys", lambda: [
                         s := tp.cuda_memory_stats(dev), s["allocated_bytes.all.current"],
                         s["reserved_bytes.all.current"], s["allocated_bytes.all.peak"]]),
                     ("torch.cuda.memory_allocated", lambda: torch.cuda.memory_allocated(dev)),
                     ("torch.cuda.synchronize (nothing queued)", lambda: torch.cuda.synchronize(dev)),
                     ("tp.synchronize_if_pending", lambda: tp.synchronize_if_pending(dev)),
                     ("torch.cuda.mem_get_info", lambda: torch.cuda.mem_get_info(dev))):
        n = 2000
        print(f"{name:<48}{min(timeit.repeat(fn, number=n, repeat=3)) / n * 1e6:>8.1f} us")


if __name__ == "__main__":
    raise SystemExit(main())
