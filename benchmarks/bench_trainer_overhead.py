"""Overhead of tbmem monitoring on SyntheticTrainer epochs: one process per variant, taking turns step by step.

Variants: monitoring off; "off" once more (an A/A control whose distance from 1 is
the run's noise); on with tbmem's defaults (every=10, census_every=500, console
monitors printing the first 5 batches); on with a census every 50 steps.

Each variant trains in its own process, so each has exactly the heap, threads and
gc of a real single run (the census's cost depends on them). The processes take
turns one training step at a time, in an order rotated every round, with their
training threads on one core: only one runs at any moment, and a drift of this
shared VM's speed (several percent over minutes) hits all variants within a tenth
of a second of each other. Each trainer keeps its own step count, so every variant
pays for every record and census it schedules, as a real run does. A process's
speed also depends on its heap layout (about 1% here), so each process starts with
allocations of random sizes, and the comparison is repeated in ``--sessions``
fresh sets of processes. The ratio is the sum of a variant's step times over the
sum of "off"'s after a warm-up epoch; the 90% interval comes from resampling
sessions, then epochs within them.

    .venv/bin/python benchmarks/bench_trainer_overhead.py --sessions 6 --epochs 7 --batch-size 4
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import multiprocessing as mp
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

__all__ = ["main"]

# burgers_quick_test sets short demo intervals (and snapshots); reset them to tbmem's defaults.
_DEFAULTS = ["tbmem.every=10", "tbmem.census_every=500", "~tbmem.snapshot"]
VARIANTS = {
    "off": ["trainer_params.enable_memory_monitoring=false"],
    "off_again": ["trainer_params.enable_memory_monitoring=false"],
    "defaults": ["trainer_params.enable_memory_monitoring=true", *_DEFAULTS],
    "census_50": ["trainer_params.enable_memory_monitoring=true", *_DEFAULTS[:1], "tbmem.census_every=50",
                  *_DEFAULTS[2:]],
}
_LIMITS = {"defaults": 1.005, "census_50": 1.01}  # issue 18: +0.5% and +1%


def _trainer(overrides: list[str], tmp: Path, run: str, batch_size: int, epochs: int):
    from hydra import compose, initialize_config_dir

    from trainers.config import validate
    from trainers.monitoring import TrainerMonitoring
    from trainers.synthetic import SyntheticTrainer

    conf = Path(__file__).resolve().parents[1] / "conf"
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = validate(compose(config_name="burgers_quick_test", overrides=[
            f"data.cache_dir={tmp / 'cache'}", "data.progress=false", "trainer_params.progress=false",
            f"trainer_params.epochs={epochs}", f"trainer_params.batch_size={batch_size}", *overrides]))
    mon = TrainerMonitoring.create(tmp / run, enabled=cfg.trainer_params.enable_memory_monitoring,
                                   verbose_batches=cfg.trainer_params.memory_monitor_batches,
                                   tbmem_config=cfg.tbmem)
    return SyntheticTrainer(cfg, monitoring=mon), mon


class _NoBar:
    """Progress-bar stand-in for ``SyntheticTrainer._train_epochs`` (the calls it makes on a tqdm bar)."""

    def __init__(self, epochs: int) -> None:
        self.epochs = epochs

    def set_description(self, *args: Any, **kwargs: Any) -> None:
        """No-op."""

    def set_postfix_str(self, *args: Any, **kwargs: Any) -> None:
        """No-op."""

    def update(self, *args: Any, **kwargs: Any) -> None:
        """No-op."""

    def close(self) -> None:
        """No-op."""


def _count_censuses() -> tuple[list[str], list[float]]:
    """Record how each census scanned the heap and how long it took (the writer imports it per call)."""
    import tbmem.census

    scans: list[str] = []
    durations: list[float] = []
    real = tbmem.census.take_census

    def counting(*args: Any, **kwargs: Any) -> Any:
        census = real(*args, **kwargs)
        scans.append(census.heap_scan)
        durations.append(census.duration_s)
        return census

    tbmem.census.take_census = counting
    return scans, durations


def _time_collections() -> dict[int, list[float]]:
    """Generation -> durations of the garbage collections from now on (they land on random steps)."""
    import gc

    times: dict[int, list[float]] = {0: [], 1: [], 2: []}
    started = [0.0]

    def on_collection(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            times[info["generation"]].append(time.perf_counter() - started[0])

    gc.callbacks.append(on_collection)
    return times


def _shift_layout(seed: str) -> list[Any]:
    """Allocations of random sizes, kept alive, so that what the trainer allocates next lands elsewhere.

    Identical programs get identical heap layouts, and a layout alone changes a step's speed by
    about 1% here (where the model's tensors fall relative to cache lines and pages): without
    this, two variants that allocate differently would differ by their layouts as much as by
    their work, the same way in every session.
    """
    import torch

    rng = random.Random(seed)
    return [torch.empty(rng.randrange(1, 1 << 16), dtype=torch.uint8), bytearray(rng.randrange(1, 1 << 20)),
            [object() for _ in range(rng.randrange(1, 5000))]]


def _worker(name: str, tmp: str, run: str, batch_size: int, epochs: int, threads: int, go: Any, done: Any,
            results: Any) -> None:
    """One variant's process: build its trainer, then run one step per turn.

    A slice runs from being given the turn to the start of the next batch (through the
    ``on_batch_start`` hook): one step, plus any epoch-level work that follows it
    (validation, checkpoint, the monitors' epoch summary). Slice 0 ends at the first batch.
    """
    slices: list[float] = []
    try:
        import gc


        import torch

        from trainers.synthetic import SyntheticResult

        torch.set_num_threads(threads)
        padding = _shift_layout(run)  # noqa: F841 - kept alive for the whole run
        scans, durations = _count_censuses()
        collections = _time_collections()
        trainer, mon = _trainer(VARIANTS[name], Path(tmp), run, batch_size, epochs)
        steps = len(trainer._loader(trainer.train_set, shuffle=False))
        if hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) > 1:
            # Every variant's training thread on the same core (one runs at a time): the cores of a
            # shared VM differ in speed. Threads started earlier (TensorBoard's writer) stay free to
            # run on any core, as they would in a real run.
            os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
        start = [0.0]

        def take_turn() -> None:
            slices.append(time.perf_counter() - start[0])
            done.release()
            go.acquire()
            start[0] = time.perf_counter()

        hook = mon.on_batch_start
        mon.on_batch_start = lambda i: (take_turn(), hook(i))[1]
        done.release()  # ready
        go.acquire()
        start[0] = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            trainer._train_epochs(_NoBar(epochs), trainer._loader(trainer.train_set, shuffle=True),
                                  SyntheticResult())
        slices.append(time.perf_counter() - start[0])
        mon.close()
        results.put((name, "ok", {"slices": slices, "steps": steps, "scans": scans, "durations": durations,
                                  "objects": len(gc.get_objects()), "gc": collections}))
    except BaseException:  # noqa: BLE001 - reported to the scheduler, which must not wait forever
        results.put((name, "error", traceback.format_exc()))
    finally:
        results.close()
        results.join_thread()  # the report is in the pipe before the scheduler is told to look
        done.release()
        # Exit only when every variant is done: an exiting interpreter would slow the step running now.
        go.acquire(timeout=_TURN_TIMEOUT_S)


def _interval(sessions: list[dict[str, list[float]]], name: str, rng: random.Random) -> tuple[float, float]:
    """90% bootstrap interval of sum(name) / sum(off): resample sessions, then epochs within each.

    Resampling sessions carries the speed differences between processes (memory layout) that
    no amount of epochs within one session averages out.
    """
    ratios = []
    for _ in range(2000):
        num = den = 0.0
        for _ in sessions:
            blocks = sessions[rng.randrange(len(sessions))]
            n = len(blocks["off"])
            for i in (rng.randrange(n) for _ in range(n)):
                num += blocks[name][i]
                den += blocks["off"][i]
        ratios.append(num / den)
    ratios.sort()
    return ratios[len(ratios) // 20], ratios[-len(ratios) // 20 - 1]


_TURN_TIMEOUT_S = 600.0


def _wait(done: Any, results: Any, reports: dict[str, dict[str, Any]]) -> None:
    """Wait for the running process to hand back its turn; collect any report it sent."""
    if not done.acquire(timeout=_TURN_TIMEOUT_S):
        raise RuntimeError(f"a variant's process did not hand back its turn within {_TURN_TIMEOUT_S:.0f} s")
    while not results.empty():
        who, status, payload = results.get()
        if status != "ok":
            raise RuntimeError(f"variant {who} failed:\n{payload}")
        reports[who] = payload


def _schedule(names: list[str], go: dict[str, Any], done: Any, results: Any) -> dict[str, dict[str, Any]]:
    """Wait until every process is ready, then give turns in rotated order until all have reported."""
    reports: dict[str, dict[str, Any]] = {}
    for _ in names:
        _wait(done, results, reports)
    for r in itertools.count():
        live = [n for n in names[r % len(names):] + names[:r % len(names)] if n not in reports]
        if not live:
            break
        for name in live:
            go[name].release()
            _wait(done, results, reports)
    return reports


def _session(ctx: Any, names: list[str], directory: str, session: int, args: argparse.Namespace,
             epochs: int) -> dict[str, dict[str, Any]]:
    """One process per variant, all started afresh; their reports once all have trained."""
    go = {name: ctx.Semaphore(0) for name in names}
    done, results = ctx.Semaphore(0), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(name, directory, f"session{session}/{name}", args.batch_size, epochs,
                                               args.threads, go[name], done, results), daemon=True)
             for name in names]
    for p in procs:
        p.start()
    try:
        return _schedule(names, go, done, results)
    finally:
        for name in names:
            go[name].release()
        for p in procs:
            p.join(timeout=60)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print a table; return 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=6,
                        help="fresh sets of processes: a process's speed depends on its memory layout, so the "
                             "A/B comparison is repeated with new processes")
    parser.add_argument("--epochs", type=int, default=7,
                        help="timed epochs per variant and session: 7 x 72 steps = 504 steps, one default "
                             "census interval (500) and ten of 50")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prepare", metavar="DIR", help=argparse.SUPPRESS)
    parser.add_argument("--batch-size", type=int, default=4,
                        help="batch 4 gives 72 steps of about 25 ms per epoch: small steps make the "
                             "per-step overhead a large share of a step")
    args = parser.parse_args(argv)
    if args.prepare:  # child process: generate the simulation cache, then exit
        _trainer(VARIANTS["off"], Path(args.prepare), "prepare", args.batch_size, 1)[1].close()
        return 0
    epochs = args.epochs + 1  # the first epoch warms up and is not counted
    ctx = mp.get_context("spawn")
    names = list(VARIANTS)
    sessions: list[dict[str, list[float]]] = []
    scans: list[str] = []
    durations: list[float] = []
    # Checkpoints and event files go to memory where there is a tmpfs: a shared disk's write-back
    # stalls land on random steps of random variants and are not what this measures.
    shm = Path("/dev/shm")
    with tempfile.TemporaryDirectory(dir=shm if shm.is_dir() and os.access(shm, os.W_OK) else None) as d:
        # The PhiFlow data is generated in a child process, as a first run or `make demo` leaves it:
        # a training run with a warm cache never imports PhiFlow, whose ~170k objects would double
        # the heap that every full census scans.
        subprocess.run([sys.executable, __file__, "--prepare", d, "--batch-size", str(args.batch_size)],
                       check=True, stdout=subprocess.DEVNULL)
        for k in range(args.sessions):
            reports = _session(ctx, names, d, k, args, epochs)
            steps = reports["off"]["steps"]
            # Slice 0 runs up to the first batch, slice k ends at the start of batch k: drop the
            # warm-up epoch, then sum each epoch's slices into one block for the bootstrap.
            sessions.append({name: [sum(rep["slices"][1 + steps * e: 1 + steps * (e + 1)]) for e in range(1, epochs)]
                             for name, rep in reports.items()})
            scans += reports["census_50"]["scans"]
            durations += reports["census_50"]["durations"]
            objects = reports["census_50"]["objects"]
            print(f"session {k + 1}/{args.sessions}: " + ", ".join(
                f"{name} {sum(sessions[-1][name]) / sum(sessions[-1]['off']):.4f}" for name in names[1:]),
                flush=True)
    total = {name: sum(sum(s[name]) for s in sessions) for name in names}
    print(f"SyntheticTrainer, burgers_quick_test, batch {args.batch_size}: {args.sessions} sessions of "
          f"{args.epochs} epochs ({args.epochs * steps} steps) per variant after one warm-up epoch; one process "
          f"per variant, turns step by step; {args.threads} thread(s)")
    print(f"census_50 processes: {objects:,} gc-tracked objects; {len(scans)} censuses, "
          f"{scans.count('incremental')} of them incremental; census median "
          f"{statistics.median(durations) * 1e3:.1f} ms, max {max(durations) * 1e3:.1f} ms")
    print(f"{'variant':<12}{'ms/step':>9}{'ratio':>9}{'90% interval':>18}")
    ratios, rng = {}, random.Random(0)
    for name in names:
        ratios[name] = total[name] / total["off"]
        lo, hi = _interval(sessions, name, rng)
        print(f"{name:<12}{total[name] / (args.sessions * args.epochs * steps) * 1e3:>9.2f}{ratios[name]:>9.4f}"
              f"{f'{lo:.4f}-{hi:.4f}':>18}")
    print("off_again is 'off' once more: its distance from 1 is this run's noise.")
    for name, limit in _LIMITS.items():
        print(f"RESULT name=trainer.epoch_{name}_vs_off ratio={ratios[name]:.4f} limit={limit}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
