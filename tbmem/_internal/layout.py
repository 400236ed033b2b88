"""TensorBoard's custom-scalars layout for what a run actually logs: tbmem's charts grouped by topic.

The layout is built from the tags the run has written (:class:`LayoutTracker`, fed by
the writer's TensorBoard sink, :mod:`tbmem._internal.sinks.tensorboard`) and written again whenever a new kind of reading appears
(the census at its first step, VRAM once CUDA is in use, ...); TensorBoard shows a run's
latest layout. So a CPU run gets no VRAM section and no chart is empty.

Every chart has one unit, named in its title. TensorBoard draws every line of a run in the
run's colour in custom-scalars charts (lines of one chart differ only by marker), so a
chart shows one reading; a family with more than :data:`MAX_SEPARATE` members (a model's
modules) shares one chart, titled so.

Unsmoothed where TensorBoard allows: the custom-scalars dashboard smooths its ``Multiline`` charts
(weight 0.6 by default: a memory step drawn as a ramp, a count read as 20.9983) but never its
``Margin`` charts. So each one-reading chart is a ``Margin`` chart whose line and band are that
reading (value, lower and upper the same tag: a line, exact at every step). Only a chart that
matches several tags by a regex (a family sharing one chart) stays ``Multiline``, in a section of
its own; the dashboard's Smoothing setting (or ``#custom_scalars&_smoothingWeight=0`` in its
address) unsmooths it. The dashboard draws a section's ``Multiline`` charts first, then its
``Margin`` charts in the reverse of their written order: :func:`display_order` writes them so that
they are shown in :func:`custom_scalars_layout`'s order.

Sections, in order: memory (VRAM, then the process's RSS, then the census), speed, GPU
allocator, system, snapshots, and on rank 0 of a multi-rank job, ranks (one margin chart per
aggregated reading: the mean as the line, min..max as the band). TensorBoard merges the layouts
of a logdir's runs in run order, a later run's new charts after the first run's in their section.

Example:
    >>> from tbmem._internal.layout import custom_scalars_layout
    >>> cpu = custom_scalars_layout(["Memory/RAM/process_rss_GB", "Memory/RAM/process_peak_rss_GB",
    ...                              "Perf/step_time_ms"])
    >>> list(cpu)
    ['tbmem: memory', 'tbmem: speed']
    >>> cpu["tbmem: memory"]["Process RSS (GB)"]
    ['Margin', ['Memory/RAM/process_rss_GB', 'Memory/RAM/process_rss_GB', 'Memory/RAM/process_rss_GB']]
    >>> charts = custom_scalars_layout(rank_tags=("ram_rss",))["tbmem: ranks"]
    >>> charts["Process RSS across ranks (GB): mean, min..max"]
    ['Margin', ['Ranks/Memory/RAM/process_rss_GB/mean', 'Ranks/Memory/RAM/process_rss_GB/min', 'Ranks/Memory/RAM/process_rss_GB/max']]
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Mapping, Sequence

from tbmem._internal.tags import TAGS, ranks_tag

__all__ = ["custom_scalars_layout", "display_order", "rank_charts", "LayoutTracker", "MAX_SEPARATE"]

#: Members of a family (dtypes, devices, modules) drawn as one chart each; more share one chart.
MAX_SEPARATE = 4

# chart titles of the aggregated readings; others are titled by their tag
_TITLES = {
    "ram_rss": "Process RSS", "ram_tree_rss": "Process tree RSS", "ram_peak_rss": "Peak RSS",
    "vram_allocated": "VRAM allocated", "vram_reserved": "VRAM reserved",
    "vram_peak_allocated": "Peak VRAM allocated", "vram_peak_reserved": "Peak VRAM reserved",
    "step_time": "Step time",
}
# tbmem._internal.census.CATEGORIES (not imported: the census package imports torch)
_CATEGORY_ORDER = ("parameters", "gradients", "optimizer_state", "buffers", "activations", "other")
_FAMILIES = ("census_category", "census_dtype", "census_device", "census_module")
_BY = {"census_category": "category", "census_dtype": "dtype", "census_device": "device",
       "census_module": "module"}


def _line(tag: str) -> list[Any]:
    """A chart of one tag, drawn unsmoothed: a margin chart whose band is the line itself."""
    return ["Margin", [tag, tag, tag]]


def _single(key: str) -> list[Any]:
    return _line(TAGS[key].tag)


def rank_charts(keys: Sequence[str]) -> dict[str, list]:
    """Margin charts (mean line, min..max band) of the aggregated readings, and their argmax."""
    charts: dict[str, list] = {}
    for key in keys:
        tag = TAGS[key]
        title = f"{_TITLES.get(key, tag.tag)} across ranks ({tag.unit}): mean, min..max"
        charts[title] = ["Margin", [ranks_tag("mean", tag.tag), ranks_tag("min", tag.tag),
                                    ranks_tag("max", tag.tag)]]
    for key in keys:
        tag = TAGS[key]
        charts[f"Rank holding the maximum {_TITLES.get(key, tag.tag)} (rank)"] = _line(ranks_tag("argmax", tag.tag))
    if keys:
        charts["Ranks reporting (count)"] = _line(TAGS["ranks_reporting"].tag)
    return charts


class _Seen:
    """Which keys (and which members of the families) a set of tags covers."""

    def __init__(self, tags: Iterable[str] | None) -> None:
        self.all = tags is None
        self.keys: set[str] = set()
        self.members: dict[str, set[str]] = {k: set() for k in _FAMILIES}
        self.ranked: list[str] = []
        if tags is not None:
            by_tag = {t.tag: k for k, t in TAGS.items() if "{name}" not in t.tag}
            ranked = set()
            for tag in tags:
                key = by_tag.get(tag)
                if key is not None:
                    self.keys.add(key)
                    continue
                for family in _FAMILIES:
                    prefix, _, suffix = TAGS[family].tag.partition("{name}")
                    if tag.startswith(prefix) and tag.endswith(suffix) and len(tag) > len(prefix) + len(suffix):
                        self.members[family].add(tag[len(prefix):len(tag) - len(suffix)])
                        break
                else:
                    if tag.startswith("Ranks/") and tag.endswith("/mean"):
                        ranked.add(tag[len("Ranks/"):-len("/mean")])
            self.ranked = [k for k, t in TAGS.items() if t.tag in ranked]

    def has(self, key: str) -> bool:
        return self.all or key in self.keys

    def family(self, key: str) -> list[str] | None:
        """Members seen (None: every member, drawn by one regex)."""
        return None if self.all else sorted(self.members[key])


def _charts(seen: _Seen, specs: Sequence[tuple[str, ...]]) -> dict[str, list]:
    """``(title, key)`` -> a one-reading chart of ``key`` if the run wrote it; ``(title, key, shown_if)``
    when another reading decides whether the chart is shown."""
    return {title: _single(key) for title, key, *shown_if in specs if seen.has(shown_if[0] if shown_if else key)}


def _family_charts(seen: _Seen, family: str) -> dict[str, list]:
    tag = TAGS[family]
    members = seen.family(family)
    by = _BY[family]
    if family == "census_category":  # six at most, always one chart each, in the census's priority order
        members = [c for c in _CATEGORY_ORDER if c in members] + sorted(set(members) - set(_CATEGORY_ORDER)) \
            if members is not None else list(_CATEGORY_ORDER)
    if members is not None and (len(members) <= MAX_SEPARATE or family == "census_category"):
        label = "Census" if family == "census_category" else f"Census by {by}"
        return {f"{label}: {name} ({tag.unit})": _line(tag.tag.format(name=name)) for name in members}
    prefix, _, suffix = tag.tag.partition("{name}")
    title = f"Census by {by} ({tag.unit}; one line per {by}, told apart by marker)"
    return {title: ["Multiline", [f"^{re.escape(prefix)}.*{re.escape(suffix)}$"]]}


def custom_scalars_layout(tags: Iterable[str] | None = None, *, rank_tags: Sequence[str] = ()
                          ) -> dict[str, dict[str, list]]:
    """Category -> chart title -> ``["Multiline", [regexes]]`` or ``["Margin", [value, lower, upper]]``.

    Args:
        tags: The tags the run has written; only their charts are in the layout. None: every
            chart tbmem can draw.
        rank_tags: Readings aggregated across ranks whose charts are added (as if their
            ``Ranks/<tag>/mean`` had been written).
    """
    seen = _Seen(tags)
    gpu = _charts(seen, [
        ("VRAM allocated (GB)", "vram_allocated"),
        ("VRAM reserved by the caching allocator (GB)", "vram_reserved"),
        ("Peak VRAM allocated since the previous record (GB)", "vram_peak_allocated"),
        ("Peak VRAM reserved since the previous record (GB)", "vram_peak_reserved"),
        ("VRAM reserved, of the device's memory (%)", "vram_percent"),
        ("Device memory used, as nvidia-smi reports it (GB)", "vram_nvml_used"),
        ("Out-of-memory errors since start (count)", "vram_ooms"),
    ])
    process = _charts(seen, [
        ("Process RSS (GB)", "ram_rss"),
        ("Peak RSS since the previous record (GB)", "ram_peak_rss"),
        ("Process USS: freed if the process ended (GB)", "ram_uss"),
        ("RSS of the process and its DataLoader workers (GB)", "ram_tree_rss", "ram_tree_workers"),
        ("Processes below the training process (count)", "ram_tree_workers"),
    ])
    tensors: dict[str, list] = {}
    for family in _FAMILIES[:1]:
        tensors.update(_family_charts(seen, family))
    tensors.update(_charts(seen, [
        ("Census: unattributed on the device (MB)", "census_unattributed"),
        ("Census total (MB)", "census_total"),
        ("Large tensors (count)", "large_count"),
        ("Large tensors, total (MB)", "large_total"),
    ]))
    shared: dict[str, list] = {}  # a family on one chart: several lines, smoothed by the dashboard
    for family in _FAMILIES[1:]:
        for title, chart in _family_charts(seen, family).items():
            (shared if chart[0] == "Multiline" else tensors)[title] = chart
    speed = _charts(seen, [
        ("Step time, mean since the previous record (ms)", "step_time"),
        ("Batch time (s)", "batch_time"),
        ("Epoch time (s)", "epoch_time"),
        ("Process CPU use, 100 = one core (%)", "cpu_percent"),
        ("Census duration (ms)", "census_duration"),
    ])
    allocator = _charts(seen, [
        ("Fragmentation: reserved memory not holding tensors (%)", "fragmentation"),
        ("cudaMalloc retries after flushing the cache, since start (count)", "vram_alloc_retries"),
        ("Active blocks (GB)", "vram_active"),
        ("Inactive, non-releasable split blocks (GB)", "vram_inactive_split"),
    ])
    system = _charts(seen, [
        ("System RAM used (GB)", "ram_system_used"),
        ("System RAM available (GB)", "ram_system_available"),
        ("System RAM used (%)", "ram_system_percent"),
        ("Swap used (GB)", "ram_swap_used"),
        ("Device memory free (GB)", "vram_free"),
        ("Device memory total (GB)", "vram_total"),
    ])
    snapshots = _charts(seen, [
        ("Events in the snapshot (count)", "snapshot_events"),
        ("Snapshot file size (MB)", "snapshot_size"),
    ])
    # One memory category: TensorBoard merges the layouts of a logdir's runs in run order, appending
    # what a later run adds at the end of its category; the census of a later run still lands in
    # the memory category, above speed and system.
    layout = {"tbmem: memory": {**gpu, **process, **tensors}, "tbmem: census, one chart per family": shared,
              "tbmem: speed": speed,
              "tbmem: GPU allocator": allocator, "tbmem: system": system, "tbmem: snapshots": snapshots}
    ranked = list(dict.fromkeys([*rank_tags, *seen.ranked]))
    if ranked:
        layout["tbmem: ranks"] = rank_charts(ranked)
    return {title: charts for title, charts in layout.items() if charts}


def display_order(layout: Mapping[str, Mapping[str, list]]) -> dict[str, dict[str, list]]:
    """``layout`` as written for TensorBoard's custom-scalars dashboard, which draws a section's
    ``Multiline`` charts first, in order, then its ``Margin`` charts in reverse order (TensorBoard
    2.21, checked in headless Chromium by tests/test_layout.py): the margin charts are written
    reversed, so each section reads in ``layout``'s order.

    Example:
        >>> display_order({"s": {"a": ["Margin", ["a"] * 3], "b": ["Margin", ["b"] * 3]}})["s"].keys()
        dict_keys(['b', 'a'])
    """
    out = {}
    for section, charts in layout.items():
        margins = [(title, chart) for title, chart in charts.items() if chart[0] == "Margin"]
        out[section] = {**{t: c for t, c in charts.items() if c[0] != "Margin"}, **dict(reversed(margins))}
    return out


class LayoutTracker:
    """Follows the tags a writer writes; says when the layout must be written (again), and gives it in
    :func:`display_order`.

    Example:
        >>> tracker = LayoutTracker()
        >>> sorted(tracker.see({"Memory/RAM/process_rss_GB": 0.4}))
        ['tbmem: memory']
        >>> tracker.see({"Memory/RAM/process_rss_GB": 0.5}) is None  # nothing new: nothing to write
        True
    """

    def __init__(self) -> None:
        self._seen: set[str] = set()  # every tag met, so an event with nothing new costs a few lookups
        self._present: set[str] = set()  # the tags the layout is built from
        self._written: dict[str, dict[str, list]] | None = None
        self._workers = TAGS["ram_tree_workers"].tag

    def see(self, values: Mapping[str, float]) -> dict[str, dict[str, list]] | None:
        """Note the tags of one event; return the new layout when it changed, else None."""
        workers = self._workers
        # the process tree's charts only once there is a tree: without workers its RSS is the process's
        tree_appears = workers not in self._present and values.get(workers, 0) > 0
        if not tree_appears and self._seen.issuperset(values):  # every event after the first few
            return None
        new = [t for t in values if t not in self._seen]
        if not new and not tree_appears:
            return None
        self._seen.update(new)
        self._present.update(t for t in new if t != workers)
        if tree_appears:
            self._present.add(workers)
        layout = custom_scalars_layout(self._present)
        if not layout or layout == self._written:
            return None
        self._written = layout
        return display_order(layout)
