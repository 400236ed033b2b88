"""Matplotlib helpers every figure of the analysis shares: a binary unit that fits, the legend
beside the plot, a figure of stacked panels, integer step ticks.

Below :mod:`tbmem._internal.analysis.plot`, :mod:`tbmem._internal.analysis.figures`, :mod:`tbmem._internal.analysis.loss` and
:mod:`tbmem._internal.analysis.ranks`, which all draw with them.

Example:
    >>> from tbmem._internal.analysis.axes import fit_unit
    >>> fit_unit(0.374, "GB")
    ('MiB', 1024.0)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from tbmem._internal._extras import require

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["fit_unit", "legend_outside", "figure", "integer_steps", "line_values"]

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def fit_unit(largest: float, unit: str) -> tuple[str, float]:
    """The binary unit that shows ``largest`` (in ``unit``: ``MB``/``GB``/...) as 1..1023, and the factor.

    Example:
        >>> fit_unit(0.374, "GB"), fit_unit(0.0084, "MB"), fit_unit(3.0, "GB")
        (('MiB', 1024.0), ('KiB', 1024.0), ('GiB', 1.0))
    """
    index = {"B": 0, "KB": 1, "MB": 2, "GB": 3, "TB": 4}[unit]
    factor = 1.0
    value = abs(largest)
    while value and value < 1 and index > 0:
        value, factor, index = value * 1024, factor * 1024, index - 1
    while value >= 1024 and index < len(_UNITS) - 1:
        value, factor, index = value / 1024, factor / 1024, index + 1
    return _UNITS[index], factor


def legend_outside(ax: "Axes", *, reverse: bool = False, **kwargs: Any) -> None:
    """The legend to the right of the plot, where it cannot hide data."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        if reverse:  # a stack: the legend's top entry is the stack's top layer
            handles, labels = handles[::-1], labels[::-1]
        ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0,
                  fontsize="small", frameon=False, **kwargs)


def figure(panels: int) -> tuple["Figure", list["Axes"]]:
    """A figure of ``panels`` axes stacked vertically, 11 inches wide."""
    require("matplotlib", extra="analysis")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 2.6 * panels + 0.4), layout="constrained")
    axes = fig.subplots(panels, 1, squeeze=False)[:, 0]
    return fig, list(axes)


def line_values(ax: "Axes") -> list[float]:
    """Every y value of the lines drawn on ``ax``, as floats (NaN kept: callers drop what they must).

    Matplotlib types ``get_ydata()`` as any array-like; the lines tbmem draws hold numbers only.
    """
    import numpy as np

    return [float(y) for line in ax.get_lines() for y in np.asarray(line.get_ydata(), dtype=float)]


def integer_steps(ax: "Axes", steps: Sequence[int]) -> None:
    """Integer step ticks; one record gets a window around it."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if len(steps) == 1:  # one record: a window around it, not matplotlib's -0.04..0.04
        ax.set_xlim(steps[0] - 1, steps[0] + 1)
