"""The analysis notebook's figures of memory readings and large tensors, each labelled and without
empty panels: a CPU run gets no VRAM axes, and every line of a chart is named in its legend.

Example:
    >>> import tempfile
    >>> from tbmem import MemoryWriter
    >>> from tbmem.analysis import load_scalars
    >>> from tbmem._internal.analysis.figures import plot_readings
    >>> logdir = tempfile.mkdtemp()
    >>> with MemoryWriter(f"{logdir}/cpu", custom_layout=False) as w:
    ...     for step in (0, 10):
    ...         w.write_scalars({"Memory/RAM/process_rss_GB": 0.3, "Memory/RAM/process_peak_rss_GB": 0.31}, step)
    >>> [ax.get_title() for ax in plot_readings(load_scalars(logdir)).axes]  # no VRAM panel on CPU
    ['cpu: RAM']
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from tbmem._internal._extras import require
from tbmem._internal.analysis.axes import fit_unit, legend_outside
from tbmem._internal.analysis.plot import plot_lines
from tbmem._internal.tags import TAGS

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["TREE_DIFFERS", "VRAM_LINES", "RAM_LINES", "plot_readings", "plot_large_tensors"]

#: The process tree's RSS gets its line when it is above the process's own by more than this share.
TREE_DIFFERS = 0.01
#: (label, tag) of the VRAM and RAM panels.
VRAM_LINES = (("allocated", TAGS["vram_allocated"].tag), ("peak allocated", TAGS["vram_peak_allocated"].tag),
              ("reserved", TAGS["vram_reserved"].tag), ("peak reserved", TAGS["vram_peak_reserved"].tag))
RAM_LINES = (("process RSS", TAGS["ram_rss"].tag), ("peak RSS", TAGS["ram_peak_rss"].tag),
             ("process USS", TAGS["ram_uss"].tag), ("process tree RSS", TAGS["ram_tree_rss"].tag))


def _has(df: "pd.DataFrame", run: str, tags: Sequence[tuple[str, str]]) -> bool:
    return bool(((df["run"] == run) & df["tag"].isin([t for _, t in tags])).any())


def _tree_differs(df: "pd.DataFrame", run: str) -> bool:
    """The process tree's RSS above the process's by more than 1% at some step (child processes hold
    memory); otherwise it is the RSS line again, drawn over it."""
    sel = df[df["run"] == run]
    tree = sel[sel["tag"] == TAGS["ram_tree_rss"].tag].set_index("step")["value"]
    rss = sel[sel["tag"] == TAGS["ram_rss"].tag].set_index("step")["value"]
    both = tree.to_frame("tree").join(rss.to_frame("rss"), how="inner")
    return bool((both["tree"] > both["rss"] * (1 + TREE_DIFFERS)).any())


def _draw(df: "pd.DataFrame", run: str, tags: Sequence[tuple[str, str]], ax: "Axes", what: str) -> None:
    if not _tree_differs(df, run):
        tags = [(label, tag) for label, tag in tags if tag != TAGS["ram_tree_rss"].tag]
    values = df[(df["run"] == run) & df["tag"].isin([t for _, t in tags])]["value"]
    unit, factor = fit_unit(float(values.max()) if len(values) else 0.0, "GB")
    plot_lines(df, run, tags, ax=ax, scale=factor)
    # from zero, as report.png: a few MiB of RSS moving must not look like a cliff
    ax.set_ylim(0, float(values.max()) * factor * 1.08 if len(values) else 1.0)
    ax.set(title=f"{run}: {what}", ylabel=unit)
    legend_outside(ax)


def plot_readings(df: "pd.DataFrame", runs: Sequence[str] | None = None) -> "Figure":
    """Per run, one row: VRAM and RAM side by side when the run has VRAM readings, else RAM alone across
    the row (a CPU run); each panel in the binary unit that fits it."""
    require("matplotlib", extra="analysis")
    from matplotlib.figure import Figure

    runs = list(runs) if runs is not None else sorted(df.loc[df["tag"].str.startswith("Memory/"), "run"].unique())
    rows: list[Any] = [[f"vram{i}", f"ram{i}"] if _has(df, run, VRAM_LINES) else [f"ram{i}", f"ram{i}"]
            for i, run in enumerate(runs)]
    fig = Figure(figsize=(13, 3.0 * max(len(runs), 1)), layout="constrained")
    if not runs:
        fig.subplots().text(0.5, 0.5, "no runs", ha="center", va="center")
        return fig
    axes = fig.subplot_mosaic(rows)
    for i, run in enumerate(runs):
        if f"vram{i}" in axes:
            _draw(df, run, VRAM_LINES, axes[f"vram{i}"], "VRAM")
        _draw(df, run, RAM_LINES, axes[f"ram{i}"], "RAM")
    return fig


def plot_large_tensors(df: "pd.DataFrame", run: str, *, ax: "Axes | None" = None) -> "Axes":
    """The large storages of ``run`` over steps: their total (left axis, in the unit that fits) and their
    count (right axis, steps), both named in one legend."""
    if ax is None:
        require("matplotlib", extra="analysis")
        from matplotlib.figure import Figure

        ax = Figure(figsize=(11, 3), layout="constrained").subplots()
    total_tag, count_tag = TAGS["large_total"].tag, TAGS["large_count"].tag
    totals = df[(df["run"] == run) & (df["tag"] == total_tag)]["value"]
    unit, factor = fit_unit(float(totals.max()) if len(totals) else 0.0, "MB")
    plot_lines(df, run, [(f"total ({unit}, left)", total_tag)], ax=ax, scale=factor, color="tab:red")
    count_ax = ax.twinx()
    plot_lines(df, run, [("count (right)", count_tag)], ax=count_ax, color="tab:gray", drawstyle="steps-post")
    ax.set(title=f"{run}: large tensors", ylabel=f"total ({unit})")
    count_ax.set_ylabel("count")
    count_ax.yaxis.get_major_locator().set_params(integer=True)  # type: ignore[call-arg]  # MaxNLocator's
    handles, labels = ax.get_legend_handles_labels()
    more, more_labels = count_ax.get_legend_handles_labels()
    # beside the chart, past the count axis's labels: never over a line
    ax.legend(handles + more, labels + more_labels, loc="upper left", bbox_to_anchor=(1.08, 1.0),
              borderaxespad=0.0, fontsize="small", frameon=False)
    return ax
