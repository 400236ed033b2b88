"""Leak detection: steady memory growth over the late part of a run, with evidence.

For every memory tag of every run, :func:`detect_leaks` fits a Theil-Sen slope
(:mod:`tbmem.analysis.trend`) over the steps after the warm-up
(``skip_fraction`` of the step range: optimizer state, allocator caches and
lazily built buffers appear there) and flags a tag when all of these hold:

* the slope is at least the threshold, in MB per 1000 steps;
* the lower end of its confidence interval is above zero (the growth is real);
* each half of the window grows at least half the threshold: a single jump
  (a buffer allocated once mid-run) is not steady growth, a leak is.

Census tags and ``vram_allocated`` count exact bytes of live tensors and use
``threshold_mb_per_1k``; RSS, USS, reserved and NVML memory include allocator
caches and fluctuate, so they use the larger ``noisy_threshold_mb_per_1k``.

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

import fnmatch
import os
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Iterable, Mapping

import numpy as np

from tbmem.analysis.trend import theil_sen

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = ["LeakFinding", "detect_leaks", "detect_leaks_in_series", "leak_tag_kind", "EXACT_TAGS", "NOISY_TAGS",
           "DEFAULT_THRESHOLD_MB_PER_1K", "DEFAULT_NOISY_THRESHOLD_MB_PER_1K"]

#: Exact tensor bytes: a clean loop's values are flat, so a small threshold is safe.
DEFAULT_THRESHOLD_MB_PER_1K = 5.0
#: Process/allocator memory: drifts by allocator caching and fragmentation.
DEFAULT_NOISY_THRESHOLD_MB_PER_1K = 100.0

EXACT_TAGS = (
    "Memory/Tensor_Category/*_MB",
    "Memory/Tensor_Census/total_MB",
    "Memory/Large_Tensors/total_MB",
    "Memory/GPU/vram_allocated_GB",
    "Monitor/batch_gpu_allocated_MB",
)
NOISY_TAGS = (
    "Memory/GPU/vram_reserved_GB",
    "Memory/GPU/vram_nvml_used_GB",
    "Memory/RAM/process_rss_GB",
    "Memory/RAM/process_uss_GB",
    "Monitor/batch_cpu_rss_MB",
)
_CATEGORY_PREFIX = "Memory/Tensor_Category/"


def leak_tag_kind(tag: str) -> str | None:
    """``"exact"``, ``"noisy"`` or None (not watched for leaks) for a tag."""
    if any(fnmatch.fnmatchcase(tag, p) for p in EXACT_TAGS):
        return "exact"
    if any(fnmatch.fnmatchcase(tag, p) for p in NOISY_TAGS):
        return "noisy"
    return None


def _to_mb(tag: str) -> float:
    return 1024.0 if tag.endswith("_GB") else 1.0


@dataclass(frozen=True, kw_only=True)
class LeakFinding:
    """The trend of one memory tag of one run, and whether it counts as a leak.

    Attributes:
        run: Run name (path relative to the logdir).
        tag: The TensorBoard tag.
        kind: ``"exact"`` (tensor bytes) or ``"noisy"`` (process/allocator memory).
        flagged: True when the growth is steady and above the threshold.
        slope_mb_per_1k: Theil-Sen slope in MB per 1000 steps.
        low_mb_per_1k: Lower end of the slope's confidence interval.
        high_mb_per_1k: Upper end of the slope's confidence interval.
        confidence: Confidence level of the interval.
        threshold_mb_per_1k: The threshold this tag was held to.
        start_step: First step of the analysed window (after the warm-up).
        end_step: Last step of the window.
        start_mb: Value at ``start_step``, in MB.
        end_mb: Value at ``end_step``, in MB.
        n_points: Records in the window.

    Example:
        >>> f = LeakFinding(run="r", tag="Memory/RAM/process_rss_GB", kind="noisy", flagged=False,
        ...                 slope_mb_per_1k=1.0, low_mb_per_1k=-2.0, high_mb_per_1k=3.0, confidence=0.95,
        ...                 threshold_mb_per_1k=100.0, start_step=100, end_step=300, start_mb=500.0,
        ...                 end_mb=500.2, n_points=21)
        >>> f.category is None, round(f.growth_mb, 3)
        (True, 0.2)
    """

    run: str
    tag: str
    kind: str
    flagged: bool
    slope_mb_per_1k: float
    low_mb_per_1k: float
    high_mb_per_1k: float
    confidence: float
    threshold_mb_per_1k: float
    start_step: int
    end_step: int
    start_mb: float
    end_mb: float
    n_points: int

    @property
    def category(self) -> str | None:
        """The census category (``activations``, ...) for a category tag, else None."""
        if self.tag.startswith(_CATEGORY_PREFIX) and self.tag.endswith("_MB"):
            return self.tag[len(_CATEGORY_PREFIX):-3]
        return None

    @property
    def growth_mb(self) -> float:
        """``end_mb - start_mb``."""
        return self.end_mb - self.start_mb

    def describe(self) -> str:
        """One line of evidence, e.g. for the console."""
        return (f"{self.run}: {self.tag} grows {self.slope_mb_per_1k:+.1f} MB/1k steps "
                f"({self.confidence:.0%} CI {self.low_mb_per_1k:+.1f}..{self.high_mb_per_1k:+.1f}; "
                f"threshold {self.threshold_mb_per_1k:g}), {self.start_mb:.1f} MB at step {self.start_step} "
                f"-> {self.end_mb:.1f} MB at step {self.end_step} ({self.n_points} points)")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict, with ``category`` and ``growth_mb`` added."""
        return {**asdict(self), "category": self.category, "growth_mb": self.growth_mb}


