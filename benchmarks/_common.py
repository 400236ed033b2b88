"""Shared helpers for the benchmarks: interleaved A/B timing and a results line format.

Each benchmark prints its own table and, for each comparison, one machine-readable line
``RESULT name=<name> ratio=<candidate/baseline> limit=<max ratio or ->`` that
``benchmarks/run_all.py`` collects into the summary table.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

__all__ = ["interleaved", "result_line"]


def interleaved(baseline: Callable[[], None], candidate: Callable[[], None], *, rounds: int = 7,
                repeat: int = 50) -> tuple[float, float]:
    """Median seconds per call of baseline and candidate, timed in alternating rounds."""
    base, cand = [], []
    for _ in range(rounds):
        for fn, out in ((baseline, base), (candidate, cand)):
            start = time.perf_counter()
            for _ in range(repeat):
                fn()
            out.append((time.perf_counter() - start) / repeat)
    return statistics.median(base), statistics.median(cand)


def result_line(name: str, ratio: float, limit: float | None = None) -> str:
    """The line run_all.py parses."""
    return f"RESULT name={name} ratio={ratio:.4f} limit={'-' if limit is None else limit}"
