"""Plain-text tables of :class:`~tbmem.analysis.summary.RunSummary` objects for the console.

One column per run, one row per metric; with two runs and ``compare=True`` a
third column holds the difference (second minus first). Missing values are ``n/a``.

Example:
    >>> from tbmem.analysis.summary import RunSummary
    >>> a = RunSummary(run="a", first_step=0, last_step=90, records=10, peak_rss_gb=1.0)
    >>> b = RunSummary(run="b", first_step=0, last_step=90, records=10, peak_rss_gb=1.25)
    >>> print(format_table([a, b], compare=True).splitlines()[6])
    peak RAM RSS (GB)         1.000  1.250      +0.250
"""

from __future__ import annotations

from typing import Callable, Sequence

from tbmem.analysis.summary import CATEGORIES, RunSummary

__all__ = ["format_table", "format_leaks"]

_Getter = Callable[[RunSummary], "float | str | None"]


def _num(value: float | str | None, digits: int = 3) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, str):
        return value
    return f"{value:.{digits}f}"


def _rows(summaries: Sequence[RunSummary]) -> list[tuple[str, _Getter, int]]:
    rows: list[tuple[str, _Getter, int]] = [
        ("steps", lambda s: f"{s.first_step}..{s.last_step}", 0),
        ("records", lambda s: f"{s.records}", 0),
        ("peak VRAM allocated (GB)", lambda s: s.peak_allocated_gb, 3),
        ("peak VRAM reserved (GB)", lambda s: s.peak_reserved_gb, 3),
        ("peak RAM RSS (GB)", lambda s: s.peak_rss_gb, 3),
        ("peak process tree RSS (GB)", lambda s: s.peak_tree_rss_gb, 3),
        ("max fragmentation (%)", lambda s: s.max_fragmentation_percent, 1),
        ("census peak step", lambda s: None if s.census_peak_step is None else f"{s.census_peak_step}", 0),
        ("census total (MB)", lambda s: s.census_peak_total_mb, 2),
    ]
    seen = {c for s in summaries for c in s.category_mb_at_peak}
    for cat in [c for c in CATEGORIES if c in seen] + sorted(seen - set(CATEGORIES)):
        rows.append((f"  {cat} (MB)", lambda s, c=cat: s.category_mb_at_peak.get(c), 2))
    for stat in ("mean", "p95", "max"):
        rows.append((f"step time {stat} (ms)", lambda s, k=stat: (s.step_time_ms or {}).get(k), 1))
    for tag in sorted({t for s in summaries for t in s.last_loss}):
        rows.append((f"last {tag}", lambda s, t=tag: s.last_loss.get(t), 4))
    rows.append(("leaks flagged", lambda s: f"{len(s.leaks)}" if s.leaks else "none", 0))
    return rows


def format_table(summaries: Sequence[RunSummary], *, compare: bool = False) -> str:
    """The summaries side by side; ``compare=True`` (two runs) adds a difference column."""
    if compare and len(summaries) != 2:
        raise ValueError(f"compare needs exactly two runs, got {len(summaries)}")
    header = ["metric"] + [s.run for s in summaries] + (["diff (B-A)"] if compare else [])
    body: list[list[str]] = []
    for label, get, digits in _rows(summaries):
        values = [get(s) for s in summaries]
        cells = [label] + [_num(v, digits) for v in values]
        if compare:
            a, b = values
            both = isinstance(a, (int, float)) and isinstance(b, (int, float))
            cells.append(f"{b - a:+.{digits}f}" if both else "")  # type: ignore[operator]
        body.append(cells)
    widths = [max(len(r[i]) for r in [header] + body) for i in range(len(header))]
    lines = []
    for r in [header, ["-" * w for w in widths]] + body:
        lines.append("  ".join([r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:])]))
    return "\n".join(line.rstrip() for line in lines)


def format_leaks(summaries: Sequence[RunSummary]) -> str:
    """One evidence line per flagged tag, or a line saying none was found."""
    lines = [f.describe() for s in summaries for f in s.leaks]
    if not lines:
        return "No leak found: no memory tag grows steadily above its threshold."
    return "LEAKS:\n" + "\n".join(f"  {line}" for line in lines)
