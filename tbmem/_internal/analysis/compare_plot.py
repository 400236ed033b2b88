"""The figure of ``tbmem compare --png``: runs on shared axes.

Three panels: the runs' process memory (RSS, and allocated VRAM dashed on CUDA runs) over the run,
their census by category at the aligned points (a stacked bar per run and point, in the census
colours of :mod:`tbmem._internal.palette`), and their step times. With ``align="step"`` the x axis is the
step; with ``"phase"`` it is the share of each run's steps (0% its first record, 100% its last),
so runs of different lengths share it. Each run keeps one colour (:data:`tbmem._internal.palette.RUNS`).

Example:
    >>> import tempfile
    >>> from tbmem import MemoryWriter
    >>> from tbmem.analysis import load_scalars
    >>> from tbmem._internal.analysis.compare import compare
    >>> from tbmem._internal.analysis.compare_plot import plot_comparison
    >>> logdir = tempfile.mkdtemp()
    >>> for run, n in (("short", 3), ("long", 9)):
    ...     with MemoryWriter(f"{logdir}/{run}", custom_layout=False) as w:
    ...         for step in range(n):
    ...             w.write_scalars({"Memory/RAM/process_rss_GB": 0.5, "Perf/step_time_ms": 2.0}, step)
    >>> df = load_scalars(logdir)
    >>> fig = plot_comparison(df, compare(df))
    >>> [ax.get_xlabel() for ax in fig.axes]
    ['share of the run (%)', 'share of the run (%)']
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from tbmem._internal.analysis.axes import figure, fit_unit, legend_outside, line_values
from tbmem._internal.analysis.summary import CATEGORIES, CATEGORY_PREFIX
from tbmem._internal.palette import RUNS, category_color
from tbmem._internal.tags import TAGS

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd
    from matplotlib.figure import Figure

__all__ = ["plot_comparison"]

_MEMORY = (("RSS", TAGS["ram_rss"].tag, "-"), ("VRAM allocated", TAGS["vram_allocated"].tag, "--"))


def _x(g: "pd.DataFrame", first: int, last: int, phase: bool) -> Any:
    steps = g["step"].to_numpy(dtype=float)
    if not phase:
        return steps
    return 100.0 * (steps - first) / (last - first) if last > first else steps * 0.0


def plot_comparison(df: "pd.DataFrame", comparison: Any, path: str | os.PathLike[str] | None = None) -> "Figure":
    """The runs of ``comparison`` (from :func:`tbmem.analysis.compare` of ``df``) on shared axes."""
    runs, labels = comparison.runs, comparison.labels
    phase = comparison.align == "phase"
    has_census = bool(comparison.points)
    fig, axes = figure(2 + int(has_census))
    ax_mem, ax_time = axes[0], axes[-1]
    xlabel = "share of the run (%)" if phase else "step"
    memory = df[df["tag"].isin([t for _, t, _ in _MEMORY]) & df["run"].isin(runs)]["value"]
    unit, factor = fit_unit(memory.max() if len(memory) else 0.0, "GB")
    for i, (run, lab) in enumerate(zip(runs, labels)):
        sel = df[df["run"] == run]
        steps = sel.loc[sel["tag"].str.startswith("Memory/"), "step"]
        first, last = int(steps.min()), int(steps.max())
        color = RUNS[i % len(RUNS)]
        for what, tag, style in _MEMORY:
            g = sel[sel["tag"] == tag].sort_values("step")
            if not g.empty:
                ax_mem.plot(_x(g, first, last, phase), g["value"] * factor, style, color=color, linewidth=1.5,
                            marker="o" if len(g) <= 12 else None, markersize=3, label=f"{lab}: {what}")
        g = sel[sel["tag"] == TAGS["step_time"].tag].sort_values("step")
        if not g.empty:
            ax_time.plot(_x(g, first, last, phase), g["value"], color=color, linewidth=1.2,
                         marker="o" if len(g) <= 12 else None, markersize=3, label=f"{lab}")
    ax_mem.set(title="process memory over the run", xlabel=xlabel, ylabel=unit)
    ax_mem.set_ylim(0, max(line_values(ax_mem), default=0.0) * 1.08 or 1)
    legend_outside(ax_mem)
    ax_time.set(title="step time (mean per step since the previous record)", xlabel=xlabel, ylabel="ms")
    times = [y for y in line_values(ax_time) if y > 0]
    if times and max(times) / min(times) > 100:
        ax_time.set_yscale("log")
    legend_outside(ax_time)
    if has_census:
        _census_bars(axes[1], df, comparison)
    fig.suptitle("   ".join(f"{lab} = {run}" for lab, run in zip(labels, runs)), fontsize="small")
    if path is not None:
        fig.savefig(os.fspath(path), dpi=110)
    return fig


def _census_bars(ax: Any, df: "pd.DataFrame", comparison: Any) -> None:
    runs, labels = comparison.runs, comparison.labels
    width = 0.8 / len(runs)
    cats = sorted({str(t)[len(CATEGORY_PREFIX):-3] for t in df["tag"].unique()
                   if str(t).startswith(CATEGORY_PREFIX) and str(t).endswith("_MB")},
                  key=lambda c: (CATEGORIES.index(c) if c in CATEGORIES else len(CATEGORIES), c))
    values = {}
    for p in comparison.points:
        for run in runs:
            step = p["steps"].get(run)
            if step is None:
                continue
            sel = df[(df["run"] == run) & (df["step"] == step)]
            values[(p["name"], run)] = {c: float(sel.loc[sel["tag"] == f"{CATEGORY_PREFIX}{c}_MB", "value"].sum())
                                        for c in cats}
    largest = max((sum(v.values()) for v in values.values()), default=0.0)
    unit, factor = fit_unit(largest, "MB")
    ticks, names = [], []
    seen: set[str] = set()
    for i, p in enumerate(comparison.points):
        for j, (run, lab) in enumerate(zip(runs, labels)):
            x = i + (j - (len(runs) - 1) / 2) * width
            v = values.get((p["name"], run))
            ticks.append(x)
            names.append(lab if v is not None else f"{lab}\n(none)")
            if v is None:
                continue
            bottom = 0.0
            for c in cats:
                ax.bar([x], [v[c] * factor], bottom=[bottom], width=width * 0.9, color=category_color(c),
                       label=c if c not in seen else None)
                seen.add(c)
                bottom += v[c] * factor
    ax.set_xticks(ticks, names, fontsize="small")
    for i, p in enumerate(comparison.points):
        steps = ", ".join(f"{lab} {p['steps'][r]}" for r, lab in zip(runs, labels) if p["steps"].get(r) is not None)
        ax.text(i, 1.02, f"{p['name']} (step {steps})", transform=ax.get_xaxis_transform(), ha="center",
                fontsize="small")
    ax.set(ylabel=f"census ({unit})")
    ax.set_title("census by category at the aligned points", pad=16)
    handles, labs = ax.get_legend_handles_labels()
    order = sorted(range(len(labs)), key=lambda k: cats.index(labs[k]), reverse=True)
    ax.legend([handles[k] for k in order], [labs[k] for k in order], loc="upper left", bbox_to_anchor=(1.01, 1.0),
              fontsize="small", frameon=False)
