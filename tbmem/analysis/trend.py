"""Theil-Sen slope with Sen's confidence interval, in NumPy (no SciPy needed).

The Theil-Sen estimator is the median of the slopes between all pairs of
points: a few spikes (a census taken mid-forward, an allocator flush) cannot
tilt it, unlike least squares. The interval is Sen's (1968) distribution-free
one, the same as ``scipy.stats.theilslopes``.

Example:
    >>> import numpy as np
    >>> from tbmem.analysis.trend import theil_sen
    >>> x = np.arange(10.0); y = 2 * x + 1; y[3] = 100.0  # one outlier
    >>> theil_sen(x, y).slope
    2.0
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

__all__ = ["TheilSen", "theil_sen", "MAX_POINTS"]

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
