"""100k small tensors: the census against pytorch_memlab, and what ten censuses leave behind (issue 26).

Run: ``.venv/bin/python benchmarks/bench_census_tiny.py [--rounds 3] [--censuses 10] [--tensors 100000]``.

Each round runs two fresh processes, in an order alternated every round: one holds ``--tensors``
tensors of one float (``torch.zeros(1)``) and times ``pytorch_memlab.MemReporter().report()``
(printing into a buffer) ``--censuses`` times; the other holds the same tensors, takes one census on
25k tensors first (the first census of a process pages in its code, numpy's sorts of large arrays
among it, and builds its caches; those tensors are freed), then
measures the gc-tracked objects, resident memory (private and in total) and a ``gc.collect()`` of
the user's (median of 5), takes a full census and ``--censuses`` more with the defaults (the heap
pass of a census that found more than 10k instances is always a full one: the index an incremental
scan needs would cost ~90 bytes an instance), and measures again. memlab is kept out of the census's
process: it makes a storage object for every tensor, which torch keeps, and the census would then
count them too.

Ratios: the census's median over memlab's (limit 0.5), the later censuses' median over the first
(no slower: limit 1.1, the machine's noise), gc-tracked objects, private resident memory and the
user's ``gc.collect()`` after the ten censuses over before (1.01, 1.01, and 1.1 for a timing).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

__all__ = ["main"]


def _rss() -> dict[str, int]:
    fields = dict(line.split(":", 1) for line in open("/proc/self/status") if line.startswith(("Rss", "VmRSS")))
    return {k: int(v.split()[0]) for k, v in fields.items()}


def _gc_ms() -> float:
    times = []
    for _ in range(5):
        start = time.perf_counter()
        gc.collect()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def _state() -> dict[str, Any]:
    """Resident memory first: ``gc.get_objects()``'s list (2 MB here) is itself memory the C heap may keep."""
    rss = _rss()
    return {"rss": rss, "objects": len(gc.get_objects()), "gc_ms": _gc_ms()}


def _census_worker(tensors: int, censuses: int) -> dict[str, Any]:
    import torch

    from tbmem._internal.census import take_census

    warm = [torch.zeros(1) for _ in range(25_000)]  # the first census of a process pages in its code (numpy's
    take_census()  # sorts of large arrays among it) and builds its caches: on a quarter of the tensors, freed after
    del warm
    tiny = [torch.zeros(1) for _ in range(tensors)]
    gc.collect()
    before = _state()
    times, scans = [], []
    for i in range(censuses + 1):
        start = time.perf_counter()
        census = take_census(full_scan=i == 0)
        times.append((time.perf_counter() - start) * 1e3)
        scans.append(census.heap_scan)
        assert census.by_category["other"] >= 4 * len(tiny)
        del census
    gc.collect()
    after = _state()
    return {"times": times, "scans": scans, "before": before, "after": after}


def _memlab_worker(tensors: int, censuses: int) -> dict[str, Any]:
    import torch

    with contextlib.redirect_stdout(io.StringIO()):
        from pytorch_memlab import MemReporter
    tiny = [torch.zeros(1) for _ in range(tensors)]
    gc.collect()
    times = []
    for _ in range(censuses + 1):
        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # its isinstance() trips lazy modules' deprecation warnings
            MemReporter().report()
        times.append((time.perf_counter() - start) * 1e3)
    del tiny
    return {"times": times}


def _run(kind: str, tensors: int, censuses: int) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--worker", kind, "--tensors", str(tensors), "--censuses", str(censuses)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{kind} worker failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    """Print the table and the RESULT lines; return 0 when every ratio is within its limit."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--censuses", type=int, default=10)
    parser.add_argument("--tensors", type=int, default=100_000)
    parser.add_argument("--worker", choices=["census", "memlab"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        work = _census_worker if args.worker == "census" else _memlab_worker
        print(json.dumps(work(args.tensors, args.censuses)))
        return 0
    load_before, started = os.getloadavg(), time.perf_counter()
    census, memlab = [], []
    for r in range(args.rounds):
        for kind in (("census", "memlab") if r % 2 == 0 else ("memlab", "census")):
            (census if kind == "census" else memlab).append(_run(kind, args.tensors, args.censuses))
    load_after = os.getloadavg()
    first = statistics.median(c["times"][0] for c in census)
    later = statistics.median(t for c in census for t in c["times"][1:])
    mem = statistics.median(t for m in memlab for t in m["times"])
    mem_first = statistics.median(m["times"][0] for m in memlab)

    def grown(key: Any) -> float:
        return statistics.median(key(c["after"]) / key(c["before"]) for c in census)

    objects = grown(lambda s: s["objects"])
    anon = grown(lambda s: s["rss"]["RssAnon"])
    total = grown(lambda s: s["rss"]["VmRSS"])
    gc_time = grown(lambda s: s["gc_ms"])
    print(f"{args.rounds} rounds of two fresh processes (census, memlab), {args.tensors:,} tensors of one float, "
          f"{args.censuses + 1} calls each; {time.perf_counter() - started:.0f} s; load average "
          f"{load_before[0]:.1f} before, {load_after[0]:.1f} after")
    print(f"heap scans of the census process: {sorted(set(s for c in census for s in c['scans']))}")
    print("| memlab ms (first) | census ms: first (full) | later (defaults) | census/memlab | later/first "
          "| gc objects after/before | private RSS after/before | RSS after/before | user's gc.collect ms before -> after |")
    print("|---|---|---|---|---|---|---|---|---|")
    before_gc = statistics.median(c["before"]["gc_ms"] for c in census)
    after_gc = statistics.median(c["after"]["gc_ms"] for c in census)
    print(f"| {mem:.0f} ({mem_first:.0f}) | {first:.0f} | {later:.0f} | {later / mem:.3f} | {later / first:.3f} "
          f"| {objects:.4f} | {anon:.4f} | {total:.4f} | {before_gc:.0f} -> {after_gc:.0f} |")
    results = [("census.tiny_vs_memlab", later / mem, 0.5), ("census.tiny_later_vs_first", later / first, 1.1),
               ("census.tiny_gc_objects_after_ten", objects, 1.01), ("census.tiny_private_rss_after_ten", anon, 1.01),
               ("census.tiny_user_gc_collect_after_ten", gc_time, 1.1)]
    for name, ratio, limit in results:
        print(f"RESULT name={name} ratio={ratio:.4f} limit={limit:.4f}")
    return 0 if all(ratio <= limit for _, ratio, limit in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
