"""Overhead of tbmem monitoring on SyntheticTrainer epochs: each variant against itself, epoch by epoch.

Variants: monitoring off, twice ("off" and "off_again", an A/A control whose distance from 1
is the run's noise); on with tbmem's defaults (every=10, census_every=500, console monitors
printing the first 5 batches); on with a census every 50 steps.

Each variant trains in its own process, so each has exactly the heap, threads and gc of a
real single run (the census's cost depends on them). Within that process, timed epochs
alternate between the variant's monitoring and none (off, on, on, off, ...: ABBA, so a
linear drift cancels), with the step count running on. Two identical processes differ in
speed by about 1% here (where the model's tensors fall in memory and caches), more than the
overhead measured: a process compared with itself carries none of that.

The processes take turns of 8 training steps (``--turn-steps``; every epoch's first batch
starts a turn), in an order rotated every round, with their training threads on one core: only
one runs at any moment, and epoch e of every process runs in the same seconds. (Turns of one
step made every step start in caches another process had just filled, which a real run never
meets: steps took 10% longer and the hooks, which run cold in any case, about 50% longer.)
So the ratio is a variant's monitored epochs over its unmonitored
ones, divided by the same quotient of "off" (whose halves differ only by when they ran): what
the machine did in those seconds (a neighbour's load, a slower minute) it did to both, and
the division leaves it out. The comparison is repeated in ``--sessions`` fresh sets of
processes; the 90% interval comes from resampling sessions, then epoch pairs within them.

Full (generation 2) garbage collections are timed apart and left out of both halves. A process
makes about three, each a pause of ~0.2 s against an epoch of ~1.1 s: so far all of them came
before the timed epochs (imports, set-up, warm-up), but one inside would land in one half by
chance and move that session's ratio by several percent. Leaving the same pauses out of both
halves can only raise the ratio; the table shows how many landed in each half (monitoring that
caused more would show there) and the ratios with them in.

    .venv/bin/python benchmarks/bench_trainer_overhead.py --sessions 6 --epochs 8 --turn-steps 8 --batch-size 4
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
#: The per-epoch hooks swapped between a variant's monitoring and none, at each epoch's start.
_HOOKS = ("on_batch_start", "before_backward", "before_optimizer", "before_zero_grad", "on_batch_end",
          "on_epoch_end", "on_step_error")


def monitored(epoch: int) -> bool:
    """Whether timed epoch ``epoch`` (0 = the first after the warm-up) runs with monitoring:
    off, on, on, off, off, on, on, off, ... With 8 epochs of 72 steps after one warm-up epoch,
    step 500 (tbmem's default census interval) falls in an "on" epoch."""
    return epoch % 4 in (1, 2)


_LIMITS = {"defaults": 1.005, "census_50": 1.01}  # issue 18: +0.5% and +1%


def _trainer(overrides: list[str], tmp: Path, run: str, batch_size: int, epochs: int, device: str = "cpu"):
    import torch
    from hydra import compose, initialize_config_dir

    from trainers.config import validate
    from trainers.monitoring import TrainerMonitoring
    from trainers.synthetic import SyntheticTrainer

    conf = Path(__file__).resolve().parents[1] / "conf"
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = validate(compose(config_name="burgers_quick_test", overrides=[
            f"data.cache_dir={tmp / 'cache'}", "data.progress=false", "trainer_params.progress=false",
            f"trainer_params.epochs={epochs}", f"trainer_params.batch_size={batch_size}", *overrides]))
    dev = torch.device("cuda", 0) if device == "cuda" else torch.device("cpu")
    if dev.type == "cuda":
        torch.zeros(1, device=dev)  # the program initialises CUDA before the writer opens, as run.py's does
    mon = TrainerMonitoring.create(tmp / run, enabled=cfg.trainer_params.enable_memory_monitoring,
                                   verbose_batches=cfg.trainer_params.memory_monitor_batches,
                                   tbmem_config=cfg.tbmem, device=dev)
    return SyntheticTrainer(cfg, monitoring=mon, device=dev), mon


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
    import tbmem._internal.census

    scans: list[str] = []
    durations: list[float] = []
    real = tbmem._internal.census.take_census

    def counting(*args: Any, **kwargs: Any) -> Any:
        census = real(*args, **kwargs)
        scans.append(census.heap_scan)
        durations.append(census.duration_s)
        return census

    tbmem._internal.census.take_census = counting
    return scans, durations


def _time_full_collections() -> list[float]:
    """A one-element list that sums the seconds of full (generation 2) collections as they end
    (they land on random steps)."""
    import gc

    full = [0.0]
    started = [0.0]

    def on_collection(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        elif info["generation"] == 2:
            full[0] += time.perf_counter() - started[0]

    gc.callbacks.append(on_collection)
    return full


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


def _worker(name: str, tmp: str, run: str, batch_size: int, epochs: int, threads: int, turn_steps: int,
            device: str, go: Any, done: Any, results: Any) -> None:
    """One variant's process: build its trainer, then run ``turn_steps`` steps per turn.

    A slice runs from being given the turn to the start of the batch that ends it (through the
    ``on_batch_start`` hook; a turn ends at every epoch's start too): its steps, plus any
    epoch-level work that follows them (validation, checkpoint, the monitors' epoch summary).
    Slice 0 ends at the first batch.
    Epoch 0 warms up with monitoring on; after it, each epoch starts by setting the hooks of
    the variant's monitoring, or those of a monitoring that is off (:func:`monitored`).
    """
    slices: list[float] = []
    full_in_slice: list[float] = []  # the seconds of full collections within each slice
    try:
        import gc

        import torch

        from trainers.monitoring import TrainerMonitoring
        from trainers.synthetic import SyntheticResult

        torch.set_num_threads(threads)
        padding = _shift_layout(run)  # noqa: F841 - kept alive for the whole run
        scans, durations = _count_censuses()
        full = _time_full_collections()
        trainer, mon = _trainer(VARIANTS[name], Path(tmp), run, batch_size, epochs, device)
        # What the trainer calls in an "off" epoch: the hooks of monitoring that is off, as the
        # "off" variant's own (the same writer, for the losses it writes either way).
        off = TrainerMonitoring(mon.writer, enabled=False, verbose_batches=0, device=mon.device)
        steps = len(trainer._loader(trainer.train_set, shuffle=False))
        if hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) > 1:
            # Every variant's training thread on the same core (one runs at a time): the cores of a
            # shared VM differ in speed. Threads started earlier (TensorBoard's writer) stay free to
            # run on any core, as they would in a real run.
            os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
        start = [0.0]
        epoch = [-1]
        batch_start = [mon.on_batch_start]

        def take_turn() -> None:
            slices.append(time.perf_counter() - start[0])
            full_in_slice.append(full[0])
            full[0] = 0.0
            done.release()
            go.acquire()
            start[0] = time.perf_counter()

        def epoch_start(real: Any = mon.on_epoch_start, quiet: Any = off.on_epoch_start) -> None:
            epoch[0] += 1
            on = epoch[0] == 0 or monitored(epoch[0] - 1)
            for hook in _HOOKS:  # instance attributes: what the trainer's attribute lookups find
                mon.__dict__.pop(hook, None) if on else setattr(mon, hook, getattr(off, hook))
            mon.mid_step_hooks = on and mon._record_before_backward
            batch_start[0] = mon.on_batch_start
            mon.on_batch_start = lambda i, step=None: (i % turn_steps or take_turn(), batch_start[0](i, step))[1]
            (real if on else quiet)()

        mon.on_epoch_start = epoch_start
        done.release()  # ready
        go.acquire()
        start[0] = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            trainer._train_epochs(_NoBar(epochs), trainer._loader(trainer.train_set, shuffle=True),
                                  SyntheticResult())
        slices.append(time.perf_counter() - start[0])
        full_in_slice.append(full[0])
        mon.close()
        results.put((name, "ok", {"slices": slices, "full": full_in_slice, "steps": steps, "scans": scans,
                                  "durations": durations, "objects": len(gc.get_objects())}))
    except BaseException:  # noqa: BLE001 - reported to the scheduler, which must not wait forever
        results.put((name, "error", traceback.format_exc()))
    finally:
        results.close()
        results.join_thread()  # the report is in the pipe before the scheduler is told to look
        done.release()
        # Exit only when every variant is done: an exiting interpreter would slow the step running now.
        go.acquire(timeout=_TURN_TIMEOUT_S)


def _interval(sessions: list[dict[str, list[tuple[float, float]]]], name: str,
              rng: random.Random) -> tuple[float, float]:
    """90% bootstrap interval of :func:`_ratio` for ``name``: resample sessions, then the (on, off)
    epoch pairs within each (the same pairs for ``name`` and "off": they ran at the same time)."""
    ratios = []
    for _ in range(2000):
        sums = [0.0, 0.0, 0.0, 0.0]
        for _ in sessions:
            session = sessions[rng.randrange(len(sessions))]
            mine, base = session[name], session["off"]
            for i in (rng.randrange(len(mine)) for _ in mine):
                sums[0] += mine[i][0]
                sums[1] += mine[i][1]
                sums[2] += base[i][0]
                sums[3] += base[i][1]
        ratios.append(sums[0] / sums[1] / (sums[2] / sums[3]))
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
                                               args.threads, args.turn_steps, args.device, go[name], done, results),
                           daemon=True)
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
                             "comparison is repeated with new processes")
    parser.add_argument("--epochs", type=int, default=8,
                        help="timed epochs per variant and session, a multiple of 4 (off, on, on, off): 8 x 72 "
                             "steps = 576 steps, half of them monitored, step 500 among those")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--turn-steps", type=int, default=8,
                        help="steps a process runs per turn (each epoch's first batch starts a turn too): a step "
                             "right after another process's turn starts with caches that process left, which a "
                             "real run meets only at its turn's first step")
    parser.add_argument("--prepare", metavar="DIR", help=argparse.SUPPRESS)
    parser.add_argument("--batch-size", type=int, default=4,
                        help="batch 4 gives 72 steps of about 16 ms per epoch: small steps make the "
                             "per-step overhead a large share of a step")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where the model trains (cuda: device 0; every variant's process has its own context)")
    args = parser.parse_args(argv)
    if args.prepare:  # child process: generate the simulation cache, then exit
        _trainer(VARIANTS["off"], Path(args.prepare), "prepare", args.batch_size, 1)[1].close()
        return 0
    if args.turn_steps <= 0:
        parser.error(f"--turn-steps must be positive, got {args.turn_steps}")
    if args.epochs <= 0 or args.epochs % 4:
        parser.error(f"--epochs must be a positive multiple of 4 (off, on, on, off), got {args.epochs}")
    epochs = args.epochs + 1  # the first epoch warms up and is not counted
    ctx = mp.get_context("spawn")
    names = list(VARIANTS)
    # per session and variant: (on epoch, off epoch) pairs of summed step times
    sessions: list[dict[str, list[tuple[float, float]]]] = []
    scans: list[str] = []
    durations: list[float] = []
    sessions_all: list[dict[str, list[tuple[float, float]]]] = []  # the same with full collections in
    # per variant and half: (full collections, their seconds) per timed epoch
    full: dict[str, dict[str, list[tuple[int, float]]]] = {name: {"on": [], "off": []} for name in names}
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
            session, session_all = {}, {}
            for name, rep in reports.items():
                # Slice 0 runs up to the first batch, slice k ends at the start of batch k: drop the
                # warm-up epoch, then sum each epoch's slices into one block; its full collections
                # apart (see the module's docstring).
                timed = range(1, epochs)
                turns = -(-steps // args.turn_steps)  # turns per epoch
                raw = [sum(_epoch(rep["slices"], turns, e)) for e in timed]
                gc2 = [sum(_epoch(rep["full"], turns, e)) for e in timed]
                pauses = [sum(1 for x in _epoch(rep["full"], turns, e) if x) for e in timed]
                for i, (seconds, count) in enumerate(zip(gc2, pauses)):
                    full[name]["on" if monitored(i) else "off"].append((count, seconds))
                clean = [r - g for r, g in zip(raw, gc2)]
                session[name] = _pairs(clean)
                session_all[name] = _pairs(raw)
            sessions.append(session)
            sessions_all.append(session_all)
            scans += reports["census_50"]["scans"]
            durations += reports["census_50"]["durations"]
            objects = reports["census_50"]["objects"]
            print(f"session {k + 1}/{args.sessions}: " + ", ".join(
                f"{name} {_ratio([session])[name]:.4f}" for name in names[1:])
                + f" (the halves of 'off': {_halves([session])['off']:.4f})", flush=True)
    ratios = _ratio(sessions)
    print(f"SyntheticTrainer on {args.device}, burgers_quick_test, batch {args.batch_size}: {args.sessions} sessions of "
          f"{args.epochs} epochs ({args.epochs * steps} steps) per variant after one warm-up epoch, half of them "
          f"monitored (off, on, on, off); one process per variant, turns of {args.turn_steps} steps; "
          f"{args.threads} thread(s)")
    print(f"census_50 processes: {objects:,} gc-tracked objects; {len(scans)} censuses, "
          f"{scans.count('incremental')} of them incremental; census median "
          f"{statistics.median(durations) * 1e3:.1f} ms, max {max(durations) * 1e3:.1f} ms")
    print("full (generation 2) garbage collections in the timed epochs, monitored / unmonitored half: " + ", ".join(
        f"{name} {sum(c for c, _ in h['on'])} ({sum(t for _, t in h['on']) * 1e3:.0f} ms) / "
        f"{sum(c for c, _ in h['off'])} ({sum(t for _, t in h['off']) * 1e3:.0f} ms)" for name, h in full.items()))
    with_pauses = _ratio(sessions_all)
    print("Their time is left out of the ratios (a pause lands in one half by chance). With them in: "
          + ", ".join(f"{name} {with_pauses[name]:.4f}" for name in names[1:]))
    print(f"{'variant':<12}{'on ms/step':>12}{'off ms/step':>13}{'on/off':>9}{'ratio':>9}{'90% interval':>18}")
    rng = random.Random(0)
    n = args.sessions * args.epochs // 2 * steps
    halves = _halves(sessions)
    for name in names:
        on = sum(p[0] for s in sessions for p in s[name])
        off = sum(p[1] for s in sessions for p in s[name])
        lo, hi = _interval(sessions, name, rng) if name != "off" else (1.0, 1.0)
        print(f"{name:<12}{on / n * 1e3:>12.2f}{off / n * 1e3:>13.2f}{halves[name]:>9.4f}{ratios[name]:>9.4f}"
              f"{f'{lo:.4f}-{hi:.4f}':>18}")
    print("on/off: a process's monitored epochs over its unmonitored ones; ratio: that over the same for 'off'. "
          "'off_again' is 'off' once more (an A/A control): its distance from 1 is this run's noise.")
    for name, limit in _LIMITS.items():
        print(f"RESULT name=trainer.epoch_{name}_vs_off ratio={ratios[name]:.4f} limit={limit}")
    return 0


def _epoch(per_slice: list[float], turns: int, epoch: int) -> list[float]:
    """The values of one epoch's slices, ``turns`` per epoch (slice 0 runs up to the first batch)."""
    return per_slice[1 + turns * epoch: 1 + turns * (epoch + 1)]


def _pairs(blocks: list[float]) -> list[tuple[float, float]]:
    """(monitored epoch, unmonitored epoch) pairs, each with its neighbour: (1, 0), (2, 3), (5, 4), ..."""
    on = [b for e, b in enumerate(blocks) if monitored(e)]
    off = [b for e, b in enumerate(blocks) if not monitored(e)]
    return list(zip(on, off))


def _halves(sessions: list[dict[str, list[tuple[float, float]]]]) -> dict[str, float]:
    """Per variant: its monitored epochs' summed time over its unmonitored epochs' (for "off" and
    "off_again", whose epochs are all unmonitored: the two halves of the same schedule)."""
    return {name: sum(p[0] for s in sessions for p in s[name]) / sum(p[1] for s in sessions for p in s[name])
            for name in sessions[0]}


def _ratio(sessions: list[dict[str, list[tuple[float, float]]]]) -> dict[str, float]:
    """Per variant: :func:`_halves` over "off"'s. The processes take short turns, so a
    variant's epochs and "off"'s ran in the same seconds: what the machine did to one half (a
    neighbour's load, a slower minute) it did to both, and the quotient leaves it out."""
    halves = _halves(sessions)
    return {name: value / halves["off"] for name, value in halves.items()}


if __name__ == "__main__":
    raise SystemExit(main())
