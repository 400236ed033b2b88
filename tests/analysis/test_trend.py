"""The NumPy Theil-Sen estimator: robust to outliers, and the same numbers as SciPy's."""

from __future__ import annotations

import numpy as np
import pytest

from tbmem._internal.trend import MAX_POINTS, theil_sen


def test_exact_line_and_outliers():
    x = np.arange(20.0)
    y = 3.0 * x - 2.0
    y[[4, 11]] = [500.0, -500.0]
    fit = theil_sen(x, y)
    assert fit.slope == 3.0 and fit.intercept == -2.0
    assert fit.low <= 3.0 <= fit.high


@pytest.mark.parametrize("n", [4, 9, 40, 301])
def test_matches_scipy(n):
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(n)
    x = np.repeat(np.arange(n // 2 + 1) * 5.0, 2)[:n]  # repeated x values exercise the tie correction
    y = np.round(rng.normal(size=n), 1) + 0.02 * x  # rounding makes ties in y too
    ours = theil_sen(x, y, confidence=0.9)
    ref = stats.theilslopes(y, x, alpha=0.9)
    assert (ours.slope, ours.intercept, ours.low, ours.high) == pytest.approx(
        (ref.slope, ref.intercept, ref.low_slope, ref.high_slope), rel=1e-12, abs=1e-12)


def test_long_series_are_thinned_not_refused():
    x = np.arange(MAX_POINTS * 3, dtype=float)
    assert theil_sen(x, 0.5 * x + 1).slope == pytest.approx(0.5)


def test_bad_input():
    with pytest.raises(ValueError, match="distinct x"):
        theil_sen(np.ones(5), np.arange(5.0))
    with pytest.raises(ValueError, match="same length"):
        theil_sen(np.arange(3.0), np.arange(4.0))
    with pytest.raises(ValueError, match="confidence"):
        theil_sen(np.arange(3.0), np.arange(3.0), confidence=1.5)
