"""Plain-text tables of :class:`~tbmem.analysis.RunSummary` objects for the console.

One column per run, one row per metric; with two runs and ``compare=True`` a
third column holds the difference (second minus first). Missing values are ``n/a``. Given a
width (``tbmem report`` passes the terminal's), long run names break after their ``/`` and,
when that is not enough, the runs come a few at a time in tables one under the other.
Each value is shown in the unit that fits it, with three or four significant digits:
``12.3 KiB`` of gradients, ``374 MiB`` of RSS, ``35.3 ms`` per step, a loss of ``6.556e-14``
(binary units: 1 MiB = 2**20 bytes, as the tags' MB).

Example:
    >>> from tbmem._internal.analysis.summary import RunSummary
    >>> a = RunSummary(run="a", first_step=0, last_step=90, records=10, peak_rss_gb=1.0)
    >>> b = RunSummary(run="b", first_step=0, last_step=90, records=10, peak_rss_gb=1.25)
    >>> print(format_table([a, b], compare=True).splitlines()[6])
    peak RAM RSS                1.00 GiB  1.25 GiB    +256 MiB
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

from tbmem._internal.analysis.summary import CATEGORIES, RunSummary

__all__ = ["format_table", "format_leaks", "format_bytes", "format_ms", "format_value"]

_Getter = Callable[[RunSummary], "float | str | None"]
_GiB, _MiB = float(2**30), float(2**20)


def format_bytes(n: float) -> str:
    """Binary units with three significant digits, sign kept: ``0 B``, ``12.3 KiB``, ``1.99 MiB``, ``374 MiB``.

    Example:
        >>> format_bytes(12_600), format_bytes(2_086_666), format_bytes(-2**28)
        ('12.3 KiB', '1.99 MiB', '-256 MiB')
    """
    sign, size = ("-" if n < 0 else ""), abs(float(n))
    if size < 1024:
        return f"{sign}{size:.0f} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        size /= 1024
        if size < 1024 or unit == "TiB":
            break
    digits = 2 if size < 10 else 1 if size < 100 else 0
    return f"{sign}{size:.{digits}f} {unit}"


def format_ms(ms: float) -> str:
    """A duration given in milliseconds: ``0.052 ms``, ``35.3 ms``, ``1.25 s``.

    Example:
        >>> format_ms(35.31), format_ms(0.0523), format_ms(1250.0)
        ('35.3 ms', '0.0523 ms', '1.25 s')
    """
    if abs(ms) >= 1000:
        return f"{ms / 1000:.3g} s"
    return f"{ms:.3g} ms"


def format_value(value: float | str | None, kind: str) -> str:
    """One cell: ``kind`` is ``gb``/``mb`` (memory in the tags' units), ``ms``, ``pct``, ``g`` or ``text``."""
    if value is None:
        return "n/a"
    if isinstance(value, str) or kind == "text":
        return str(value)
    if not math.isfinite(value):
        return str(value)
    if kind in ("gb", "mb"):
        return format_bytes(value * (_GiB if kind == "gb" else _MiB))
    if kind == "ms":
        return format_ms(value)
    if kind == "pct":
        return f"{value:.1f}%"
    return f"{value:.4g}"


def _diff(a: float, b: float, kind: str) -> str:
    d = b - a
    text = format_value(d, kind)
    return text if text.startswith("-") else f"+{text}"


def _census_cost(s: RunSummary) -> str | None:
    """``6.4 ms median, 0.9%``: the median census and the share of the run's step time the censuses took."""
    cost = s.census_cost
    if not cost:
        return None
    share = f", {cost['percent']:.2g}%" if "percent" in cost else ""  # of the run (docs/analysis.md): narrow
    return f"{format_ms(cost['median_ms'])} median{share}"


def _category_getter(category: str) -> _Getter:
    return lambda s: s.category_mb_at_peak.get(category)


def _step_time_getter(stat: str) -> _Getter:
    return lambda s: (s.step_time_ms or {}).get(stat)


def _loss_getter(tag: str) -> _Getter:
    return lambda s: s.last_loss.get(tag)


def _rows(summaries: Sequence[RunSummary]) -> list[tuple[str, _Getter, str]]:
    rows: list[tuple[str, _Getter, str]] = [
        ("steps", lambda s: f"{s.first_step}..{s.last_step}", "text"),
        ("records", lambda s: f"{s.records}", "text"),
        ("peak VRAM allocated", lambda s: s.peak_allocated_gb, "gb"),
        ("peak VRAM reserved", lambda s: s.peak_reserved_gb, "gb"),
        ("peak RAM RSS", lambda s: s.peak_rss_gb, "gb"),
        ("peak process tree RSS", lambda s: s.peak_tree_rss_gb, "gb"),
        ("max fragmentation", lambda s: s.max_fragmentation_percent, "pct"),
        ("census peak step", lambda s: None if s.census_peak_step is None else f"{s.census_peak_step}", "text"),
        ("census total", lambda s: s.census_peak_total_mb, "mb"),
    ]
    seen = {c for s in summaries for c in s.category_mb_at_peak}
    for cat in [c for c in CATEGORIES if c in seen] + sorted(seen - set(CATEGORIES)):
        rows.append((f"  {cat}", _category_getter(cat), "mb"))
    for stat in ("mean", "p95", "max"):
        rows.append((f"step time {stat}", _step_time_getter(stat), "ms"))
    rows.append(("census cost", _census_cost, "text"))
    for tag in sorted({t for s in summaries for t in s.last_loss}):
        rows.append((f"last {tag}", _loss_getter(tag), "g"))
    rows.append(("leaks flagged", lambda s: f"{len(s.leaks)}" if s.leaks else "none", "text"))
    return rows


def format_table(summaries: Sequence[RunSummary], *, compare: bool = False, width: int | None = None) -> str:
    """The summaries side by side; ``compare=True`` (two runs) adds a difference column.

    Args:
        width: Fit this many columns (a terminal's width): run names are broken after their ``/``
            over several header lines, and when that is not enough the runs are shown a few at a
            time, in tables one under the other. None: one table, however wide.
    """
    if compare and len(summaries) != 2:
        raise ValueError(f"compare needs exactly two runs, got {len(summaries)}")
    header = ["metric"] + [s.run for s in summaries] + (["diff (B-A)"] if compare else [])
    body: list[list[str]] = []
    for label, get, kind in _rows(summaries):
        values = [get(s) for s in summaries]
        cells = [label] + [format_value(v, kind) for v in values]
        if compare:
            a, b = values
            both = isinstance(a, (int, float)) and isinstance(b, (int, float))
            cells.append(_diff(a, b, kind) if both else "")  # type: ignore[arg-type]
        body.append(cells)
    return _fit(header, body, width, keep_together=compare)


def _render(headers: list[list[str]], body: list[list[str]]) -> list[str]:
    """One table: ``headers`` are its header lines (a long run name over several), then a rule, the body."""
    rows = headers + body
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for r in headers + [["-" * w for w in widths]] + body:
        lines.append("  ".join([r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:])]))
    return [line.rstrip() for line in lines]


