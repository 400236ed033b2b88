"""Matplotlib figures of a logdir: memory timelines with the census categories stacked.

Each run gets the census stacked by category in one panel and the process and allocator
memory (RSS, VRAM) as lines in a second panel below it, on the same steps: the two are
different quantities (tensors the census found vs what the process holds) and never share
an axis. Legends sit to the right of the plots, never over them; each panel's unit fits its
values (KiB, MiB or GiB). A run with one record shows it as a bar and points.

Figures are built with ``matplotlib.figure.Figure`` (no pyplot, no global
state, no display needed), so the command line and tests can save them
anywhere; in a notebook, ``display(fig)`` or just ``fig`` shows them.

Example:
    >>> import tempfile
    >>> from tbmem import MemoryWriter
    >>> from tbmem.analysis import load_scalars, plot_timeline
    >>> logdir = tempfile.mkdtemp()
    >>> with MemoryWriter(logdir, custom_layout=False) as w:
    ...     for step in (0, 10, 20):
    ...         w.write_scalars({"Memory/Tensor_Category/parameters_MB": 4.0,
    ...                          "Memory/Tensor_Category/activations_MB": step / 10}, step)
    >>> fig = plot_timeline(load_scalars(logdir))
    >>> [ax.get_ylabel() for ax in fig.axes]
    ['census (MiB)']
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Sequence

from tbmem._internal.analysis.axes import figure, fit_unit, integer_steps, legend_outside, line_values
from tbmem._internal.analysis.summary import CATEGORIES, CATEGORY_PREFIX
from tbmem._internal.palette import stack_colors
from tbmem._internal.tags import TAGS

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

# legend_outside and fit_unit: tbmem._internal.analysis.axes's, here too (the notebook imports them from here)
__all__ = ["plot_timeline", "draw_run", "run_panels", "plot_stacked", "plot_lines", "wide", "PROCESS_TAGS",
           "legend_outside", "fit_unit"]

#: Process/allocator memory drawn as lines in the panel below the census (label, tag).
PROCESS_TAGS = (
    ("VRAM allocated", TAGS["vram_allocated"].tag),
    ("VRAM reserved", TAGS["vram_reserved"].tag),
    ("RAM RSS", TAGS["ram_rss"].tag),
)
#: Series with at most this many points get a marker at each point (sparse samples stay visible).
MARKERS_UP_TO = 60


def wide(df: "pd.DataFrame", run: str, prefix: str, suffix: str = "") -> "pd.DataFrame":
    """One run's tags starting with ``prefix`` as columns (names without prefix/suffix), steps as index."""
    sel = df[(df["run"] == run) & df["tag"].str.startswith(prefix) & df["tag"].str.endswith(suffix)]
    out = sel.pivot_table(index="step", columns="tag", values="value", aggfunc="last")
    out.columns = [c[len(prefix):len(c) - len(suffix)] for c in out.columns]
    return out.sort_index()


def plot_stacked(df: "pd.DataFrame", run: str, prefix: str = CATEGORY_PREFIX, *, suffix: str = "_MB",
                 ax: "Axes | None" = None, order: Sequence[str] = CATEGORIES, scale: float = 1.0) -> "Axes":
    """Stacked area of one run's ``prefix*suffix`` tags (census categories by default), values times
    ``scale``; a single record is drawn as one stacked bar."""
    ax = ax if ax is not None else figure(1)[1][0]
    data = wide(df, run, prefix, suffix).fillna(0.0) * scale
    cols = [c for c in order if c in data.columns] + sorted(set(data.columns) - set(order))
    # the Memory tab's colours (tbmem._internal.palette): a census category is the same colour everywhere
    colors = stack_colors(cols, categories=prefix == CATEGORY_PREFIX)
    if cols and len(data) == 1:
        step, bottom = data.index[0], 0.0
        for c, color in zip(cols, colors):
            ax.bar([step], [data[c].iloc[0]], bottom=[bottom], width=0.6, label=c, alpha=0.8, color=color)
            bottom += data[c].iloc[0]
    elif cols:
        ax.stackplot(data.index, *(data[c].to_numpy() for c in cols), labels=cols, alpha=0.8, step="post",
                     colors=colors)
    else:
        ax.text(0.5, 0.5, f"no {prefix}* tags", ha="center", va="center", transform=ax.transAxes)
    if cols:
        legend_outside(ax, reverse=True)
    if len(data) == 1:
        integer_steps(ax, list(data.index))
    ax.set_xlabel("step")
    ax.set_ylabel(suffix.strip("_") or "value")
    return ax


