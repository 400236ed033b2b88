"""The headroom hint: the largest batch size that still fits, from a logged forecast or a CUDA run's peak.

With a forecast logged as the text ``Memory/Forecast`` (``batch_size: auto`` does), its fitted lines
give the peak at any batch size exactly. Without one, a CUDA run's peak allocated memory at a known
batch size (``--batch-size``, or the trainers' ``config`` text) gives an estimate that assumes
everything but the parameters, gradients, optimizer state and buffers grows with the batch. The
budget is that of :mod:`tbmem._internal.forecast.budget`, from the run's last record.

Example:
    >>> from tbmem._internal.analysis.headroom import largest_fitting
    >>> largest_fitting([[1000.0, 10.0], [5000.0, 0.0]], budget=2000.0)  # max(1000 + 10 n, 5000) > 2000
    0
    >>> largest_fitting([[1000.0, 10.0]], budget=2000.0)
    100
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from tbmem._internal.analysis.summary import RunSummary, tag_series, value_at
from tbmem._internal.forecast.report import FORECAST_TEXT_TAG, format_bytes

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = ["headroom", "largest_fitting"]

_MB = float(2**20)
_GB = float(2**30)


def _forecast(texts: "pd.DataFrame | None", run: str) -> tuple[int, dict[str, Any]] | None:
    if texts is None or texts.empty:
        return None
    rows = texts[(texts["run"] == run) & (texts["tag"] == FORECAST_TEXT_TAG)]
    if rows.empty:
        return None
    step, text = rows.sort_values("step")[["step", "value"]].values[-1]
    m = re.search(r"```json\n(.*?)\n```", str(text), re.S)
    if m is None:
        return None
    try:
        return int(step), json.loads(m.group(1))
    except ValueError:
        return None


def _batch_in_use(texts: "pd.DataFrame | None", run: str, forecast: dict[str, Any] | None) -> int | None:
    if forecast is not None and isinstance(forecast.get("in_use"), int):
        return int(forecast["in_use"])
    if texts is None or texts.empty:
        return None
    rows = texts[(texts["run"] == run) & (texts["tag"] == "config")]
    for text in rows["value"]:
        m = re.search(r'"batch_size":\s*(\d+)', str(text))
        if m:
            return int(m.group(1))
    return None


def largest_fitting(lines: list[list[float]], budget: float) -> int | None:
    """The largest ``n`` with ``max(a + b n) <= budget`` over ``lines``; None when no line grows."""
    if any(b <= 0 and a > budget for a, b in lines):
        return 0  # a part that does not shrink with the batch is already over the budget
    slopes = [(a, b) for a, b in lines if b > 0]
    if not slopes:
        return None
    n = max(int(min((budget - a) / b for a, b in slopes)), 0)
    while n > 0 and max(a + b * n for a, b in lines) > budget:
        n -= 1
    return n


def _budget_from(df: "pd.DataFrame", cpu_resident: float) -> tuple[float, str, int] | None:
    from tbmem._internal.forecast.budget import cpu_budget, cuda_budget

    free, reserved = tag_series(df, "System/vram_free_GB"), tag_series(df, "Memory/GPU/vram_reserved_GB")
    if free is not None and reserved is not None:
        step = int(free["step"].iloc[-1])
        r = value_at(df, "Memory/GPU/vram_reserved_GB", step) or 0.0
        b = cuda_budget(free=int(float(free["value"].iloc[-1]) * _GB), reserved=int(r * _GB))
        return float(b.bytes), b.explanation, step
    avail = tag_series(df, "System/ram_available_GB")
    if avail is not None:
        b = cpu_budget(available=int(float(avail["value"].iloc[-1]) * _GB), resident=int(cpu_resident))
        return float(b.bytes), b.explanation, int(avail["step"].iloc[-1])
    return None


def headroom(s: RunSummary, df: "pd.DataFrame", texts: "pd.DataFrame | None",
             batch_size: int | None) -> dict[str, Any] | None:
    """The ``batch_headroom`` hint's fields (``title``, ``advice``, ``evidence``, ``step``, ``data``), or None."""
    logged = _forecast(texts, s.run)
    forecast = logged[1] if logged else None
    in_use = batch_size if batch_size is not None else _batch_in_use(texts, s.run, forecast)
    if forecast is not None:
        lines = forecast["lines"]
        budget = _budget_from(df, float(forecast.get("resident_bytes", 0)))
        source = f"the forecast logged at step {logged[0]}" if logged else "the forecast"
    elif in_use and s.peak_allocated_gb is not None:
        # no forecast: assume everything above the model's own memory (0 without a census) scales with the batch
        fixed = sum(s.category_mb_at_peak.get(c, 0.0) for c in ("parameters", "gradients", "optimizer_state",
                                                                "buffers")) * _MB
        peak = s.peak_allocated_gb * _GB
        lines = [[fixed, max(peak - fixed, 0.0) / in_use]]
        budget = _budget_from(df, 0.0)
        source = (f"the peak {s.peak_allocated_gb:.2f} GB at batch size {in_use}, assuming everything but the "
                  "parameters, gradients, optimizer state and buffers grows with the batch")
    else:
        return None
    if budget is None:
        return None
    limit, explanation, budget_step = budget
    fits = largest_fitting(lines, limit)

    def peak_at(n: float) -> float:
        return max(a + b * n for a, b in lines)

    if fits is None:
        advice = "The peak does not grow with the batch size: any batch size fits."
    elif in_use is None:
        advice = f"The largest batch size that fits is {fits} (peak {format_bytes(peak_at(fits))})."
    elif fits < in_use:
        steps = -(-in_use // max(fits, 1))
        advice = (f"Batch size {in_use} needs {format_bytes(peak_at(in_use))}, over the budget: {fits} fits; "
                  f"keep the effective batch with gradient_accumulation_steps={steps} at batch size "
                  f"{-(-in_use // steps)}.")
    else:
        advice = (f"Batch size {in_use} peaks at {format_bytes(peak_at(in_use))}; up to {fits} would still fit "
                  f"(peak {format_bytes(peak_at(fits))}).")
    return dict(
        step=budget_step,
        title=f"largest batch size that fits: {fits if fits is not None else 'any'}",
        advice=advice, evidence=f"from {source}; budget at step {budget_step}: {explanation} = {format_bytes(limit)}",
        data={"max_batch_size": fits, "batch_size": in_use, "budget_bytes": limit, "lines": lines})
