"""Overhead of tbmem monitoring on SyntheticTrainer epochs (A/B interleaved, same process).

Variants: monitoring off; on with tbmem's defaults (every=10, census_every=500,
console monitors printing the first 5 batches); on with a census every 50 steps.
Each round times a run of ``--epochs`` epochs of each variant in rotated order; the
report gives the median time per epoch and the median over rounds of each round's ratio to "off".
A run spans the default census interval, so each variant pays for every census it
schedules (a single 72-step epoch would either contain the step-0 census or none).

    .venv/bin/python benchmarks/bench_trainer_overhead.py --rounds 6 --epochs 7 --batch-size 4
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

__all__ = ["main"]

# burgers_quick_test sets short demo intervals (and snapshots); reset them to tbmem's defaults.
_DEFAULTS = ["tbmem.every=10", "tbmem.census_every=500", "~tbmem.snapshot"]
VARIANTS = {
    "off": ["trainer_params.enable_memory_monitoring=false"],
    "defaults": ["trainer_params.enable_memory_monitoring=true", *_DEFAULTS],
    "census_50": ["trainer_params.enable_memory_monitoring=true", *_DEFAULTS[:1], "tbmem.census_every=50",
                  *_DEFAULTS[2:]],
}
_LIMITS = {"defaults": 1.01, "census_50": 1.03}


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


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print a table; return 0."""
    import torch

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--epochs", type=int, default=7,
                        help="epochs per timed run: 7 x 72 steps spans the default census interval (500), so "
                             "each variant pays for every census it schedules, as a real run does")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prepare", metavar="DIR", help=argparse.SUPPRESS)
    parser.add_argument("--batch-size", type=int, default=4,
                        help="batch 4 gives 72 steps per epoch, so 7 epochs span the default census interval; "
                             "small batches also make the per-step overhead a larger share of a step")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.prepare:  # child process: generate the simulation cache, then exit
        _trainer(VARIANTS["off"], Path(args.prepare), "prepare", args.batch_size, 1)[1].close()
        return 0
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    steps = 0
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        # The PhiFlow data is generated in a child process, as a first run or `make demo` leaves it:
        # a training run with a warm cache never imports PhiFlow, whose ~170k objects would double
        # the heap that every census scans.
        subprocess.run([sys.executable, __file__, "--prepare", str(tmp), "--batch-size", str(args.batch_size)],
                       check=True, stdout=subprocess.DEVNULL)
        names = list(VARIANTS)
        for r in range(args.rounds + 1):  # round 0 warms up (data cache, allocator, first imports)
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                trainer, mon = _trainer(VARIANTS[name], tmp, f"{name}_{r}", args.batch_size,
                                        1 if r == 0 else args.epochs)
                gc.collect()  # the previous run's garbage must not be collected inside this timing
                with contextlib.redirect_stdout(io.StringIO()):
                    start = time.perf_counter()
                    result = trainer.train()
                    elapsed = time.perf_counter() - start
                mon.close()
                steps = result.steps
                if r > 0:
                    times[name].append(elapsed / args.epochs)
    # Paired ratios: each round times every variant back to back, so drifts of a shared machine
    # (other processes, CPU frequency) cancel within a round; the median over rounds drops outliers.
    ratios = {name: statistics.median(v / o for v, o in zip(times[name], times["off"])) for name in times}
    print(f"SyntheticTrainer, burgers_quick_test: runs of {args.epochs} epochs ({steps} steps of batch "
          f"{args.batch_size}), {args.rounds} interleaved rounds, {args.threads} thread(s); times per epoch")
    print(f"gc-tracked objects in this process: {len(gc.get_objects()):,} (a census scans them all)")
    print(f"{'variant':<12}{'median (s)':>12}{'min (s)':>10}{'paired ratio':>14}")
    for name, values in times.items():
        print(f"{name:<12}{statistics.median(values):>12.3f}{min(values):>10.3f}{ratios[name]:>14.3f}")
    for name, limit in _LIMITS.items():
        print(f"RESULT name=trainer.epoch_{name}_vs_off ratio={ratios[name]:.4f} limit={limit}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
