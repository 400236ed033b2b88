"""The custom-scalars layout that puts tbmem's related charts side by side in TensorBoard.

On rank 0 of a multi-rank job the layout also has a ``tbmem: ranks`` category: one margin
chart per aggregated reading (the mean as the line, min and max as the band around it)
and one chart of the ranks holding the maxima.

Example:
    >>> from tbmem.layout import custom_scalars_layout
    >>> sorted(custom_scalars_layout())
    ['tbmem: RAM', 'tbmem: VRAM', 'tbmem: tensors']
    >>> charts = custom_scalars_layout(rank_tags=("ram_rss",))["tbmem: ranks"]
    >>> charts["Process RSS across ranks (GB): mean, min..max"]
    ['Margin', ['Ranks/Memory/RAM/process_rss_GB/mean', 'Ranks/Memory/RAM/process_rss_GB/min', 'Ranks/Memory/RAM/process_rss_GB/max']]
"""

from __future__ import annotations

import re
from typing import Sequence

from tbmem.tags import TAGS, ranks_tag

__all__ = ["custom_scalars_layout", "rank_charts"]

# chart titles of the aggregated readings; others are titled by their tag
_TITLES = {
    "ram_rss": "Process RSS", "ram_tree_rss": "Process tree RSS", "ram_peak_rss": "Peak RSS",
    "vram_allocated": "VRAM allocated", "vram_reserved": "VRAM reserved",
    "vram_peak_allocated": "Peak VRAM allocated", "vram_peak_reserved": "Peak VRAM reserved",
    "step_time": "Step time",
}


def _tags(*keys: str) -> list[str]:
    return [TAGS[k].tag for k in keys]


def _family(key: str) -> list[str]:
    """A regex matching every instance of a templated tag."""
    prefix, _, suffix = TAGS[key].tag.partition("{name}")
    return [f"{re.escape(prefix)}.*{re.escape(suffix)}"]


def rank_charts(keys: Sequence[str]) -> dict[str, list]:
    """Margin charts (mean line, min..max band) of the aggregated readings, and their argmax."""
    charts: dict[str, list] = {}
    for key in keys:
        tag = TAGS[key]
        title = f"{_TITLES.get(key, tag.tag)} across ranks ({tag.unit}): mean, min..max"
        charts[title] = ["Margin", [ranks_tag("mean", tag.tag), ranks_tag("min", tag.tag),
                                    ranks_tag("max", tag.tag)]]
    if keys:
        charts["Rank holding the maximum"] = ["Multiline", [ranks_tag("argmax", TAGS[k].tag) for k in keys]]
        charts["Ranks reporting"] = ["Multiline", _tags("ranks_reporting")]
    return charts


def custom_scalars_layout(*, rank_tags: Sequence[str] = ()) -> dict[str, dict[str, list]]:
    """Category -> chart title -> ``["Multiline", [tags or regexes]]`` or ``["Margin", [value, lower, upper]]``.

    Args:
        rank_tags: Readings aggregated across ranks (rank 0 of a job): adds ``tbmem: ranks``.
    """
    layout: dict[str, dict[str, list]] = {
        "tbmem: VRAM": {
            "VRAM allocated / reserved / peaks (GB)": ["Multiline", _tags(
                "vram_allocated", "vram_reserved", "vram_peak_allocated", "vram_peak_reserved")],
            "Fragmentation (%)": ["Multiline", _tags("fragmentation", "vram_percent")],
            "Allocator pressure (count)": ["Multiline", _tags("vram_alloc_retries", "vram_ooms")],
        },
        "tbmem: RAM": {
            "Process RSS / peak / USS (GB)": ["Multiline", _tags("ram_rss", "ram_peak_rss", "ram_uss")],
            "Process vs process tree RSS (GB)": ["Multiline", _tags("ram_rss", "ram_tree_rss")],
            "System RAM (GB)": ["Multiline", _tags(
                "ram_system_used", "ram_system_available", "ram_swap_used")],
            "Processes in the tree (DataLoader workers)": ["Multiline", _tags("ram_tree_workers")],
        },
        "tbmem: tensors": {
            "By category (MB)": ["Multiline", _family("census_category")],
            "By dtype (MB)": ["Multiline", _family("census_dtype")],
            "By module (MB)": ["Multiline", _family("census_module")],
            "Large tensors": ["Multiline", _tags("large_count", "large_total")],
        },
    }
    if rank_tags:
        layout["tbmem: ranks"] = rank_charts(rank_tags)
    return layout