def plot_lines(df: "pd.DataFrame", run: str, tags: Sequence[tuple[str, str]], *, ax: "Axes | None" = None,
               scale: float = 1.0, **style: Any) -> "Axes":
    """Lines of one run's ``(label, tag)`` pairs (missing tags are skipped), values times ``scale``.

    Each series is drawn from its own points only, so a tag sampled every 50 steps is a line
    through its samples, not dots between gaps; sparse series get a marker at each point.
    """
    ax = ax if ax is not None else figure(1)[1][0]
    sel = df[df["run"] == run]
    steps: set[int] = set()
    for label, tag in tags:
        g = sel[sel["tag"] == tag].dropna(subset=["value"]).sort_values("step")
        if not g.empty:
            kwargs = dict(style)
            if len(g) <= MARKERS_UP_TO:
                kwargs.setdefault("marker", "o")
                kwargs.setdefault("markersize", 3)
            ax.plot(g["step"], g["value"] * scale, label=label, **kwargs)
            steps.update(int(s) for s in g["step"])
    if len(steps) == 1:
        integer_steps(ax, sorted(steps))
    ax.set_xlabel("step")
    return ax


def run_panels(df: "pd.DataFrame", run: str) -> int:
    """Panels :func:`draw_run` draws for ``run``: the census (if any) and the process/allocator lines."""
    sel = df[df["run"] == run]
    census = bool(sel["tag"].str.startswith(CATEGORY_PREFIX).any())
    lines = bool(sel["tag"].isin([t for _, t in PROCESS_TAGS]).any())
    return max(int(census) + int(lines), 1)


def plot_timeline(df: "pd.DataFrame", runs: Sequence[str] | None = None,
                  path: str | os.PathLike[str] | None = None, *, jobs: Sequence[Any] = (), root: str = "") -> "Figure":
    """Per run: the census categories stacked, and below it the VRAM and RSS lines, on the same steps.

    Args:
        df: From :func:`tbmem.analysis.load_scalars`.
        runs: Runs to draw (default: every run with ``Memory/*`` tags).
        path: Also save the figure there (the format follows the suffix, e.g. ``.png``).
        jobs: :class:`tbmem.analysis.RankJob` objects drawn after the runs, one panel each: the
            band of every rank's values per step (1,000 ranks do not fit as panels).
        root: The logdir's folder name, naming the job of rank folders right in it
            (:func:`tbmem._internal.analysis.ranks.job_name`).
    """
    if runs is None:
        runs = sorted(df.loc[df["tag"].str.startswith("Memory/"), "run"].unique())
    counts = [run_panels(df, run) for run in runs]
    fig, axes = figure(max(sum(counts) + len(jobs), 1))
    at = 0
    for run, n in zip(runs, counts):
        draw_run(df, run, axes[at:at + n])
        at += n
    if jobs:
        from tbmem._internal.analysis.ranks import plot_rank_job

        for ax, job in zip(axes[at:], jobs):
            plot_rank_job(df, job, ax=ax, root=root)
    if path is not None:
        fig.savefig(os.fspath(path), dpi=110)
    return fig


def draw_run(df: "pd.DataFrame", run: str, axes: "Sequence[Axes]") -> None:
    """One run on ``run_panels(df, run)`` axes: the census stacked in the first (when the run has
    a census), the process and allocator lines in the next; titled with the run's name."""
    sel = df[df["run"] == run]
    axes = list(axes)
    first = axes[0]
    if sel["tag"].str.startswith(CATEGORY_PREFIX).any():
        unit, factor = fit_unit(wide(df, run, CATEGORY_PREFIX, "_MB").fillna(0).sum(axis=1).max(), "MB")
        plot_stacked(df, run, ax=axes.pop(0), scale=factor)
        first.set_ylabel(f"census ({unit})")
        first.set_title(f"{run}: tensors found by the census, by category", fontsize="medium")
    if axes:
        ax = axes[0]
        present = sel[sel["tag"].isin([t for _, t in PROCESS_TAGS])]["value"]
        unit, factor = fit_unit(present.max() if len(present) else 0.0, "GB")
        plot_lines(df, run, PROCESS_TAGS, ax=ax, scale=factor, linewidth=1.5)
        if not ax.get_lines():
            ax.text(0.5, 0.5, "no VRAM or RSS readings", ha="center", va="center", transform=ax.transAxes)
        # from zero: a 1 MB wiggle of RSS must not look like a cliff
        ax.set_ylim(0, max(line_values(ax), default=0.0) * 1.08 or 1.0)
        ax.set_ylabel(f"process ({unit})")
        legend_outside(ax)
        title = "process and allocator memory (RSS, VRAM)"
        if ax is first:
            ax.set_title(f"{run}: {title}", fontsize="medium")
        else:
            ax.set_title(f"{run}: {title}", fontsize="medium")
            ax.sharex(first)
    steps = sorted(sel["step"].unique())
    for ax in [first] + axes:
        integer_steps(ax, steps)
