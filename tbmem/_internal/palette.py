"""The colours of tbmem's pictures, defined once: the Memory tab (injected into its page by the plugin)
and ``tbmem report --png`` / the notebook's figures take them from here, so a category has one colour
wherever it is drawn.

Census categories keep Tableau 10's colours in the census's order; other stacks (by dtype, device,
module) cycle through :data:`SERIES`; memory lines (RSS, VRAM) over or under a stack use :data:`LINES`,
losses drawn on the memory chart's step axis :data:`LOSSES`, and runs side by side (``tbmem compare``, the
Memory tab's compare view) :data:`RUNS`.

Example:
    >>> from tbmem._internal.palette import category_color, stack_colors
    >>> category_color("parameters")
    '#4e79a7'
    >>> stack_colors(["gradients", "float32"], categories=False)
    ['#4e79a7', '#f28e2b']
    >>> stack_colors(["gradients", "mystery"])
    ['#f28e2b', '#b07aa1']
"""

from __future__ import annotations

from typing import Any, Iterable

__all__ = ["CATEGORY_COLORS", "SERIES", "LINES", "LOSSES", "RUNS", "MARKS", "category_color", "stack_colors",
           "as_json"]

#: Census category -> colour (Tableau 10, in the census's category order).
CATEGORY_COLORS: dict[str, str] = {
    "parameters": "#4e79a7",
    "gradients": "#f28e2b",
    "optimizer_state": "#e15759",
    "buffers": "#76b7b2",
    "activations": "#59a14f",
    "other": "#edc948",
    "unattributed": "#bab0ac",
}
#: Colours of the members of any other stack (dtypes, devices, modules), in turn.
SERIES: tuple[str, ...] = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1",
                           "#ff9da7", "#9c755f", "#bab0ac", "#86bcb6", "#d37295")
#: Memory lines drawn with a stack: the first (RSS, VRAM allocated) darkest.
LINES: tuple[str, ...] = ("#222222", "#7b3294", "#c51b7d", "#1b7837")
#: Losses drawn in a panel under the memory lines, in turn.
LOSSES: tuple[str, ...] = ("#b35806", "#542788", "#1b7837")
#: Runs compared side by side, in turn (dark enough to read as lines; none is a category's colour).
RUNS: tuple[str, ...] = ("#222222", "#e7298a", "#1b9e77", "#7570b3", "#d95f02", "#66a61e")
#: Step marks: a snapshot, an out-of-memory error, a loss spike, the selected step.
MARKS: dict[str, str] = {"snapshot": "#7b3294", "oom": "#d7191c", "spike": "#e66101", "selected": "#000000"}
# categories not in CATEGORY_COLORS take the series colours that no category uses
_SPARE = tuple(c for c in SERIES if c not in CATEGORY_COLORS.values())


def category_color(name: str, index: int = 0) -> str:
    """The colour of census category ``name``; an unknown one gets a spare colour by ``index``."""
    return CATEGORY_COLORS.get(name) or _SPARE[index % len(_SPARE)]


def stack_colors(names: Iterable[str], *, categories: bool = True) -> list[str]:
    """Colours of a stack's members in order: by category (``categories``), else :data:`SERIES` in turn."""
    out, spare = [], 0
    for i, name in enumerate(names):
        if categories:
            out.append(category_color(name, spare))
            spare += name not in CATEGORY_COLORS
        else:
            out.append(SERIES[i % len(SERIES)])
    return out


def as_json() -> dict[str, Any]:
    """Everything above as one JSON object (what the Memory tab's page is given)."""
    return {"categories": dict(CATEGORY_COLORS), "series": list(SERIES), "lines": list(LINES),
            "losses": list(LOSSES), "runs": list(RUNS), "marks": dict(MARKS)}
