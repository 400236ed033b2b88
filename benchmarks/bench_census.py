"""Census cost vs pytorch_memlab's MemReporter: fresh processes, calls interleaved, and how stable the ratio is.

Run: ``.venv/bin/python benchmarks/bench_census.py [--rounds 5] [--repeats 11] [--quick]``.
The acceptance bar is a full census <= 0.15 of ``MemReporter(model).report()`` on the same
heap (issue 26; 1/3 in issues 3 and 12). Without pytorch_memlab installed, a
faithful copy of its scan loop (``gc.get_objects()`` + ``isinstance(obj, torch.Tensor)`` +
per-tensor storage stats) stands in, and the output says so.

Each round is a fresh process: it imports what a PhiFlow trainer imports (torch,
tensorboard, phiflow), makes allocations of random sizes (so that rounds differ in heap
layout, as separate runs do), builds a model with Adam state and 200 loose tensors, and
times MemReporter and the census variants in turn, call by call, on the base heap and
then with 100k and 1M extra gc-tracked objects. A round's ratio is the median census time
over the median MemReporter time; the reported ratio is the median over rounds, with a 90%
bootstrap interval that resamples rounds, then calls within each.

Columns: heap objects, tensors, memlab ms, census ms (full heap scans, each numpy_scan
mode), census ms right after another census (the incremental scan, see
tbmem/_internal/census/heap.py), the full census's heap pass alone (``gc.get_objects()``, the
selection of the wanted types, the list released: what the census pays before it looks at
one tensor), two references (``gc.get_objects()`` alone, the floor of any complete scan;
``gc.get_referrers(torch.Tensor, nn.Parameter)``, the traversal the full scan used before
issue 12, which missed other tensor classes), ratio census/memlab (full scans), and the heap
pass alone over memlab.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

__all__ = ["main"]

BAR = 0.15  # a full census at most this fraction of MemReporter's time on the base heap (issue 26)
VARIANTS = ("memlab", "census", "census_all", "census_off", "census_inc", "scan", "get_objects", "referrers")
_LAYOUT: list[Any] = []  # allocations of random sizes: each round's heap layout differs, as separate runs' do


def _memlab_reimplementation(model: Any) -> None:
    """pytorch_memlab 0.3.2 MemReporter.collect_tensor + get_stats, without printing."""
    import torch

    objects = gc.get_objects()
    tensors = [obj for obj in objects if isinstance(obj, torch.Tensor)]
    visited: dict[int, int] = {}
    for t in tensors:
        if t.numel() == 0:
            continue
        for x in ([t, t.grad] if isinstance(t, torch.nn.Parameter) and t.grad is not None else [t]):
            s = x.untyped_storage()
            size = math.ceil(s.size() * x.element_size() / 512) * 512
            visited.setdefault(s.data_ptr(), size)


def _reporter() -> tuple[Callable[[Any], None], str]:
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            from pytorch_memlab import MemReporter
    except ImportError:
        return _memlab_reimplementation, "memlab scan loop (reimplemented; pytorch_memlab not installed)"

    def run(model: Any) -> None:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # its isinstance() trips lazy modules' deprecation warnings
            MemReporter(model).report()

    return run, "pytorch_memlab.MemReporter(model).report()"


def _worker(seed: int, repeats: int, targets: list[int]) -> dict[str, Any]:
    """One round in this (fresh) process: times per variant per heap size, call by call."""
    with contextlib.suppress(ImportError):  # a realistic heap: what a PhiFlow trainer imports
        import torch.utils.tensorboard  # noqa: F401

        from phi.torch import flow  # noqa: F401
    import torch

    from tbmem._internal.census import heap, take_census

    rng = random.Random(seed)
    # Not a local variable: the census's walk of the frames' locals would examine its items.
    _LAYOUT[:] = [bytearray(rng.randrange(1, 1 << 20)), [object() for _ in range(rng.randrange(1, 20_000))]]
    report, label = _reporter()
    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(8)])
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(32, 256)).sum().backward()
    opt.step()
    data = [torch.randn(64, 64) for _ in range(200)]  # "other" tensors for both to find
    ballast: list[list[Any]] = []
    sizes = []
    for extra in targets:
        ballast.append([[] for _ in range(extra - sum(len(b) for b in ballast))] if extra else [])
        gc.collect()
        scans: list[str] = []
        fns: dict[str, Callable[[], Any]] = {
            "memlab": lambda: report(model),
            "census": lambda: take_census(models=[model], optimizers=[opt], full_scan=True),
            # right after the full census above: the objects created since are all young
            "census_inc": lambda: scans.append(take_census(models=[model], optimizers=[opt]).heap_scan),
            "census_all": lambda: take_census(models=[model], optimizers=[opt], numpy_scan="all", full_scan=True),
            "census_off": lambda: take_census(models=[model], optimizers=[opt], numpy_scan="off", full_scan=True),
            # references: the floor of any complete scan (a list of every gc-tracked object), and the
            # traversal the full scan used before issue 12 (it missed instances of other tensor classes)
            # the heap pass of a full census without the census: every object listed, the wanted
            # types selected, the list released (what any complete census pays before its first tensor)
            "scan": lambda: len(heap.find_instances(incremental=False).objects),
            "get_objects": lambda: len(gc.get_objects()),
            "referrers": lambda: len(gc.get_referrers(torch.Tensor, torch.nn.Parameter)),
        }
        # census_inc must follow a census; the other calls take turns in an order rotated every call
        units = [["memlab"], ["census", "census_inc"], ["census_all"], ["census_off"], ["scan"], ["get_objects"],
                 ["referrers"]]
        times: dict[str, list[float]] = {k: [] for k in fns}
        for i in range(repeats):
            for unit in units[i % len(units):] + units[:i % len(units)]:
                for name in unit:
                    t0 = time.perf_counter()
                    fns[name]()
                    times[name].append((time.perf_counter() - t0) * 1e3)
        sizes.append({"extra": extra, "objects": len(gc.get_objects()), "times": times,
                      "tensors": sum(1 for o in gc.get_objects() if type(o) in (torch.Tensor, torch.nn.Parameter)),
                      "incremental": scans.count("incremental"), "scans": len(scans)})
    del data
    return {"label": label, "sizes": sizes}


def _round_ratio(times: dict[str, list[float]], idx_census: list[int], idx_memlab: list[int]) -> float:
    census = [times["census"][i] for i in idx_census]
    memlab = [times["memlab"][i] for i in idx_memlab]
    return statistics.median(census) / statistics.median(memlab)


def _interval(rounds: list[dict[str, list[float]]], rng: random.Random) -> tuple[float, float]:
    """90% bootstrap interval of the median round ratio: resample rounds, then calls within each."""
    stats = []
    for _ in range(2000):
        ratios = []
        for _ in rounds:
            times = rounds[rng.randrange(len(rounds))]
            nc, nm = len(times["census"]), len(times["memlab"])
            ratios.append(_round_ratio(times, [rng.randrange(nc) for _ in range(nc)],
                                       [rng.randrange(nm) for _ in range(nm)]))
        stats.append(statistics.median(ratios))
    stats.sort()
    return stats[len(stats) // 20], stats[-len(stats) // 20 - 1]


def _run_round(seed: int, repeats: int, targets: list[int]) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--worker", "--seed", str(seed), "--repeats", str(repeats),
           "--targets", ",".join(map(str, targets))]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"round {seed} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    """Print the comparison table; return 0 when the census meets the bar (``BAR``) on the base heap."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds of 5 calls, without the 1M-object heap")
    parser.add_argument("--rounds", type=int, default=None, help="fresh processes (default 5, quick 3)")
    parser.add_argument("--repeats", type=int, default=None, help="calls of each variant per round (default 11)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--targets", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    repeats = args.repeats or (5 if args.quick else 11)
    if args.worker:
        print(json.dumps(_worker(args.seed, repeats, [int(t) for t in args.targets.split(",")])))
        return 0
    rounds = args.rounds or (3 if args.quick else 5)
    targets = [0, 100_000] if args.quick else [0, 100_000, 1_000_000]
    load_before = os.getloadavg()
    started = time.perf_counter()
    results = [_run_round(seed, repeats, targets) for seed in range(rounds)]
    load_after = os.getloadavg()
    print(f"baseline: {results[0]['label']}")
    print(f"{rounds} rounds (fresh processes) x {repeats} calls of each variant, interleaved; "
          f"{time.perf_counter() - started:.0f} s; load average {load_before[0]:.1f} before, {load_after[0]:.1f} after")
    print("| heap objects | tensors | memlab ms | census ms | census numpy=all ms | census numpy=off ms "
          "| census incremental ms | heap pass alone ms | gc.get_objects ms | previous scan ms | ratio census/memlab "
          "| 90% interval | rounds min-max | heap pass alone/memlab |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    rng = random.Random(0)
    base = (float("nan"), float("nan"), float("nan"))
    for k, extra in enumerate(targets):
        per_round = [r["sizes"][k] for r in results]
        times = [s["times"] for s in per_round]
        ms = {v: statistics.median(x for t in times for x in t[v]) for v in VARIANTS}
        ratios = [_round_ratio(t, list(range(len(t["census"]))), list(range(len(t["memlab"])))) for t in times]
        lo, hi = _interval(times, rng)
        ratio = statistics.median(ratios)
        inc_total, inc_scans = sum(s["incremental"] for s in per_round), sum(s["scans"] for s in per_round)
        inc = f"{ms['census_inc']:.1f}" + ("" if inc_total == inc_scans else f" ({inc_total}/{inc_scans} incremental)")
        objects = statistics.median(s["objects"] for s in per_round)
        print(f"| {objects:,.0f} | {per_round[0]['tensors']} | {ms['memlab']:.1f} | {ms['census']:.1f} "
              f"| {ms['census_all']:.1f} | {ms['census_off']:.1f} | {inc} | {ms['scan']:.1f} "
              f"| {ms['get_objects']:.1f} | {ms['referrers']:.1f} | {ratio:.3f} | {lo:.3f}-{hi:.3f} "
              f"| {min(ratios):.3f}-{max(ratios):.3f} | {ms['scan'] / ms['memlab']:.3f} |")
        if extra == 0:
            base = (ratio, lo, hi)
    ok = base[0] <= BAR
    print(f"bar: census <= {BAR} of memlab on the base heap: {'met' if ok else 'NOT met'} "
          f"(median over rounds {base[0]:.3f}, 90% interval {base[1]:.3f}-{base[2]:.3f})")
    print(f"RESULT name=census.vs_memlab_base_heap ratio={base[0]:.4f} limit={BAR:.4f}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
