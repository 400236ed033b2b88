"""The custom-scalars layout that puts tbmem's related charts side by side in TensorBoard.

Example:
    >>> from tbmem.layout import custom_scalars_layout
    >>> sorted(custom_scalars_layout())
    ['tbmem: RAM', 'tbmem: VRAM', 'tbmem: tensors']
"""

from __future__ import annotations

import re

from tbmem.tags import TAGS

__all__ = ["custom_scalars_layout"]


def _tags(*keys: str) -> list[str]:
    return [TAGS[k].tag for k in keys]


def _family(key: str) -> list[str]:
    """A regex matching every instance of a templated tag."""
    prefix, _, suffix = TAGS[key].tag.partition("{name}")
    return [f"{re.escape(prefix)}.*{re.escape(suffix)}"]


def custom_scalars_layout() -> dict[str, dict[str, list]]:
    """Category -> chart title -> ``["Multiline", [tags or regexes]]``."""
    return {
        "tbmem: VRAM": {
            "VRAM allocated / reserved / peaks (GB)": ["Multiline", _tags(
                "vram_allocated", "vram_reserved", "vram_peak_allocated", "vram_peak_reserved")],
            "Fragmentation (%)": ["Multiline", _tags("fragmentation", "vram_percent")],
            "Allocator pressure (count)": ["Multiline", _tags("vram_alloc_retries", "vram_ooms")],
        },
        "tbmem: RAM": {
            "Process RSS / peak / USS (GB)": ["Multiline", _tags("ram_rss", "ram_peak_rss", "ram_uss")],
            "System RAM (GB)": ["Multiline", _tags(
                "ram_system_used", "ram_system_available", "ram_swap_used")],
        },
        "tbmem: tensors": {
            "By category (MB)": ["Multiline", _family("census_category")],
            "By dtype (MB)": ["Multiline", _family("census_dtype")],
            "By module (MB)": ["Multiline", _family("census_module")],
            "Large tensors": ["Multiline", _tags("large_count", "large_total")],
        },
    }
