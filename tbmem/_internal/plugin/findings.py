"""The Findings panel: leak findings of :mod:`tbmem.analysis` and the ``tbmem report`` summary of a run.

Both are computed from the scalars TensorBoard's data provider holds for the run (by
default TensorBoard keeps 1000 records per tag, evenly spread by reservoir sampling;
``--samples_per_plugin scalars=1000000`` keeps all of them in every tab, as ``tbmem report`` reads them;
``scalars=0`` would empty TensorBoard's own Scalars and Time Series charts).

Leak findings need only numpy (:func:`tbmem._internal.trend.detect_leaks_in_series`).
The summary table is ``tbmem report``'s own code, which needs pandas: without the
``analysis`` extra the panel shows the leaks and a line naming the extra to install.

Example:
    >>> import numpy as np
    >>> from tbmem._internal.plugin.findings import findings
    >>> from tbmem._internal.plugin.series import Series
    >>> steps = np.arange(0, 2000, 50)
    >>> s = Series(steps, 100.0 + 0.5 * steps, np.zeros(len(steps)))  # +500 MB per 1000 steps
    >>> doc = findings("r", {"Memory/Tensor_Category/activations_MB": s}, summary=False)
    >>> [f["tag"] for f in doc["leaks"]]
    ['Memory/Tensor_Category/activations_MB']
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from tbmem._internal.plugin.series import Series

__all__ = ["findings", "finite", "SUMMARY_PREFIXES"]

#: Tags the summary looks at (memory, speed, losses, the machine, the console monitors, snapshots).
SUMMARY_PREFIXES = ("Memory/", "Perf/", "Loss/", "System/", "Monitor/", "Snapshot/")


def finite(obj: Any) -> Any:
    """``obj`` with every NaN or infinite float replaced by None (strict JSON has neither)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def findings(run: str, series: Mapping[str, Series], *, summary: bool = True) -> dict[str, Any]:
    """Leak findings (flagged and watched) and, with pandas, the run summary of ``tbmem report``."""
    from tbmem._internal.trend import detect_leaks_in_series

    arrays = {t: (s.steps, s.values) for t, s in series.items()}
    found = detect_leaks_in_series(run, arrays, include_clean=True)
    doc: dict[str, Any] = {
        "leaks": [dict(f.to_dict(), evidence=f.describe()) for f in found if f.flagged],
        "watched": [f.to_dict() for f in found if not f.flagged],
        "summary": None, "summary_text": None, "summary_error": None,
    }
    if summary:
        try:
            doc.update(_summary(run, series))
        except ImportError:
            doc["summary_error"] = ("The run summary of `tbmem report` needs pandas: "
                                    "pip install 'tbmem[analysis]'. Leak findings above need only numpy.")
        except Exception as exc:  # noqa: BLE001 - a summary failure must not hide the leaks
            doc["summary_error"] = f"The run summary could not be computed: {type(exc).__name__}: {exc}"
    return finite(doc)


def _summary(run: str, series: Mapping[str, Series]) -> dict[str, Any]:
    from tbmem._internal._extras import require

    pd = require("pandas", extra="analysis")
    from tbmem._internal.analysis.load import NoTbmemTagsError
    from tbmem._internal.analysis.summary import summarize
    from tbmem._internal.analysis.table import format_leaks, format_table

    frames = [pd.DataFrame({"run": run, "tag": tag, "step": s.steps, "wall_time": s.wall_times,
                            "value": s.values})
              for tag, s in series.items() if tag.startswith(SUMMARY_PREFIXES) and len(s.steps)]
    if not frames:
        return {"summary_error": "This run has no tbmem memory tags (Memory/*) to summarise."}
    df = pd.concat(frames, ignore_index=True)
    try:
        (s,) = summarize(df, runs=[run])
    except NoTbmemTagsError as exc:
        return {"summary_error": str(exc)}
    return {"summary": s.to_dict(), "summary_text": format_table([s]) + "\n\n" + format_leaks([s])}
