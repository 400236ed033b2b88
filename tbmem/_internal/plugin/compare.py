"""The Memory tab's compare view: ``tbmem compare``'s rows for runs TensorBoard holds, and their memory on
shared axes.

The rows are :func:`tbmem._internal.analysis.compare.compare`'s (the command line's own code, which needs pandas:
without the ``analysis`` extra the view says which extra to install), computed from the scalars the
data provider holds for the runs (by default TensorBoard keeps 1000 records per tag, evenly spread;
``--samples_per_plugin scalars=1000000`` keeps every one in every tab, as ``tbmem compare`` reads them;
``scalars=0`` would empty TensorBoard's own Scalars and Time Series charts). The lines are each
run's RSS (allocated VRAM when every run has it), in bytes, on the step axis, or with runs of different
lengths on the share of each run's steps, thinned to the chart's width.

Example:
    >>> import numpy as np
    >>> from tbmem._internal.plugin.compare import shared_lines
    >>> from tbmem._internal.plugin.series import Series
    >>> rss = "Memory/RAM/process_rss_GB"
    >>> runs = {"a": {rss: Series(np.array([0, 10]), np.array([1.0, 2.0]), np.zeros(2))},
    ...         "b": {rss: Series(np.array([0, 5, 20]), np.array([1.0, 1.0, 1.5]), np.zeros(3))}}
    >>> doc = shared_lines(runs, phase=True, points=100)
    >>> doc["tag"], doc["runs"]["b"]["x"], doc["runs"]["a"]["y"][1] / 2**30
    ('Memory/RAM/process_rss_GB', [0.0, 25.0, 100.0], 2.0)
"""

from __future__ import annotations

from typing import Any, Mapping


from tbmem._internal.plugin.findings import finite
from tbmem._internal.plugin.series import Series, minmax_indices
from tbmem._internal.tags import TAGS

__all__ = ["comparison", "shared_lines", "ALIGNS", "MAX_RUNS"]

#: How runs are aligned (tbmem._internal.analysis.compare.ALIGNS; importing it would import pandas).
ALIGNS = ("auto", "step", "phase")
#: Runs one view compares at most.
MAX_RUNS = 8
_GIB = float(2**30)


def shared_lines(per_run: Mapping[str, Mapping[str, Series]], *, phase: bool, points: int) -> dict[str, Any]:
    """Each run's memory line on one x axis (steps, or percent of the run's records when ``phase``)."""
    vram, rss = TAGS["vram_allocated"].tag, TAGS["ram_rss"].tag
    tag = vram if per_run and all(vram in s for s in per_run.values()) else rss
    out: dict[str, Any] = {}
    for run, series in per_run.items():
        s = series.get(tag)
        if s is None or not len(s.steps):
            continue
        memory = [x.steps for t, x in series.items() if t.startswith("Memory/") and len(x.steps)]
        first = int(min(m[0] for m in memory))
        last = int(max(m[-1] for m in memory))
        keep = minmax_indices(s.steps, s.values, points)
        steps = s.steps[keep].astype(float)
        x = 100.0 * (steps - first) / (last - first) if phase and last > first else (steps * 0 if phase else steps)
        out[run] = {"x": x.tolist(), "y": (s.values[keep] * _GIB).tolist()}
    return {"tag": tag, "axis": "share of the run (%)" if phase else "step", "runs": out}


def comparison(per_run: Mapping[str, Mapping[str, Series]], *, align: str, points: int) -> dict[str, Any]:
    """The compare view's document: ``comparison`` (the rows) and ``lines``, or ``error`` saying why not."""
    try:
        from tbmem._internal._extras import require

        pd = require("pandas", extra="analysis")
        from tbmem._internal.analysis.compare import compare
    except ImportError:
        return {"error": "Comparing runs uses the code of `tbmem compare`, which needs pandas: "
                         "pip install 'tbmem[analysis]'."}
    frames = [pd.DataFrame({"run": run, "tag": tag, "step": s.steps, "wall_time": s.wall_times, "value": s.values})
              for run, series in per_run.items() for tag, s in series.items() if len(s.steps)]
    if not frames:
        return {"error": "None of these runs has tbmem memory tags (Memory/*)."}
    try:
        result = compare(pd.concat(frames, ignore_index=True), list(per_run), align=align)
    except Exception as exc:  # noqa: BLE001 - said in the view, never a failed request
        return {"error": f"These runs cannot be compared: {exc}"}
    lines = shared_lines({r: per_run[r] for r in result.runs}, phase=result.align == "phase", points=points)
    return finite({"comparison": result.to_dict(), "lines": lines})
