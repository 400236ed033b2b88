"""The memory forecast: accuracy at batch size 1024 from probes at 16, 32, 64, and what fitting costs.

Run: ``.venv/bin/python benchmarks/bench_forecast.py [--rounds 5] [--at 1024]``

Two training steps on the CPU, one thread:

* ``mlp``: a 4-layer MLP (256 -> 1024 -> 1024 -> 1024 -> 10), cross-entropy, Adam;
* ``unet``: the SyntheticTrainer itself on 1D Burgers (data ``burgers_1d``: 128 points, model
  ``unet_small``: 3 levels, 16 filters), its rollout loss over 4 steps, Adam, through
  ``trainers.autobatch.forecast_trainer`` (the ``batch_size=auto`` path).

Accuracy: ``fit`` on 16, 32, 64, then ``Forecast.measure(1024)``: one real step at 1024 measured the same
way (the census before it, the dispatch recorder during it). Also shown: the held-out check ``fit``
makes by itself (16, 32 -> 64), and an independent reading: the rise of the peak RSS (Linux VmHWM, reset
before) over an unrecorded step at 1024 in a fresh process whose allocator returns freed blocks to the
system, next to the forecast of what the step adds to the tensors alive before it (RSS also counts what
the step allocates outside tensors: a plausibility check, not the criterion).

Cost: the wall time of ``fit`` (warm-up, censuses, three recorded steps) over the time of 10 training steps
at 64, in alternating rounds; the ratio is the median, with its range across rounds.

RESULT lines: ``forecast.error_at_1024_<model>`` is ``1 + |predicted / measured - 1|`` (limit 1.05: within
5%); ``forecast.fit_vs_10_steps_at_64_<model>`` the cost ratio (limit 1.0).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks._common import result_line  # noqa: E402

__all__ = ["main"]

SIZES = (16, 32, 64)
_UNET_OVERRIDES = {"data": {"pde": "burgers", "dim": 1, "resolution": 128, "num_frames": 100, "num_sims": 8,
                            "progress": False},
                   "model": {"levels": 3, "filters": 16},
                   "trainer_params": {"train_sim": [0, 1, 2, 3, 4, 5], "val_sim": [6, 7], "batch_size": 16,
                                      "num_predict_steps": 4, "progress": False}}


def _mlp() -> tuple[Callable[[], Any], Callable[[Any], None], Callable[[int], Any]]:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                                torch.nn.ReLU(), torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 10))
    opt = torch.optim.Adam(model.parameters())

    def step(batch: Any) -> None:
        x, y = batch
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    def make(n: int) -> Any:
        return torch.randn(n, 256), torch.randint(0, 10, (n,))

    def forecast() -> Any:
        from tbmem.forecast import fit

        return fit(step, make, batch_sizes=SIZES, model=model, optimizer=opt)

    return forecast, step, make


def _unet(cache: str) -> tuple[Callable[[], Any], Callable[[Any], None], Callable[[int], Any]]:
    import copy

    from trainers.autobatch import batch_maker, forecast_trainer, training_step
    from trainers.config import validate
    from trainers.monitoring import TrainerMonitoring
    from trainers.synthetic import SyntheticTrainer

    values = copy.deepcopy(_UNET_OVERRIDES)
    values["data"]["cache_dir"] = cache
    cfg = validate({"experiment": "bench_forecast", **values})
    mon = TrainerMonitoring.create(tempfile.mkdtemp(prefix="run-", dir=cache), enabled=False, verbose_batches=0,
                                   tbmem_config=cfg.tbmem)
    trainer = SyntheticTrainer(cfg, monitoring=mon)
    return (lambda: forecast_trainer(trainer, SIZES)), training_step(trainer), batch_maker(trainer)


def _prepare(cache: str) -> None:
    """Generate the UNet's simulations (PhiFlow) so that the measuring process never imports PhiFlow."""
    from trainers.config import DataConfig
    from trainers.data import ensure_simulations

    ensure_simulations(DataConfig(**{**_UNET_OVERRIDES["data"], "cache_dir": cache}))


