"""Leak detection over a logdir or a DataFrame of scalars: steady memory growth late in a run, with evidence.

The test is :mod:`tbmem._internal.trend`'s (the alerts run it online): for every memory tag of every
run, a Theil-Sen slope over the steps after the warm-up (``skip_fraction`` of the step range),
flagged when the slope is at least the threshold (MB per 1000 steps), its confidence
interval lies above zero and each half of the window grows at least half the threshold.
Census tags and ``vram_allocated`` count exact bytes of live tensors and use
``threshold_mb_per_1k``; RSS, USS, reserved and NVML memory include allocator caches and
fluctuate, so they use the larger ``noisy_threshold_mb_per_1k``.

Example:
    >>> import pandas as pd
    >>> from tbmem.analysis import detect_leaks
    >>> steps = list(range(0, 1000, 50))
    >>> df = pd.DataFrame({"run": "r", "tag": "Memory/Tensor_Category/activations_MB", "step": steps,
    ...                    "wall_time": 0.0, "value": [0.5 * s for s in steps]})  # 500 MB per 1k steps
    >>> [f"{f.category} {f.slope_mb_per_1k:.0f}" for f in detect_leaks(df)]
    ['activations 500']
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Iterable

from tbmem._internal.trend import (DEFAULT_NOISY_THRESHOLD_MB_PER_1K, DEFAULT_THRESHOLD_MB_PER_1K, EXACT_TAGS, NOISY_TAGS,
                         LeakFinding, check_options, detect_leaks_in_series, leak_tag_kind)

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

# all but detect_leaks are tbmem._internal.trend's (the alerts' test too), here where the analysis API has them
__all__ = ["LeakFinding", "detect_leaks", "detect_leaks_in_series", "leak_tag_kind", "EXACT_TAGS", "NOISY_TAGS",
           "DEFAULT_THRESHOLD_MB_PER_1K", "DEFAULT_NOISY_THRESHOLD_MB_PER_1K"]


def detect_leaks(
    data: "pd.DataFrame | str | os.PathLike[str]",
    *,
    threshold_mb_per_1k: float = DEFAULT_THRESHOLD_MB_PER_1K,
    noisy_threshold_mb_per_1k: float = DEFAULT_NOISY_THRESHOLD_MB_PER_1K,
    skip_fraction: float = 0.25,
    min_points: int = 4,
    confidence: float = 0.95,
    runs: Iterable[str] | None = None,
    include_clean: bool = False,
) -> list[LeakFinding]:
    """Find memory tags that grow steadily, per run.

    Args:
        data: A DataFrame from :func:`tbmem.analysis.load_scalars`, or a logdir to load.
        threshold_mb_per_1k: Flag exact tags (census, ``vram_allocated``) growing at least this fast.
        noisy_threshold_mb_per_1k: The same for RSS, USS, reserved and NVML memory.
        skip_fraction: Warm-up to ignore, as a fraction of each tag's step range.
        min_points: Tags with fewer records after the warm-up are not judged.
        confidence: Confidence level of the slope's interval.
        runs: Only these runs.
        include_clean: Also return the tags that are not flagged (for a full picture).

    Returns:
        Findings sorted by run, flagged first, then by steepest slope.

    Raises:
        ValueError: a parameter is out of range (the message names it).
    """
    check_options(skip_fraction, min_points, threshold_mb_per_1k, noisy_threshold_mb_per_1k)
    if isinstance(data, (str, os.PathLike)):
        from tbmem._internal.analysis.load import load_scalars

        data = load_scalars(data)
    df = data if runs is None else data[data["run"].isin(list(runs))]
    findings: list[LeakFinding] = []
    for run, group in df.groupby("run", sort=True):
        series = {str(tag): (g["step"].to_numpy(), g["value"].to_numpy(float))
                  for tag, g in group.groupby("tag", sort=False)}
        findings += detect_leaks_in_series(
            str(run), series, threshold_mb_per_1k=threshold_mb_per_1k,
            noisy_threshold_mb_per_1k=noisy_threshold_mb_per_1k, skip_fraction=skip_fraction,
            min_points=min_points, confidence=confidence, include_clean=include_clean)
    findings.sort(key=lambda f: (f.run, not f.flagged, -f.slope_mb_per_1k))
    return findings
