"""The first markdown table of a text entry (the census table) as columns and rows, for trackers' tables.

Cells keep their text (``\\|`` unescaped, the code marks around a name removed); a cell that is a
number becomes a float, so a tracker can sort and chart it.

Example:
    >>> from tbmem.sinks.tables import markdown_table
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


def _value(cell: str) -> float | str:
    if len(cell) >= 2 and cell[0] == cell[-1] == "`":
        return cell[1:-1]
    try:
        return float(cell)
    except ValueError:
        return cell


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
                rows.append([_value(c) for c in _cells(line)])
            return columns, rows
    return None
