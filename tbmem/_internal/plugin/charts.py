"""What the Memory tab draws and shows: the census stacked over steps, reading lines, a step's record.

All memory values leave the server in bytes (tbmem's tags are in binary MB and GB), so the
page formats every number the same way.

Example:
    >>> from tbmem._internal.plugin.charts import tag_unit, breakdown_tags
    >>> tag_unit("Memory/RAM/process_rss_GB"), tag_unit("Memory/Tensor_DType/float32_MB")
    ('GB', 'MB')
    >>> breakdown_tags(["Memory/Tensor_Category/parameters_MB", "Memory/RAM/process_rss_GB"], "category")
    {'Memory/Tensor_Category/parameters_MB': 'parameters'}
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from tbmem._internal.plugin.series import Series, align, minmax_indices
from tbmem._internal.tags import TAGS, is_loss_tag, x_axis

__all__ = ["BREAKDOWNS", "LINE_GROUPS", "TREE_DIFFERS", "tag_unit", "to_bytes", "breakdown_tags", "census_tags",
           "overview", "tree_differs", "record_at", "census_from_scalars", "nearest", "is_step_loss"]

#: Breakdown name -> the tag-table key of its templated tag.
BREAKDOWNS = {"category": "census_category", "dtype": "census_dtype", "device": "census_device",
              "module": "census_module"}
#: The census's category order (tbmem._internal.census.CATEGORIES; importing it would import torch).
_CATEGORY_ORDER = ("parameters", "gradients", "optimizer_state", "buffers", "activations", "other",
                   "unattributed")
#: Reading lines drawn in the panel under the stack: device memory when the run has it, else host memory.
LINE_GROUPS = {
    "device": (("vram_allocated", "VRAM allocated"), ("vram_reserved", "VRAM reserved"),
               ("vram_peak_allocated", "VRAM peak allocated")),
    "host": (("ram_rss", "RSS"), ("ram_peak_rss", "peak RSS"), ("ram_tree_rss", "process tree RSS (with workers)")),
}
#: The process tree's RSS is drawn when it is above the process's own by more than this share somewhere
#: (DataLoader workers); without child processes it is the same line.
TREE_DIFFERS = 0.01
_UNIT_BYTES = {"GB": float(2**30), "MB": float(2**20)}
_CENSUS_PREFIXES = ("Memory/Tensor_Category/", "Memory/Tensor_DType/", "Memory/Tensor_Device/",
                    "Memory/Tensor_Module/", "Memory/Tensor_Census/", "Memory/Large_Tensors/")
_TEMPLATES = [(re.compile("^" + re.escape(t.tag).replace(r"\{name\}", ".+") + "$"), t.unit)
              for t in TAGS.values()]


def tag_unit(tag: str) -> str:
    """The unit of a tag, from tbmem's tag table or else its ``_GB``/``_MB``/``_ms`` suffix."""
    for pattern, unit in _TEMPLATES:
        if pattern.match(tag):
            return unit
    m = re.search(r"_(GB|MB|ms|s|percent)$", tag)
    return {"percent": "%"}.get(m.group(1), m.group(1)) if m else ""


def to_bytes(tag: str, values: Any) -> Any:
    """Values of a GB or MB tag in bytes (other units unchanged)."""
    return values * _UNIT_BYTES.get(tag_unit(tag), 1.0)


def breakdown_tags(tags: Iterable[str], breakdown: str) -> dict[str, str]:
    """tag -> name (``parameters``, ``float32``, ...) of the census tags of one breakdown."""
    prefix, _, suffix = TAGS[BREAKDOWNS[breakdown]].tag.partition("{name}")
    out = {t: t[len(prefix):-len(suffix)] for t in tags if t.startswith(prefix) and t.endswith(suffix)}
    if breakdown == "category":
        order = {c: i for i, c in enumerate(_CATEGORY_ORDER)}
        return dict(sorted(out.items(), key=lambda kv: (order.get(kv[1], len(order)), kv[1])))
    return dict(sorted(out.items(), key=lambda kv: kv[1]))


def is_step_loss(tag: str, patterns: Sequence[str] | None = None) -> bool:
    """A loss logged per training step or loss evaluation (``Loss/batch``, ``Loss/evaluation``, a framework's
    ``train/loss`` or ``train_loss``, one of the run's loss ``patterns``: :func:`tbmem._internal.tags.is_loss_tag`): drawn
    on the memory chart's step axis. Per-epoch and per-iteration losses count something else
    (:func:`tbmem._internal.tags.x_axis`)."""
    return is_loss_tag(tag, patterns) and x_axis(tag) == "step"


def census_tags(tags: Iterable[str]) -> list[str]:
    """The tags a census writes."""
    return [t for t in tags if t.startswith(_CENSUS_PREFIXES)]


def nearest(steps: np.ndarray, step: int) -> int | None:
    """The element of sorted ``steps`` closest to ``step`` (the earlier one on a tie)."""
    if len(steps) == 0:
        return None
    i = int(np.searchsorted(steps, step))
    cands = [steps[j] for j in (i - 1, i) if 0 <= j < len(steps)]
    return int(min(cands, key=lambda s: (abs(int(s) - step), s)))


