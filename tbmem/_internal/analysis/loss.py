"""Memory next to the loss: per-step losses over the memory lines, per-epoch losses on their own axis.

A training run logs some losses per step (``Loss/batch``, ``Loss/evaluation``) and others per
epoch (``Loss/train``, ``Loss/val``: step 7 there is epoch 7, not training step 7); the tag
table says which (:func:`tbmem._internal.tags.x_axis`). Per-step series share the memory panel's x axis;
per-epoch series get a panel of their own, labelled ``epoch``. Each series is drawn through its
own samples, so one sampled every 10 steps is a line, not isolated dots between gaps.

Example:
    >>> import tempfile
    >>> from tbmem import MemoryWriter
    >>> from tbmem.analysis import load_scalars
    >>> from tbmem._internal.analysis.loss import plot_loss_and_memory
    >>> logdir = tempfile.mkdtemp()
    >>> with MemoryWriter(f"{logdir}/run", custom_layout=False) as w:
    ...     for step in range(20):
    ...         w.write_scalars({"Loss/batch": 1 / (step + 1), "Memory/RAM/process_rss_GB": 0.5}, step)
    ...     for epoch in range(2):
    ...         w.write_scalars({"Loss/train": 0.5 - epoch / 10}, epoch)
    >>> fig, spikes = plot_loss_and_memory(load_scalars(logdir), "run")
    >>> [ax.get_xlabel() for ax in fig.axes]
    ['step', 'step', 'epoch']
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from tbmem._internal.analysis.axes import figure, fit_unit, integer_steps, legend_outside, line_values
from tbmem._internal.analysis.plot import plot_lines
from tbmem._internal.tags import TAGS, is_loss_tag, x_axis

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["plot_loss_and_memory", "memory_spikes", "MEMORY_LINES"]

#: Memory drawn under the per-step losses (label, tag); the first one a run has is checked for spikes.
MEMORY_LINES = (("VRAM allocated", TAGS["vram_allocated"].tag), ("RSS", TAGS["ram_rss"].tag))


def memory_spikes(series: "pd.Series") -> list[int]:
    """Steps where memory jumps: five median absolute deviations above the typical change, and at
    least 2% of the level."""
    jumps = series.sort_index().diff().abs().dropna()
    if jumps.empty:
        return []
    mad = (jumps - jumps.median()).abs().median()
    floor = max(jumps.median() + 5 * mad, 0.02 * series.abs().median())
    return [int(s) for s in jumps[jumps > floor].index]


def plot_loss_and_memory(df: "pd.DataFrame", run: str, *, max_marks: int = 20,
                         memory: Sequence[tuple[str, str]] = MEMORY_LINES,
                         loss_tags: Sequence[str] | None = None) -> tuple["Figure", list[int]]:
    """The loss and memory of one run, with memory spikes marked as dotted lines on the step panels.

    ``loss_tags``: the patterns of the run's loss tags (:func:`tbmem.analysis.run_loss_tags`); None: the
    built-in ones (``loss_tags`` in tbmem/_internal/tags.py).

    Returns:
        The figure (panels: per-step losses if any, memory per step, per-epoch losses if any) and
        the steps marked as spikes (at most ``max_marks``).
    """
    sel = df[df["run"] == run]
    losses = sorted(t for t in sel["tag"].unique() if is_loss_tag(t, loss_tags))
    per_step = [(t.removeprefix("Loss/"), t) for t in losses if x_axis(t) == "step"]
    per_epoch = [(t.removeprefix("Loss/"), t) for t in losses if x_axis(t) == "epoch"]
    mem = [(label, tag) for label, tag in memory if (sel["tag"] == tag).any()]
    fig, axes = figure(int(bool(per_step)) + 1 + int(bool(per_epoch)))
    at = 0
    step_axes = []
    if per_step:
        ax = axes[at]
        plot_lines(df, run, per_step, ax=ax)
        ax.set(title=f"{run}: loss per step", ylabel="loss")
        _log_if_wide(ax)
        legend_outside(ax)
        step_axes.append(ax)
        at += 1
    ax_mem = axes[at]
    values = sel[sel["tag"].isin([t for _, t in mem])]["value"]
    unit, factor = fit_unit(values.max() if len(values) else 0.0, "GB")
    plot_lines(df, run, mem, ax=ax_mem, scale=factor)
    ax_mem.set(title=f"{run}: memory per step", ylabel=unit)
    if not mem:
        ax_mem.text(0.5, 0.5, "no VRAM or RSS readings", ha="center", va="center", transform=ax_mem.transAxes)
    legend_outside(ax_mem)
    if step_axes:
        ax_mem.sharex(step_axes[0])
    step_axes.append(ax_mem)
    if per_epoch:
        ax_epoch = axes[at + 1]
        plot_lines(df, run, per_epoch, ax=ax_epoch)
        ax_epoch.set(title=f"{run}: loss per epoch", xlabel="epoch", ylabel="loss")
        _log_if_wide(ax_epoch)
        legend_outside(ax_epoch)
    steps = sorted(sel.loc[sel["tag"].isin([t for _, t in per_step + mem]), "step"].unique())
    for ax in step_axes:
        integer_steps(ax, steps)
    if per_epoch:
        integer_steps(ax_epoch, sorted(sel.loc[sel["tag"].isin([t for _, t in per_epoch]), "step"].unique()))
    marks: list[int] = []
    if mem:
        g = sel[sel["tag"] == mem[0][1]]
        marks = memory_spikes(g.set_index("step")["value"])[:max_marks]
        for step in marks:
            for ax in step_axes:
                ax.axvline(step, color="tab:red", linestyle=":", linewidth=1)
    return fig, marks


def _log_if_wide(ax: "Axes") -> None:
    """A log scale for positive losses spanning more than two decades (a falling loss stays readable)."""
    ys = [y for y in line_values(ax) if y == y]
    if ys and min(ys) > 0 and max(ys) / min(ys) > 100:
        ax.set_yscale("log")
