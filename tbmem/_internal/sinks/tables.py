"""The first markdown table of a text entry (the census table) as columns and rows, for trackers' tables.

Cells keep their text (``\\|`` unescaped, the code marks around a name removed); a column whose
every cell is a number holds floats, so a tracker can sort and chart it (a shape such as ``64``
in a column of ``64x32`` stays text: one type per column).

Example:
    >>> from tbmem._internal.sinks.tables import markdown_table
    >>> markdown_table("totals\\n\\n| # | name | MB |\\n|---|---|---|\\n| 1 | `model.w` | 2.500 |")
    (['#', 'name', 'MB'], [[1.0, 'model.w', 2.5]])
    >>> markdown_table("no table") is None
    True
"""

from __future__ import annotations

import re

__all__ = ["markdown_table"]

_SPLIT = re.compile(r"(?<!\\)\|")
_RULE = re.compile(r"^\|(\s*:?-+:?\s*\|)+\s*$")


def _cells(line: str) -> list[str]:
    parts = _SPLIT.split(line.strip())[1:-1]
    return [p.strip().replace("\\|", "|") for p in parts]


def _text(cell: str) -> str:
    return cell[1:-1] if len(cell) >= 2 and cell[0] == cell[-1] == "`" else cell


def _number(cell: str) -> float | None:
    try:
        return float(cell)
    except ValueError:
        return None


def _columns_typed(rows: list[list[str]]) -> list[list[float | str]]:
    """A column whose every cell is a number holds floats (one type per column, as trackers want)."""
    width = max((len(r) for r in rows), default=0)
    numeric = [all(i < len(r) and _number(r[i]) is not None for r in rows) for i in range(width)]
    return [[float(c) if numeric[i] else _text(c) for i, c in enumerate(r)] for r in rows]


def markdown_table(text: str) -> tuple[list[str], list[list[float | str]]] | None:
    """``(columns, rows)`` of the first table in ``text``; None when it has none."""
    lines = text.splitlines()
    for i in range(len(lines) - 1):
        if lines[i].lstrip().startswith("|") and _RULE.match(lines[i + 1].strip()):
            columns = _cells(lines[i])
            rows = []
            for line in lines[i + 2:]:
                if not line.lstrip().startswith("|"):
                    break
                rows.append(_cells(line))
            return columns, _columns_typed(rows)
    return None