def _half_slope(x: np.ndarray, y: np.ndarray) -> float:
    if len(np.unique(x)) < 2:
        return float("inf")  # too few points to judge this half: do not veto
    return theil_sen(x, y).slope


def _fit(run: str, tag: str, kind: str, steps: np.ndarray, values: np.ndarray, *, threshold: float,
         skip_fraction: float, min_points: int, confidence: float) -> LeakFinding | None:
    first, last = steps[0], steps[-1]
    keep = steps >= first + skip_fraction * (last - first)
    x, y = steps[keep].astype(float), values[keep] * _to_mb(tag)
    if len(x) < min_points or x[-1] == x[0]:
        return None
    fit = theil_sen(x, y, confidence)
    slope, low, high = (v * 1000.0 for v in (fit.slope, fit.low, fit.high))
    mid = len(x) // 2
    halves = (_half_slope(x[: mid + 1], y[: mid + 1]) * 1000.0, _half_slope(x[mid:], y[mid:]) * 1000.0)
    flagged = slope >= threshold and low > 0.0 and min(halves) >= threshold / 2.0
    return LeakFinding(run=run, tag=tag, kind=kind, flagged=bool(flagged), slope_mb_per_1k=slope,
                       low_mb_per_1k=low, high_mb_per_1k=high, confidence=confidence,
                       threshold_mb_per_1k=threshold, start_step=int(x[0]), end_step=int(x[-1]),
                       start_mb=float(y[0]), end_mb=float(y[-1]), n_points=len(x))


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
    _check_options(skip_fraction, min_points, threshold_mb_per_1k, noisy_threshold_mb_per_1k)
    if isinstance(data, (str, os.PathLike)):
        from tbmem.analysis.load import load_scalars

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


def detect_leaks_in_series(
    run: str,
    series: Mapping[str, tuple[np.ndarray, np.ndarray]],
    *,
    threshold_mb_per_1k: float = DEFAULT_THRESHOLD_MB_PER_1K,
    noisy_threshold_mb_per_1k: float = DEFAULT_NOISY_THRESHOLD_MB_PER_1K,
    skip_fraction: float = 0.25,
    min_points: int = 4,
    confidence: float = 0.95,
    include_clean: bool = False,
) -> list[LeakFinding]:
    """:func:`detect_leaks` for one run given as ``{tag: (steps, values)}`` arrays; needs no pandas.

    The TensorBoard plugin uses it on the scalars TensorBoard's data provider holds.
    Returns the findings flagged first, then by steepest slope.
    """
    _check_options(skip_fraction, min_points, threshold_mb_per_1k, noisy_threshold_mb_per_1k)
    findings: list[LeakFinding] = []
    for tag in sorted(series):
        kind = leak_tag_kind(tag)
        if kind is None:
            continue
        steps, values = (np.asarray(a) for a in series[tag])
        if len(steps) == 0:
            continue
        order = np.argsort(steps, kind="stable")
        threshold = threshold_mb_per_1k if kind == "exact" else noisy_threshold_mb_per_1k
        finding = _fit(run, tag, kind, steps[order], values[order].astype(float), threshold=threshold,
                       skip_fraction=skip_fraction, min_points=min_points, confidence=confidence)
        if finding is not None and (finding.flagged or include_clean):
            findings.append(finding)
    findings.sort(key=lambda f: (not f.flagged, -f.slope_mb_per_1k))
    return findings


def _check_options(skip_fraction: float, min_points: int, threshold: float, noisy_threshold: float) -> None:
    if not 0.0 <= skip_fraction < 1.0:
        raise ValueError(f"skip_fraction must be in [0, 1), got {skip_fraction!r}")
    if min_points < 3:
        raise ValueError(f"min_points must be >= 3, got {min_points!r}")
    for name, value in (("threshold_mb_per_1k", threshold), ("noisy_threshold_mb_per_1k", noisy_threshold)):
        if not value > 0:
            raise ValueError(f"{name} must be > 0, got {value!r}")

