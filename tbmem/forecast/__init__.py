"""Forecast a training step's peak memory at any batch size, and the largest batch that fits.

:func:`fit` runs the step at a few small batch sizes, measures each step's peak of
live tensor bytes (the snapshots' allocation recorder on every device, the caching
allocator's peak on CUDA), splits it into what was alive before the step and what
the step adds, and fits straight lines in the batch size through every aligned point
of the step. See docs/forecast.md.

Example:
    >>> import torch
    >>> from tbmem.forecast import fit
    >>> net = torch.nn.Linear(8, 8)
    >>> f = fit(lambda x: net(x).sum().backward(), lambda n: torch.ones(n, 8), batch_sizes=(2, 4, 8), model=net)
    >>> f.peak_bytes(1000) > f.peak_bytes(10)
    True
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tbmem._internal._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "fit": "tbmem._internal.forecast.core",
    "Forecast": "tbmem._internal.forecast.core",
    "FitQuality": "tbmem._internal.forecast.core",
    "ForecastError": "tbmem._internal.forecast.probe",
    "StepMeasurement": "tbmem._internal.forecast.measure",
    "measure_step": "tbmem._internal.forecast.measure",
    "Budget": "tbmem._internal.forecast.budget",
    "default_budget": "tbmem._internal.forecast.budget",
    "format_bytes": "tbmem._internal.forecast.report",
    "FORECAST_TEXT_TAG": "tbmem._internal.forecast.report",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # pragma: no cover
    from tbmem._internal.forecast.budget import Budget, default_budget
    from tbmem._internal.forecast.core import FitQuality, Forecast, fit
    from tbmem._internal.forecast.probe import ForecastError
    from tbmem._internal.forecast.measure import StepMeasurement, measure_step
    from tbmem._internal.forecast.report import FORECAST_TEXT_TAG, format_bytes


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
