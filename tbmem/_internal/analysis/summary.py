"""Per-run summary of a logdir: peaks, category mix at the census peak, step times, leaks.

Tags a run lacks (no VRAM tags on a CPU run, no census when it is off) are
None in :class:`RunSummary` and ``n/a`` in the table.

Example:
    >>> import tempfile
    >>> from tbmem import MemoryWriter
    >>> from tbmem.analysis import summarize
    >>> logdir = tempfile.mkdtemp()
    >>> with MemoryWriter(logdir, custom_layout=False) as w:
    ...     for step in (0, 10, 20):
    ...         w.write_scalars({"Memory/RAM/process_rss_GB": 1.0 + step / 100}, step)
    >>> s = summarize(logdir)[0]
    >>> s.peak_rss_gb, s.peak_rss_step, s.peak_allocated_gb
    (1.2000000476837158, 20, None)
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from tbmem._internal.analysis.leaks import LeakFinding, detect_leaks
from tbmem._internal.analysis.load import NoTbmemTagsError, load_scalars, run_loss_tags
from tbmem._internal.tags import TAGS, is_loss_tag

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = ["RunSummary", "summarize", "tag_series", "value_at", "MEMORY_PREFIX", "CATEGORY_PREFIX", "CATEGORIES"]

MEMORY_PREFIX = "Memory/"
CATEGORY_PREFIX = "Memory/Tensor_Category/"
#: Census categories in the census's priority order, then what the allocator has beyond them.
CATEGORIES = ("parameters", "gradients", "optimizer_state", "buffers", "activations", "other", "unattributed")
_CENSUS_TOTAL = "Memory/Tensor_Census/total_MB"


@dataclass(frozen=True, kw_only=True)
class RunSummary:
    """What one run used. Memory in the tags' units (GB for VRAM/RAM, MB for the census).

    Attributes:
        run: Run name (path relative to the logdir).
        first_step: First step with a memory record.
        last_step: Last step with a memory record.
        records: Number of distinct steps with a memory record.
        peak_allocated_gb: Highest ``vram_peak_allocated`` / ``vram_allocated``; None without CUDA.
        peak_allocated_step: Step of that peak.
        peak_reserved_gb: Highest ``vram_peak_reserved`` / ``vram_reserved``.
        peak_rss_gb: Highest ``process_peak_rss`` / ``process_rss``.
        peak_rss_step: Step of that peak.
        peak_tree_rss_gb: Highest ``process_tree_rss`` (the process and its DataLoader workers).
        max_tree_workers: Most processes below the training process at a record.
        max_fragmentation_percent: Highest ``fragmentation_percent``.
        census_peak_step: The census with the largest total (None without a census).
        census_peak_total_mb: That census's total.
        category_mb_at_peak: Category -> MB in that census.
        step_time_ms: ``mean``, ``median``, ``p95``, ``max`` of ``Perf/step_time_ms``.
        census_cost: ``censuses``, ``median_ms`` and ``percent`` (of the run's time between its
            first and last record, from the step times) of ``Perf/census_duration_ms``; None
            without a census.
        last_loss: Last value of each loss tag (``Loss/*``, ``train/loss``, ...: ``loss_tags`` in tbmem/_internal/tags.py).
        leaks: Flagged :class:`LeakFinding`\\ s, steepest first.
        hints: Advice with numbers (:class:`tbmem.analysis.Hint`); filled by
            ``tbmem report`` and :func:`tbmem.analysis.find_hints`, empty from :func:`summarize`.

    Example:
        >>> RunSummary(run="r", first_step=0, last_step=0, records=1).peak_rss_gb is None
        True
    """

    run: str
    first_step: int
    last_step: int
    records: int
    peak_allocated_gb: float | None = None
    peak_allocated_step: int | None = None
    peak_reserved_gb: float | None = None
    peak_rss_gb: float | None = None
    peak_rss_step: int | None = None
    peak_tree_rss_gb: float | None = None
    max_tree_workers: int | None = None
    max_fragmentation_percent: float | None = None
    census_peak_step: int | None = None
    census_peak_total_mb: float | None = None
    category_mb_at_peak: dict[str, float] = field(default_factory=dict)
    step_time_ms: dict[str, float] | None = None
    census_cost: dict[str, float] | None = None
    last_loss: dict[str, float] = field(default_factory=dict)
    leaks: list[LeakFinding] = field(default_factory=list)
    hints: list[Any] = field(default_factory=list)

    @property
    def has_leak(self) -> bool:
        """Whether any tag of this run was flagged."""
        return bool(self.leaks)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict."""
        out = {k: getattr(self, k) for k in self.__dataclass_fields__ if k not in ("leaks", "hints")}
        out["leaks"] = [f.to_dict() for f in self.leaks]
        out["hints"] = [h.to_dict() for h in self.hints]
        return out


def tag_series(df: "pd.DataFrame", tag: str) -> "pd.DataFrame | None":
    """One run's records of ``tag`` (a frame of :func:`tbmem.analysis.load_scalars`) by step, or None."""
    g = df[df["tag"] == tag]
    return None if g.empty else g.sort_values("step")


def value_at(df: "pd.DataFrame", tag: str, step: int) -> float | None:
    """The value of ``tag`` at ``step`` in one run's records, or None when it was not logged there."""
    g = df[(df["tag"] == tag) & (df["step"] == step)]
    return None if g.empty else float(g["value"].iloc[0])


def _peak(series_by_tag: dict[str, "pd.DataFrame"], tags: Iterable[str]) -> tuple[float | None, int | None]:
    best: tuple[float | None, int | None] = (None, None)
    for tag in tags:
        g = series_by_tag.get(tag)
        if g is None or g.empty:
            continue
        i = g["value"].to_numpy().argmax()
        value, step = float(g["value"].iloc[i]), int(g["step"].iloc[i])
        if best[0] is None or value > best[0]:
            best = (value, step)
    return best


def _census(series: dict[str, "pd.DataFrame"]) -> tuple[int | None, float | None, dict[str, float]]:
    cats = {t[len(CATEGORY_PREFIX):-3]: g for t, g in series.items()
            if t.startswith(CATEGORY_PREFIX) and t.endswith("_MB")}
    if not cats:
        return None, None, {}
    total = series.get(_CENSUS_TOTAL)
    if total is None:  # older logs: the total is the categories' sum (unattributed is on top)
        import pandas as pd

        frame = pd.concat([g.set_index("step")["value"] for c, g in cats.items() if c != "unattributed"],
                          axis=1).fillna(0.0)
        totals = frame.sum(axis=1)
        step, peak = int(totals.idxmax()), float(totals.max())
    else:
        i = total["value"].to_numpy().argmax()
        step, peak = int(total["step"].iloc[i]), float(total["value"].iloc[i])
    order = {c: i for i, c in enumerate(CATEGORIES)}
    mix = {}
    for cat in sorted(cats, key=lambda c: (order.get(c, len(order)), c)):
        at = cats[cat][cats[cat]["step"] == step]["value"]
        if not at.empty:
            mix[cat] = float(at.iloc[0])
    return step, peak, mix


def _census_cost(durations: "pd.DataFrame | None", step_times: "pd.DataFrame | None") -> dict[str, float] | None:
    """What the censuses cost this run: their median, and their share of its time (step time is the
    mean since the previous record, so it times the steps between records, censuses included)."""
    if durations is None or durations.empty:
        return None
    out = {"censuses": float(len(durations)), "median_ms": float(durations["value"].median())}
    if step_times is not None and len(step_times) > 0:
        st = step_times.sort_values("step")
        gaps = st["step"].diff().fillna(0).to_numpy()
        elapsed = float((st["value"].to_numpy() * gaps).sum())
        first, last = int(st["step"].iloc[0]), int(st["step"].iloc[-1])
        inside = durations[(durations["step"] > first) & (durations["step"] <= last)]["value"].sum()
        if elapsed > 0:
            out["percent"] = float(100 * inside / elapsed)
    return out


def _summarize_run(run: str, df: "pd.DataFrame", leaks: list[LeakFinding],
                   losses_of: Sequence[str] | None = None) -> RunSummary:
    series = {str(tag): g for tag, g in df.groupby("tag", sort=False)}
    memory_steps = df[df["tag"].str.startswith(MEMORY_PREFIX)]["step"]
    alloc, alloc_step = _peak(series, ("Memory/GPU/vram_peak_allocated_GB", "Memory/GPU/vram_allocated_GB"))
    reserved, _ = _peak(series, ("Memory/GPU/vram_peak_reserved_GB", "Memory/GPU/vram_reserved_GB"))
    rss, rss_step = _peak(series, ("Memory/RAM/process_peak_rss_GB", "Memory/RAM/process_rss_GB"))
    tree, _ = _peak(series, ("Memory/RAM/process_tree_rss_GB",))
    workers, _ = _peak(series, ("Memory/RAM/process_tree_workers",))
    frag, _ = _peak(series, ("Memory/fragmentation_percent",))
    census_step, census_total, mix = _census(series)
    st = series.get("Perf/step_time_ms")
    step_time = None
    if st is not None and not st.empty:
        v = st["value"]
        step_time = {"mean": float(v.mean()), "median": float(v.median()),
                     "p95": float(v.quantile(0.95)), "max": float(v.max())}
    losses = {t: float(g["value"].iloc[-1]) for t, g in sorted(series.items()) if is_loss_tag(t, losses_of)}
    census_cost = _census_cost(series.get(TAGS["census_duration"].tag), st)
    return RunSummary(
        run=run, first_step=int(memory_steps.min()), last_step=int(memory_steps.max()),
        records=int(memory_steps.nunique()), peak_allocated_gb=alloc, peak_allocated_step=alloc_step,
        peak_reserved_gb=reserved, peak_rss_gb=rss, peak_rss_step=rss_step, peak_tree_rss_gb=tree,
        max_tree_workers=None if workers is None else int(workers), max_fragmentation_percent=frag,
        census_peak_step=census_step, census_peak_total_mb=census_total, category_mb_at_peak=mix,
        step_time_ms=step_time, census_cost=census_cost, last_loss=losses, leaks=[f for f in leaks if f.run == run and f.flagged],
    )


def summarize(data: "pd.DataFrame | str | os.PathLike[str]", *, runs: Iterable[str] | None = None,
              on_error: str = "raise", loss_tags: Mapping[str, Sequence[str]] | None = None,
              **leak_options: Any) -> list[RunSummary]:
    """Summarize every run with tbmem memory tags.

    Args:
        data: A logdir, or a DataFrame from :func:`tbmem.analysis.load_scalars`.
        runs: Only these runs, in this order.
        on_error: Passed to :func:`load_scalars` when ``data`` is a logdir.
        loss_tags: Run -> the patterns of its loss tags (:func:`tbmem.analysis.run_loss_tags`); None: read
            from the runs' settings when ``data`` is a logdir, else the built-in ones (``loss_tags`` in tbmem/_internal/tags.py).
        **leak_options: Passed to :func:`tbmem.analysis.detect_leaks`
            (``threshold_mb_per_1k=...``, ``skip_fraction=...``).

    Returns:
        One :class:`RunSummary` per run that has ``Memory/*`` tags, sorted by run name
        (or in the order of ``runs``).

    Raises:
        NoTbmemTagsError: no run has a ``Memory/*`` tag.
    """
    if isinstance(data, (str, os.PathLike)):
        where = f" under {os.fspath(data)!r}"
        logdir, data = data, load_scalars(data, runs=runs, on_error=on_error)
        if loss_tags is None:
            loss_tags = run_loss_tags(logdir, sorted(data["run"].unique()))
    else:
        where = ""
    memory_runs = sorted(data.loc[data["tag"].str.startswith(MEMORY_PREFIX), "run"].unique())
    if runs is not None:
        wanted = list(runs)
        memory_runs = [r for r in wanted if r in set(memory_runs)]
        if missing := [r for r in wanted if r not in memory_runs]:
            raise NoTbmemTagsError(f"run {missing[0]!r} has no tbmem memory tags (Memory/*){where}")
    if not memory_runs:
        seen = sorted(data["tag"].unique())[:5]
        raise NoTbmemTagsError(
            f"no tbmem memory tags (Memory/*) in the event files{where}; tags found: "
            f"{', '.join(seen) if seen else 'none'}. Log with tbmem.MemoryWriter.log_memory(step).")
    data = data[data["run"].isin(memory_runs)]
    leaks = detect_leaks(data, **leak_options)
    groups = {str(r): g for r, g in data.groupby("run", sort=False)}
    return [_summarize_run(run, groups[run], leaks, (loss_tags or {}).get(run)) for run in memory_runs]
