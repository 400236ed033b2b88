"""Census cost vs pytorch_memlab's MemReporter, side by side in one process, and its growth with heap size.

Run: ``.venv/bin/python benchmarks/bench_census.py [--quick]``. The acceptance bar
(issue 3) is census time <= 1/3 of ``MemReporter(model).report()`` on the same heap.
Without pytorch_memlab installed, a faithful copy of its scan loop
(``gc.get_objects()`` + ``isinstance(obj, torch.Tensor)`` + per-tensor storage stats)
stands in, and the output says so.

Example output columns: heap objects, tensors, memlab ms, census ms (each
numpy_scan mode, full heap scans), census ms right after another census (the
incremental scan, see tbmem/census/heap.py), ratio census/memlab (full scans).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import math
import statistics
import time
import warnings
from typing import Any, Callable

import torch

__all__ = ["main"]


def _memlab_reimplementation(model: torch.nn.Module) -> None:
    """pytorch_memlab 0.3.2 MemReporter.collect_tensor + get_stats, without printing."""
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


def _reporter() -> tuple[Callable[[torch.nn.Module], None], str]:
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            from pytorch_memlab import MemReporter
    except ImportError:
        return _memlab_reimplementation, "memlab scan loop (reimplemented; pytorch_memlab not installed)"

    def run(model: torch.nn.Module) -> None:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # its isinstance() trips lazy modules' deprecation warnings
            MemReporter(model).report()

    return run, "pytorch_memlab.MemReporter(model).report()"


def _interleaved(fns: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Median ms of each function, calls interleaved so machine load hits all alike."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - t0) * 1e3)
    return {k: statistics.median(v) for k, v in times.items()}


def main(argv: list[str] | None = None) -> int:
    """Print the comparison table; return 0 when the census meets the 1/3 bar on the base heap."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats, skip the 1M-object heap")
    args = parser.parse_args(argv)
    with contextlib.suppress(ImportError):  # a realistic heap: what a PhiFlow trainer imports
        import torch.utils.tensorboard  # noqa: F401

        from phi.torch import flow  # noqa: F401
    from tbmem.census import take_census

    report, label = _reporter()
    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(8)])
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(32, 256)).sum().backward()
    opt.step()
    data = [torch.randn(64, 64) for _ in range(200)]  # noqa: F841 - "other" tensors for both to find
    repeats = 5 if args.quick else 11
    ballast: list[list[Any]] = []
    targets = [0, 100_000, 1_000_000] if not args.quick else [0, 100_000]
    print(f"baseline: {label}")
    print("| heap objects | tensors | memlab ms | census ms | census numpy=all ms | census numpy=off ms "
          "| census incremental ms | ratio census/memlab |")
    print("|---|---|---|---|---|---|---|---|")
    ok, base_ratio = True, float("nan")
    for extra in targets:
        ballast.append([[] for _ in range(extra - sum(len(b) for b in ballast))] if extra else [])
        gc.collect()
        n_obj = len(gc.get_objects())
        n_tensors = sum(1 for o in gc.get_objects() if type(o) in (torch.Tensor, torch.nn.Parameter))
        scans: list[str] = []
        fns = {
            "memlab": lambda: report(model),
            "census": lambda: take_census(models=[model], optimizers=[opt], full_scan=True),
            # right after the full census above: the objects created since are all young
            "census_inc": lambda: scans.append(take_census(models=[model], optimizers=[opt]).heap_scan),
            "census_all": lambda: take_census(models=[model], optimizers=[opt], numpy_scan="all", full_scan=True),
            "census_off": lambda: take_census(models=[model], optimizers=[opt], numpy_scan="off", full_scan=True),
        }
        ms = _interleaved(fns, repeats)
        inc = f"{ms['census_inc']:.1f}" + ("" if set(scans) == {"incremental"} else
                                            f" ({scans.count('incremental')}/{len(scans)} incremental)")
        ratio = ms["census"] / ms["memlab"]
        if extra == 0:
            ok = ratio <= 1 / 3
            base_ratio = ratio
        print(f"| {n_obj:,} | {n_tensors} | {ms['memlab']:.1f} | {ms['census']:.1f} | {ms['census_all']:.1f} "
              f"| {ms['census_off']:.1f} | {inc} | {ratio:.2f} |")
    print(f"bar: census <= 1/3 of memlab on the base heap: {'met' if ok else 'NOT met'}")
    print(f"RESULT name=census.vs_memlab_base_heap ratio={base_ratio:.4f} limit={1 / 3:.4f}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