def _census_matrix(series: Mapping[str, Series], names: Mapping[str, str]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    steps = np.unique(np.concatenate([series[t].steps for t in names])) if names else np.zeros(0, np.int64)
    cols = {}
    for tag in names:
        col = np.zeros(len(steps))  # a dtype/device/module absent from a census held 0 bytes there
        s = series[tag]
        col[np.searchsorted(steps, s.steps)] = to_bytes(tag, s.values)
        cols[tag] = col
    return steps, cols


def overview(series: Mapping[str, Series], *, breakdown: str, points: int,
             all_tags: Iterable[str], loss_patterns: Sequence[str] | None = None) -> dict[str, Any]:
    """The chart: the breakdown's census stacked, the reading lines, thinned to ``points`` buckets; the losses
    are the tags of the run's ``loss_patterns`` (:func:`tbmem._internal.tags.loss_tags`; None: the built-in ones)."""
    all_tags = list(all_tags)
    names = breakdown_tags([t for t in series], breakdown)
    census_steps, cols = _census_matrix(series, names)
    columns: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    if len(census_steps):
        total = np.sum(list(cols.values()), axis=0)
        keep = minmax_indices(census_steps, total, points)
        for tag, col in cols.items():
            columns[tag] = (census_steps[keep], col[keep])
    lines: dict[str, list[dict[str, str]]] = {}
    drawn: dict[str, int] = {}
    for group, members in LINE_GROUPS.items():
        for key, label in members:
            tag = TAGS[key].tag
            s = series.get(tag)
            if s is None or not len(s.steps):
                continue
            if key == "ram_tree_rss" and not tree_differs(series):
                continue
            keep = minmax_indices(s.steps, s.values, points)
            columns[tag] = (s.steps[keep], to_bytes(tag, s.values[keep]))
            lines.setdefault(group, []).append({"tag": tag, "label": label})
            drawn[tag] = len(s.steps)
    losses = []
    for tag in sorted(t for t in series if is_step_loss(t, loss_patterns)):
        s = series[tag]
        if len(s.steps):
            keep = minmax_indices(s.steps, s.values, points)
            columns[tag] = (s.steps[keep], s.values[keep])
            losses.append({"tag": tag, "label": tag})
    x, aligned = align(columns)
    return {
        "breakdown": breakdown,
        "breakdowns": {b: bool(breakdown_tags(all_tags, b)) for b in BREAKDOWNS},
        "x": x,
        "stack": [{"tag": t, "label": n} for t, n in names.items()],
        "lines": lines,
        "loss": losses,
        "columns": aligned,
        "census_steps": census_steps.tolist(),
        "records": drawn,
    }


def tree_differs(series: Mapping[str, Series]) -> bool:
    """Whether the process tree's RSS is above the process's RSS by more than :data:`TREE_DIFFERS` at a
    step both were recorded (child processes hold memory), so that it is worth a line of its own."""
    tree, rss = series.get(TAGS["ram_tree_rss"].tag), series.get(TAGS["ram_rss"].tag)
    if tree is None or rss is None or not len(tree.steps) or not len(rss.steps):
        return False
    common, ti, ri = np.intersect1d(tree.steps, rss.steps, return_indices=True)
    if not len(common):
        return False
    t, r = tree.values[ti], rss.values[ri]
    return bool(np.any(t > r * (1 + TREE_DIFFERS)))


def record_at(series: Mapping[str, Series], step: int) -> dict[str, Any] | None:
    """The memory record at or before ``step``, with every reading (non-census tag) logged at its step, exact.

    A run that logs its loss every step and memory every 5 (the Quickstart's pattern) has steps with the
    loss alone: a click at step 24 gives the record of step 20 (``step``; ``clicked`` is 24), and
    ``losses_at_click`` the losses of step 24. Before the first memory record, the first one; a run
    without memory readings, the record nearest ``step``.
    """
    readings = {t: s for t, s in series.items() if t not in set(census_tags(series))}
    if not readings:
        return None
    # the steps of memory readings (a step with a step time or a loss alone is not a memory record)
    memory = [s.steps for t, s in readings.items() if t.startswith("Memory/") and len(s.steps)]
    memory = memory or [s.steps for t, s in readings.items() if not t.startswith("Loss/") and len(s.steps)]
    if memory:
        steps = np.unique(np.concatenate(memory))
        before = steps[steps <= step]
        at: int | None = int(before[-1]) if len(before) else int(steps[0])
    else:
        at = nearest(np.unique(np.concatenate([s.steps for s in readings.values()])), step)
    if at is None:
        return None
    out: dict[str, Any] = {"step": at, "clicked": step, "readings": _readings_at(readings, at)}
    if at != step:
        losses = _readings_at({t: s for t, s in readings.items() if t.startswith("Loss/")}, step)
        if losses:
            out["losses_at_click"] = {"step": step, "readings": losses}
    return out


def _readings_at(readings: Mapping[str, Series], at: int) -> list[dict[str, Any]]:
    rows = []
    for tag in sorted(readings):
        v = readings[tag].at(at)
        if v is not None:
            unit = tag_unit(tag)
            rows.append({"tag": tag, "value": v, "unit": unit,
                         "bytes": float(to_bytes(tag, v)) if unit in _UNIT_BYTES else None})
    return rows


def census_from_scalars(series: Mapping[str, Series], step: int) -> dict[str, Any]:
    """A census's tables from its scalars at ``step`` (MB as float32: bytes are approximate)."""
    out: dict[str, Any] = {"step": step, "source": "scalars", "approx": True}
    for b in BREAKDOWNS:
        table = {}
        for tag, name in breakdown_tags(series, b).items():
            v = series[tag].at(step)
            if v is not None:
                table[name] = float(to_bytes(tag, v))
        out[f"by_{b}"] = table
    unattributed = out["by_category"].pop("unattributed", None)
    out["unattributed_bytes"] = unattributed
    for key, name in (("census_total", "total_bytes"), ("large_total", "large_total_bytes"),
                      ("large_count", "large_count"), ("census_duration", "duration_ms")):
        tag = TAGS[key].tag
        v = series[tag].at(step) if tag in series else None
        out[name] = None if v is None else float(to_bytes(tag, v))
    return out
