"""Rank folders: the runs of one multi-rank job, one row per rank, and how unequal the ranks are.

A run whose last path component is ``rank<r>`` (what :class:`tbmem.MemoryWriter` writes under
torch.distributed) belongs to the job named by the rest of its path (``"."`` when the rank
folders sit directly in the logdir). For each job and metric (peak RSS, peak process tree
RSS, peak VRAM allocated and reserved, mean step time) :func:`rank_jobs` gives every rank's
value, the max and the rank holding it, the min and its rank, the mean and the spread
``(max - min) / mean``.

Example:
    >>> from tbmem._internal.analysis.summary import RunSummary
    >>> from tbmem._internal.analysis.ranks import rank_jobs
    >>> runs = [RunSummary(run=f"exp/rank{r}", first_step=0, last_step=9, records=10, peak_rss_gb=gb)
    ...         for r, gb in enumerate([2.0, 3.0, 1.0])]
    >>> (job,) = rank_jobs(runs)
    >>> job.job, job.ranks
    ('exp', [0, 1, 2])
    >>> rss = job.metric("peak_rss_gb")
    >>> rss.max, rss.max_rank, rss.min_rank, rss.mean, rss.spread_percent
    (3.0, 1, 2, 2.0, 100.0)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

from tbmem._internal.analysis.axes import fit_unit, legend_outside
from tbmem._internal.analysis.summary import RunSummary
from tbmem._internal.analysis.table import format_value
from tbmem._internal.logdir.layout import split_rank

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd
    from matplotlib.axes import Axes

__all__ = ["RankMetric", "RankJob", "rank_jobs", "split_rank_run", "METRICS", "job_name", "format_rank_jobs",
           "plot_rank_job"]

#: (RunSummary attribute, label, kind) of the metrics compared across ranks: the labels and the units of
#: ``tbmem report``'s table of runs (``kind`` as :func:`tbmem._internal.analysis.table.format_value` takes it), so a
#: rank's ``374 MiB`` reads as a run's does.
METRICS: tuple[tuple[str, str, str], ...] = (
    ("peak_rss_gb", "peak RAM RSS", "gb"),
    ("peak_tree_rss_gb", "peak process tree RSS", "gb"),
    ("peak_allocated_gb", "peak VRAM allocated", "gb"),
    ("peak_reserved_gb", "peak VRAM reserved", "gb"),
    ("step_time_mean_ms", "step time mean", "ms"),
)
#: Above this many ranks the per-rank table shows the extremes only (unless asked for all).
MAX_ROWS = 20


def split_rank_run(run: str) -> tuple[str, int] | None:
    """``"exp/a/rank3"`` -> ``("exp/a", 3)``; ``"rank0"`` -> ``(".", 0)``; None for other runs
    (:func:`tbmem._internal.logdir.layout.split_rank`)."""
    job, rank = split_rank(run)
    return None if rank is None else (job, rank)


def _value(summary: RunSummary, attr: str) -> float | None:
    if attr == "step_time_mean_ms":
        return (summary.step_time_ms or {}).get("mean")
    value = getattr(summary, attr)
    return None if value is None else float(value)


@dataclass(frozen=True, kw_only=True)
class RankMetric:
    """One metric across the ranks of a job.

    Attributes:
        name: The RunSummary attribute (``peak_rss_gb``, ..., ``step_time_mean_ms``): the values' unit
            is its suffix (GB: 2**30 bytes, as the tags').
        label: Its row label (the one of ``tbmem report``'s table of runs).
        values: Rank -> value (ranks without the metric are absent).
        max: The largest value. max_rank: The rank holding it (the lowest on a tie).
        min: The smallest value. min_rank: Its rank.
        mean: The mean over the ranks that have it.
        spread_percent: ``(max - min) / mean * 100`` (None when the mean is 0).
    """

    name: str
    label: str
    values: dict[int, float]
    max: float
    max_rank: int
    min: float
    min_rank: int
    mean: float
    spread_percent: float | None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (ranks as string keys, as JSON needs)."""
        out = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "values"}
        out["values"] = {str(r): v for r, v in sorted(self.values.items())}
        return out


@dataclass(frozen=True, kw_only=True)
class RankJob:
    """The rank folders of one job.

    Attributes:
        job: The job's path relative to the logdir (``"."``: the logdir itself).
        ranks: Ranks found, sorted.
        runs: Rank -> run name.
        missing: Ranks below the highest one found that have no folder (or no memory tags).
        metrics: One :class:`RankMetric` per metric some rank has.
    """

    job: str
    ranks: list[int]
    runs: dict[int, str]
    missing: list[int]
    metrics: list[RankMetric] = field(default_factory=list)

    def metric(self, name: str) -> RankMetric | None:
        """The metric called ``name``, or None when no rank has it."""
        return next((m for m in self.metrics if m.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict."""
        return {"job": self.job, "ranks": self.ranks, "runs": {str(r): n for r, n in self.runs.items()},
                "missing": self.missing, "imbalance": [m.to_dict() for m in self.metrics]}


def _metric(attr: str, label: str, values: dict[int, float]) -> RankMetric:
    ranks = sorted(values)
    top = max(ranks, key=lambda r: (values[r], -r))
    low = min(ranks, key=lambda r: (values[r], r))
    mean = sum(values.values()) / len(values)
    spread = (values[top] - values[low]) / mean * 100.0 if mean else None
    return RankMetric(name=attr, label=label, values=dict(values), max=values[top], max_rank=top,
                      min=values[low], min_rank=low, mean=mean, spread_percent=spread)


def rank_jobs(summaries: Sequence[RunSummary]) -> list[RankJob]:
    """Group the rank runs among ``summaries`` by job; other runs are ignored. Sorted by job."""
    by_job: dict[str, dict[int, RunSummary]] = {}
    for s in summaries:
        found = split_rank_run(s.run)
        if found is not None:
            by_job.setdefault(found[0], {})[found[1]] = s
    jobs = []
    for job in sorted(by_job):
        members = by_job[job]
        ranks = sorted(members)
        metrics = []
        for attr, label, _ in METRICS:
            values = {r: v for r in ranks if (v := _value(members[r], attr)) is not None}
            if values:
                metrics.append(_metric(attr, label, values))
        jobs.append(RankJob(job=job, ranks=ranks, runs={r: members[r].run for r in ranks},
                            missing=[r for r in range(ranks[-1] + 1) if r not in members], metrics=metrics))
    return jobs


def _shown_ranks(job: RankJob, all_ranks: bool) -> tuple[list[int], int]:
    """The ranks in the per-rank table and how many are left out (the extremes of the first metric)."""
    if all_ranks or len(job.ranks) <= MAX_ROWS or not job.metrics:
        return job.ranks, 0
    key = job.metrics[0].values
    order = sorted(key, key=lambda r: (-key[r], r))
    keep = sorted(set(order[:5]) | set(order[-5:]))
    return keep, len(job.ranks) - len(keep)


def job_name(job: RankJob, root: str = "") -> str:
    """The job's name where it is shown: its path, or for rank folders right in the logdir (``"."``)
    the logdir's folder name ``root`` and that it is the logdir ("job ." read as a typo).

    Example:
        >>> job_name(RankJob(job=".", ranks=[0], runs={0: "rank0"}, missing=[]), "runs")
        'runs (the logdir itself)'
    """
    return f"{root} (the logdir itself)" if job.job == "." and root else job.job


def format_rank_jobs(jobs: Sequence[RankJob], summaries: Sequence[RunSummary], *, all_ranks: bool = False,
                     root: str = "") -> str:
    """Per job: one row per rank, then the imbalance (max and its rank, min and its rank, mean, spread), in
    the units of the table of runs (``format_value`` in tbmem/_internal/analysis/table.py).

    ``root`` names the job of rank folders right in the logdir (``job.job == "."``): its folder's name.
    """
    by_run = {s.run: s for s in summaries}
    blocks = []
    for job in jobs:
        title = f"job {job_name(job, root)}: {len(job.ranks)} ranks"
        if job.missing:
            title += f" (no memory tags from rank(s) {', '.join(map(str, job.missing[:10]))}" \
                     f"{' ...' if len(job.missing) > 10 else ''})"
        shown, left_out = _shown_ranks(job, all_ranks)
        cols = [(attr, label, kind) for attr, label, kind in METRICS if job.metric(attr) is not None]
        header = ["rank", "records"] + [label for _, label, _ in cols] + ["leaks"]
        rows = []
        for r in shown:
            s = by_run[job.runs[r]]
            cells = [str(r), str(s.records)]
            for attr, _, kind in cols:
                cells.append(format_value(_value(s, attr), kind))
            cells.append(str(len(s.leaks)) if s.leaks else "none")
            rows.append(cells)
        lines = [title, _render(header, rows)]
        if left_out:
            lines.append(f"... {left_out} ranks between the 5 highest and 5 lowest {cols[0][1]} left out "
                         "(--all-ranks shows every rank)")
        imb_rows = []
        for m in job.metrics:
            kind = next(k for a, _, k in METRICS if a == m.name)
            spread = "n/a" if m.spread_percent is None else f"{m.spread_percent:.1f}%"
            imb_rows.append([m.label, f"{format_value(m.max, kind)} (rank {m.max_rank})",
                             f"{format_value(m.min, kind)} (rank {m.min_rank})", format_value(m.mean, kind), spread])
        if imb_rows:
            lines += ["", "imbalance across ranks", _render(["metric", "max", "min", "mean", "spread"], imb_rows)]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def _render(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    out = []
    for r in [header, ["-" * w for w in widths]] + rows:
        out.append("  ".join([r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:])]).rstrip())
    return "\n".join(out)


#: Tags drawn per job as a band over the ranks (label, tag).
BAND_TAGS = (("VRAM allocated", "Memory/GPU/vram_allocated_GB"), ("RAM RSS", "Memory/RAM/process_rss_GB"),
             ("process tree RSS", "Memory/RAM/process_tree_rss_GB"))


def plot_rank_job(df: "pd.DataFrame", job: RankJob, *, ax: "Axes", root: str = "") -> "Axes":
    """One panel for a job: per step, the min..max band over its ranks and the mean line, per tag;
    the rank holding the highest point is named in the legend. The axis is in the binary unit that fits
    its highest value, as a run's panel is (:func:`tbmem.analysis.fit_unit`); ``root`` as in
    :func:`job_name`."""
    sel = df[df["run"].isin(set(job.runs.values())) & df["tag"].isin([t for _, t in BAND_TAGS])]
    rank_of = {run: r for r, run in job.runs.items()}
    unit, factor = fit_unit(float(sel["value"].max()) if len(sel) else 0.0, "GB")
    for label, tag in BAND_TAGS:
        g = sel[sel["tag"] == tag]
        if g.empty:
            continue
        by_step = g.pivot_table(index="step", columns="run", values="value", aggfunc="last").sort_index() * factor
        by_step = by_step[sorted(by_step.columns, key=rank_of.__getitem__)]  # a tie names the lowest rank
        peak_run = by_step.max().idxmax()
        line = ax.plot(by_step.index, by_step.mean(axis=1), linewidth=1.5,
                       label=f"{label} (mean; max on rank {rank_of[peak_run]})")[0]
        ax.fill_between(by_step.index, by_step.min(axis=1), by_step.max(axis=1), color=line.get_color(),
                        alpha=0.25, step=None)
    ax.set_ylim(bottom=0)
    legend_outside(ax)
    ax.set_title(f"job {job_name(job, root)}: {len(job.ranks)} ranks (band: min..max over the ranks)")
    ax.set_xlabel("step")
    ax.set_ylabel(f"per rank ({unit})")
    return ax
