"""Matplotlib figures of a logdir: memory timelines with the census categories stacked.

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
    >>> len(fig.axes) >= 1
    True
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Sequence

from tbmem._extras import require
from tbmem.analysis.summary import CATEGORIES, CATEGORY_PREFIX

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["plot_timeline", "draw_run", "plot_stacked", "plot_lines", "wide", "PROCESS_TAGS"]

#: Process/allocator memory drawn as lines over the stacked census (label, tag).
PROCESS_TAGS = (
    ("VRAM allocated", "Memory/vram_allocated_GB"),
    ("VRAM reserved", "Memory/vram_reserved_GB"),
    ("RAM RSS", "Memory/RAM/process_rss_GB"),
)


def wide(df: "pd.DataFrame", run: str, prefix: str, suffix: str = "") -> "pd.DataFrame":
    """One run's tags starting with ``prefix`` as columns (names without prefix/suffix), steps as index."""
    sel = df[(df["run"] == run) & df["tag"].str.startswith(prefix) & df["tag"].str.endswith(suffix)]
    out = sel.pivot_table(index="step", columns="tag", values="value", aggfunc="last")
    out.columns = [c[len(prefix):len(c) - len(suffix)] for c in out.columns]
    return out.sort_index()


def plot_stacked(df: "pd.DataFrame", run: str, prefix: str = CATEGORY_PREFIX, *, suffix: str = "_MB",
                 ax: "Axes | None" = None, order: Sequence[str] = CATEGORIES) -> "Axes":
    """Stacked area of one run's ``prefix*suffix`` tags (census categories by default)."""
    ax = ax if ax is not None else _figure(1)[1][0]
    data = wide(df, run, prefix, suffix).fillna(0.0)
    cols = [c for c in order if c in data.columns] + sorted(set(data.columns) - set(order))
    if cols:
        ax.stackplot(data.index, *(data[c].to_numpy() for c in cols), labels=cols, alpha=0.8, step="post")
        ax.legend(loc="upper left", fontsize="small")
    else:
        ax.text(0.5, 0.5, f"no {prefix}* tags", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("step")
    ax.set_ylabel(suffix.strip("_") or "value")
    return ax


def plot_lines(df: "pd.DataFrame", run: str, tags: Sequence[tuple[str, str]], *, ax: "Axes | None" = None,
               scale: float = 1.0, **style: Any) -> "Axes":
    """Lines of one run's ``(label, tag)`` pairs (missing tags are skipped), values times ``scale``."""
    ax = ax if ax is not None else _figure(1)[1][0]
    sel = df[df["run"] == run]
    for label, tag in tags:
        g = sel[sel["tag"] == tag]
        if not g.empty:
            ax.plot(g["step"], g["value"] * scale, label=label, **style)
    ax.set_xlabel("step")
    return ax


def _figure(panels: int) -> tuple["Figure", list["Axes"]]:
    require("matplotlib", extra="analysis")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 3.2 * panels), layout="constrained")
    axes = fig.subplots(panels, 1, squeeze=False)[:, 0]
    return fig, list(axes)


def plot_timeline(df: "pd.DataFrame", runs: Sequence[str] | None = None,
                  path: str | os.PathLike[str] | None = None, *, jobs: Sequence[Any] = ()) -> "Figure":
    """One panel per run: census categories stacked (MB, left axis), VRAM and RSS lines (GB, right).

    Args:
        df: From :func:`tbmem.analysis.load_scalars`.
        runs: Runs to draw (default: every run with ``Memory/*`` tags).
        path: Also save the figure there (the format follows the suffix, e.g. ``.png``).
        jobs: :class:`tbmem.analysis.ranks.RankJob` objects drawn after the runs, one panel each: the
            band of every rank's values per step (1,000 ranks do not fit as panels).
    """
    if runs is None:
        runs = sorted(df.loc[df["tag"].str.startswith("Memory/"), "run"].unique())
    fig, axes = _figure(max(len(runs) + len(jobs), 1))
    for ax, run in zip(axes, runs):
        draw_run(df, run, ax)
    if jobs:
        from tbmem.analysis.ranks import plot_rank_job

        for ax, job in zip(axes[len(runs):], jobs):
            plot_rank_job(df, job, ax=ax)
    if path is not None:
        fig.savefig(os.fspath(path), dpi=110)
    return fig


def draw_run(df: "pd.DataFrame", run: str, ax: "Axes") -> None:
    """One run's panel: the census stacked (left axis) under the VRAM and RSS lines (right axis)."""
    has_census = df[(df["run"] == run) & df["tag"].str.startswith(CATEGORY_PREFIX)].shape[0] > 0
    if has_census:
        plot_stacked(df, run, ax=ax)
        ax.set_ylabel("census (MB)")
        right = ax.twinx()
    else:
        right = ax
    plot_lines(df, run, PROCESS_TAGS, ax=right, linewidth=1.5)
    right.set_ylabel("process / allocator (GB)")
    # From zero (a 1 MB wiggle of RSS must not look like a cliff), up to the highest point drawn:
    # set_ylim(bottom=0) alone freezes an autoscaled top that can clip the lines.
    tops = [max(line.get_ydata(), default=0) for line in right.get_lines()]
    right.set_ylim(0, max(tops, default=0) * 1.08 or 1.0)
    if right.get_lines():
        right.legend(loc="upper right", fontsize="small")
    ax.set_title(run)
    ax.set_xlabel("step")