def _rss_check(name: str, cache: str, n: int) -> int | None:
    """Rise of the peak RSS over one step at ``n``, in a fresh process whose allocator returns every
    block of 64 KiB or more to the system when it is freed (glibc's adaptive threshold would otherwise
    keep the memory of earlier steps and hide the rise). None where VmHWM cannot be reset."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "65536"}
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--rss-check", name, cache, str(n)],
                         check=True, capture_output=True, text=True, env=env).stdout.split()
    return None if out[-1] == "None" else int(out[-1])


def _rss_child(name: str, cache: str, n: int) -> None:
    import torch

    from tbmem._internal.probes.host import read_peak_rss, reset_peak_rss

    torch.set_num_threads(1)
    _, step, make = _mlp() if name == "mlp" else _unet(cache)
    step(make(SIZES[0]))  # warm-up: optimizer state, as fit does
    batch = make(n)
    if not reset_peak_rss():
        print("None")
        return
    before = read_peak_rss() or 0
    step(batch)
    print((read_peak_rss() or 0) - before)


def _run(name: str, build: Callable[[], tuple], rounds: int, at: int, cache: str) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    forecast_fn, step, make = build()
    f = forecast_fn()
    m = f.measure(at)
    step_part = f.peak_bytes(at) - m.before_bytes
    rss = _rss_check(name, cache, at)
    fits, tens = [], []
    batch = make(SIZES[-1])
    for _ in range(rounds):
        start = time.perf_counter()
        forecast_fn()
        fits.append(time.perf_counter() - start)
        start = time.perf_counter()
        for _ in range(10):
            step(batch)
        tens.append(time.perf_counter() - start)
    ratios = [a / b for a, b in zip(fits, tens)]
    return {"name": name, "forecast": f, "measured": m, "step_part": step_part, "rss": rss,
            "fit_s": statistics.median(fits), "ten_s": statistics.median(tens),
            "ratio": statistics.median(ratios), "ratio_range": (min(ratios), max(ratios))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--at", type=int, default=1024)
    parser.add_argument("--prepare", metavar="CACHE", help=argparse.SUPPRESS)
    parser.add_argument("--rss-check", nargs=3, metavar=("MODEL", "CACHE", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.prepare:
        _prepare(args.prepare)
        return 0
    if args.rss_check:
        _rss_child(args.rss_check[0], args.rss_check[1], int(args.rss_check[2]))
        return 0
    mib = 2.0**20
    with tempfile.TemporaryDirectory(prefix="bench-forecast-data-") as cache:
        subprocess.run([sys.executable, os.path.abspath(__file__), "--prepare", cache], check=True)
        results = [_run("mlp", _mlp, args.rounds, args.at, cache),
                   _run("unet", lambda: _unet(cache), args.rounds, args.at, cache)]
    print(f"| model | fitted on | predicted at {args.at} MiB | measured MiB | error | held out (16, 32 -> 64) "
          f"| per sample KiB | step adds (forecast) MiB | peak RSS rise MiB | fit s | 10 steps at 64 s | fit / 10 steps |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        f, m = r["forecast"], r["measured"]
        q = f.quality
        rss = "n/a" if r["rss"] is None else f"{r['rss'] / mib:.1f}"
        lo, hi = r["ratio_range"]
        print(f"| {r['name']} | {', '.join(map(str, f.batch_sizes))} | {m.predicted_bytes / mib:.2f} | "
              f"{m.peak_bytes / mib:.2f} | {m.error:+.3%} | {q.holdout_error:+.3%} | {f.bytes_per_sample / 1024:.1f} "
              f"| {r['step_part'] / mib:.1f} | {rss} | {r['fit_s']:.3f} | {r['ten_s']:.3f} | {r['ratio']:.3f} "
              f"({lo:.3f}-{hi:.3f}) |")
    print()
    for r in results:
        print(result_line(f"forecast.error_at_{args.at}_{r['name']}", 1 + abs(r["measured"].error), 1.05))
        print(result_line(f"forecast.fit_vs_10_steps_at_64_{r['name']}", r["ratio"], 1.0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