def _broken(name: str) -> list[str]:
    """A run name broken after each ``/`` (``exp/2026-11-26_00-35-02`` -> ``exp/``, ``2026-...``)."""
    parts = name.split("/")
    return [p + "/" for p in parts[:-1]] + [parts[-1]]


def _header_lines(header: list[str], broken: bool) -> list[list[str]]:
    if not broken:
        return [header]
    cols = [[h] if i == 0 else _broken(h) for i, h in enumerate(header)]
    depth = max(len(c) for c in cols)
    cols = [[""] * (depth - len(c)) + c for c in cols]  # bottom-aligned over the values
    return [[c[i] for c in cols] for i in range(depth)]


def _fit(header: list[str], body: list[list[str]], width: int | None, *, keep_together: bool) -> str:
    """The table in ``width`` columns (see :func:`format_table`)."""
    def wide(lines: list[str]) -> int:
        return max(len(line) for line in lines)

    whole = _render([header], body)
    if width is None or wide(whole) <= width:
        return "\n".join(whole)
    broken = _render(_header_lines(header, True), body)
    if wide(broken) <= width or keep_together or len(header) <= 2:
        return "\n".join(broken)
    blocks: list[list[int]] = [[]]
    for col in range(1, len(header)):  # as many runs per table as fit, at least one
        trial = blocks[-1] + [col]
        lines = _render(_header_lines([header[i] for i in [0] + trial], True), [[r[i] for i in [0] + trial] for r in body])
        if blocks[-1] and wide(lines) > width:
            blocks.append([col])
        else:
            blocks[-1] = trial
    tables = ["\n".join(_render(_header_lines([header[i] for i in [0] + b], True), [[r[i] for i in [0] + b] for r in body]))
              for b in blocks]
    return "\n\n".join(tables)


def format_leaks(summaries: Sequence[RunSummary]) -> str:
    """One evidence line per flagged tag, or a line saying none was found."""
    lines = [f.describe() for s in summaries for f in s.leaks]
    if not lines:
        return "No leak found: no memory tag grows steadily above its threshold."
    return "LEAKS:\n" + "\n".join(f"  {line}" for line in lines)
