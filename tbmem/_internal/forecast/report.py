"""The printable forecast table and its markdown/JSON form for TensorBoard.

Example:
    >>> from tbmem._internal.forecast.report import format_bytes
    >>> format_bytes(3 * 2**20), format_bytes(5 * 2**30), format_bytes(-2048)
    ('3.0 MiB', '5.00 GiB', '-2.0 KiB')
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any, Iterable

from tbmem._internal.tags import TAGS

if TYPE_CHECKING:  # pragma: no cover
    from tbmem._internal.forecast.core import Forecast

__all__ = ["format_bytes", "format_table", "to_markdown", "FORECAST_TEXT_TAG"]

#: Text tag of a forecast written to TensorBoard (tbmem._internal.analysis.hints reads its JSON).
FORECAST_TEXT_TAG = TAGS["forecast_text"].tag

_LABELS = {
    "parameters": "parameters", "gradients": "gradients", "optimizer_state": "optimizer state",
    "buffers": "buffers", "activations": "activations alive before", "batch": "batch",
    "other": "other tensors", "unattributed": "unattributed (CUDA)",
    "step:activations": "step: activations (forward)", "step:backward": "step: backward temporaries",
    "step:no_grad": "step: no-grad code (optimizer)", "step:gradients": "step: gradients",
    "step:optimizer_state": "step: optimizer state", "step:parameters": "step: parameters",
    "step:other": "step: other", "allocator_overhead": "allocator overhead (CUDA)",
}


def format_bytes(n: float) -> str:
    """Binary units, sign kept: ``512 B``, ``3.0 KiB``, ``1.5 MiB``, ``2.00 GiB``."""
    size = abs(n)
    sign = "-" if n < 0 else ""
    if size < 1024:
        return f"{sign}{size:.0f} B"
    if size < 2**20:
        return f"{sign}{size / 1024:.1f} KiB"
    if size < 2**30:
        return f"{sign}{size / 2**20:.1f} MiB"
    return f"{sign}{size / 2**30:.2f} GiB"


def _columns(f: "Forecast", at: Iterable[int] | None, budget_bytes: int | None,
             explanation: str | None) -> tuple[list[int], int | None, str, int]:
    if budget_bytes is None:
        budget = f.budget()
        limit, text = budget.bytes, budget.explanation
    else:
        limit, text = int(budget_bytes), explanation or "given"
    fits = f.max_batch_size(limit)
    wanted = list(at) if at is not None else ([fits] if fits else [])
    return sorted(set(wanted) - set(f.batch_sizes)), fits, text, limit


def format_table(f: "Forecast", *, at: Iterable[int] | None = None, budget_bytes: int | None = None,
                 budget_explanation: str | None = None) -> str:
    """Rows: categories at the peak; columns: each probed size (measured), then the forecasts."""
    wanted, fits, budget_text, limit = _columns(f, at, budget_bytes, budget_explanation)
    measured = {m.batch_size: m for m in f.measurements}
    cols: list[tuple[str, dict[str, int], int, int | None]] = [
        (f"n={n}", f.breakdown(n), f.peak_bytes(n), measured[n].peak_bytes) for n in f.batch_sizes]
    cols += [(f"n={n} (forecast)", f.breakdown(n), f.peak_bytes(n), None) for n in wanted]
    keys = [k for k in _LABELS if any(k in c[1] for c in cols)]
    keys += sorted({k for c in cols for k in c[1]} - set(keys))
    header = ["bytes at the step's peak"] + [c[0] for c in cols]
    rows = [[_LABELS.get(k, k)] + [format_bytes(c[1].get(k, 0)) for c in cols] for k in keys]
    rows.append(["peak (fit)"] + [format_bytes(c[2]) for c in cols])
    rows.append(["peak (measured)"] + [format_bytes(c[3]) if c[3] is not None else "" for c in cols])
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    lines = [f"Memory forecast on {f.device}, fitted on batch sizes {', '.join(map(str, f.batch_sizes))} "
             f"in {f.fit_seconds:.1f} s"]
    for r in [header, ["-" * w for w in widths]] + rows:
        lines.append("  ".join([r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:])]).rstrip())
    q = f.quality
    holdout = "n/a (two sizes)" if q.holdout_error is None else f"{q.holdout_error:+.2%}"
    lines.append(f"fit: {q.mode}, error at the probed sizes {q.fit_error:.2%}, largest size held out {holdout} "
                 f"({'good' if q.good else 'POOR'}); large batches: {format_bytes(f.fixed_bytes)} + "
                 f"{format_bytes(f.bytes_per_sample)} per sample")
    if fits is None:
        lines.append(f"budget: {budget_text} = {format_bytes(limit)}: the peak does not grow with the batch size")
    else:
        lines.append(f"budget: {budget_text} = {format_bytes(limit)}: largest batch size that fits {fits}")
    lines += [f"note: {n}" for n in f.notes]
    return "\n".join(lines)


def _finite(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


def to_markdown(f: "Forecast", *, at: Iterable[int] | None = None, budget_bytes: int | None = None,
                budget_explanation: str | None = None, in_use: int | None = None) -> str:
    """The table as a code block, then the JSON summary (plus ``in_use``) as a ``json`` code block."""
    table = format_table(f, at=at, budget_bytes=budget_bytes, budget_explanation=budget_explanation)
    doc = json.dumps(_finite({**f.to_dict(), "in_use": in_use}), allow_nan=False)
    return "\n".join(["**Memory forecast**", "", "    " + table.replace("\n", "\n    "), "", "```json", doc, "```"])
