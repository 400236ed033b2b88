"""Trends of memory series, online and offline: the Theil-Sen slope and the leak test.

Below both the alerts (:mod:`tbmem._internal.alerts`, which test the last records of a running
training) and the analysis (:mod:`tbmem._internal.analysis.leaks`, ``tbmem report``, the Memory tab's
findings): one test, numpy only, no pandas, no torch.

The Theil-Sen estimator is the median of the slopes between all pairs of points: a few
spikes (a census taken mid-forward, an allocator flush) cannot tilt it, unlike least
squares. Its interval is Sen's (1968) distribution-free one, the same as
``scipy.stats.theilslopes``.

A series is a leak (:func:`fit_trend`) when, over the steps after the warm-up (optimizer
state, allocator caches and lazily built buffers appear there), all of these hold:

* the slope is at least the threshold, in MB per 1000 steps;
* the lower end of its confidence interval is above zero (the growth is real);
* each half of the window grows at least half the threshold: a single jump
  (a buffer allocated once mid-run) is not steady growth, a leak is.

Census tags and ``vram_allocated`` count exact bytes of live tensors and are held to the
exact threshold; RSS, USS, reserved and NVML memory include allocator caches and
fluctuate, so they are held to the larger noisy one (:func:`leak_tag_kind`).

Example:
    >>> import numpy as np
    >>> from tbmem._internal.trend import detect_leaks_in_series, theil_sen
    >>> x = np.arange(10.0); y = 2 * x + 1; y[3] = 100.0  # one outlier
    >>> theil_sen(x, y).slope
    2.0
    >>> steps = np.arange(0, 1000, 50)
    >>> [f.slope_mb_per_1k for f in detect_leaks_in_series("r", {"Memory/Tensor_Census/total_MB": (steps, 0.5 * steps)})]
    [500.0]
"""

from __future__ import annotations

import fnmatch
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Any, Mapping

import numpy as np

__all__ = ["TheilSen", "theil_sen", "MAX_POINTS", "LeakFinding", "fit_trend", "detect_leaks_in_series",
           "leak_tag_kind", "check_options", "EXACT_TAGS", "NOISY_TAGS", "DEFAULT_THRESHOLD_MB_PER_1K",
           "DEFAULT_NOISY_THRESHOLD_MB_PER_1K"]

#: Exact tensor bytes: a clean loop's values are flat, so a small threshold is safe.
DEFAULT_THRESHOLD_MB_PER_1K = 5.0
#: Process/allocator memory: drifts by allocator caching and fragmentation.
DEFAULT_NOISY_THRESHOLD_MB_PER_1K = 100.0

#: Tags of exact tensor bytes (census, ``vram_allocated``): held to the exact threshold.
EXACT_TAGS = (
    "Memory/Tensor_Category/*_MB",
    "Memory/Tensor_Census/total_MB",
    "Memory/Large_Tensors/total_MB",
    "Memory/GPU/vram_allocated_GB",
    "Monitor/batch_gpu_allocated_MB",
)
#: Tags of process and allocator memory: held to the noisy threshold.
NOISY_TAGS = (
    "Memory/GPU/vram_reserved_GB",
    "Memory/GPU/vram_nvml_used_GB",
    "Memory/RAM/process_rss_GB",
    "Memory/RAM/process_uss_GB",
    "Monitor/batch_cpu_rss_MB",
)
_CATEGORY_PREFIX = "Memory/Tensor_Category/"
#: Longer series are thinned evenly to this many points (all pairs: ~2M slopes).
MAX_POINTS = 2000


@dataclass(frozen=True)
class TheilSen:
    """Result of :func:`theil_sen`: slope, intercept and the slope's confidence interval."""

    slope: float
    intercept: float
    low: float
    high: float


def _tie_term(values: np.ndarray) -> float:
    _, counts = np.unique(values, return_counts=True)
    counts = counts[counts > 1].astype(float)
    return float(np.sum(counts * (counts - 1) * (2 * counts + 5)))


def theil_sen(x: np.ndarray, y: np.ndarray, confidence: float = 0.95) -> TheilSen:
    """Robust slope of ``y`` over ``x`` with a ``confidence`` interval.

    Raises:
        ValueError: fewer than two distinct ``x`` values, or lengths differ.
    """
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError("x and y must be 1-D arrays of the same length")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    if len(x) > MAX_POINTS:
        keep = np.unique(np.linspace(0, len(x) - 1, MAX_POINTS).round().astype(int))
        x, y = x[keep], y[keep]
    i, j = np.triu_indices(len(x), k=1)
    dx = x[j] - x[i]
    ok = dx != 0
    if not ok.any():
        raise ValueError("need at least two distinct x values for a slope")
    slopes = np.sort((y[j] - y[i])[ok] / dx[ok])
    slope = float(np.median(slopes))
    intercept = float(np.median(y) - slope * np.median(x))
    n = len(x)
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    sigma = np.sqrt((n * (n - 1) * (2 * n + 5) - _tie_term(x) - _tie_term(y)) / 18.0)
    nt = len(slopes)
    upper = min(int(round((nt + z * sigma) / 2.0)), nt - 1)
    lower = max(int(round((nt - z * sigma) / 2.0)) - 1, 0)
    return TheilSen(slope=slope, intercept=intercept, low=float(slopes[lower]), high=float(slopes[upper]))


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


def fit_trend(run: str, tag: str, kind: str, steps: np.ndarray, values: np.ndarray, *, threshold: float,
              skip_fraction: float, min_points: int, confidence: float) -> LeakFinding | None:
    """The trend of one series (steps ascending, values in the tag's unit) after the warm-up
    (``skip_fraction`` of its step range), and whether it is a leak by the three tests of this
    module's docstring; None when fewer than ``min_points`` records are left to judge.
    :class:`tbmem._internal.alerts.AlertMonitor` runs it on the last ``growth_window`` records of a run."""
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
    """Leak findings of one run given as ``{tag: (steps, values)}`` arrays; needs no pandas.

    The Memory tab uses it on the scalars TensorBoard's data provider holds, ``tbmem report`` on a logdir's
    (:func:`tbmem.analysis.detect_leaks`).
    Returns the findings flagged first, then by steepest slope.
    """
    check_options(skip_fraction, min_points, threshold_mb_per_1k, noisy_threshold_mb_per_1k)
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
        finding = fit_trend(run, tag, kind, steps[order], values[order].astype(float), threshold=threshold,
                            skip_fraction=skip_fraction, min_points=min_points, confidence=confidence)
        if finding is not None and (finding.flagged or include_clean):
            findings.append(finding)
    findings.sort(key=lambda f: (not f.flagged, -f.slope_mb_per_1k))
    return findings


def check_options(skip_fraction: float, min_points: int, threshold: float, noisy_threshold: float) -> None:
    if not 0.0 <= skip_fraction < 1.0:
        raise ValueError(f"skip_fraction must be in [0, 1), got {skip_fraction!r}")
    if min_points < 3:
        raise ValueError(f"min_points must be >= 3, got {min_points!r}")
    for name, value in (("threshold_mb_per_1k", threshold), ("noisy_threshold_mb_per_1k", noisy_threshold)):
        if not value > 0:
            raise ValueError(f"{name} must be > 0, got {value!r}")
